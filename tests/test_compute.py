"""Where a tier computes: the CPU, or a CUDA GPU (``--torch-device``).

On a machine without CUDA (CI) the GPU tests skip and the refusals are tested;
with one, the tiers train on it: the same numbers as on the CPU within float
tolerance, the same numbers twice over (dropout is seeded on the GPU too), and
only CPU tensors cross a tier's boundary.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splitfed.data import synthetic
from splitfed.engine import compute
from splitfed.engine.rounds import (
    Batches,
    RoundConfig,
    initial_state,
    inprocess_chain,
    run_round,
    tier_loads,
    train_client,
)
from splitfed.engine.types import OptimConfig
from splitfed.errors import ConfigError
from splitfed.models.zoo import resolve_spec

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU on this machine")


@pytest.mark.parametrize("text, words", [
    ("gpu", r"--torch-device 'gpu': not a device torch knows; use cpu, cuda or cuda:N"),
    ("cuda:x", r"not a device torch knows"),
    ("", r"not a device torch knows"),
    ("meta", r"splitfed computes on cpu, cuda or cuda:N, not meta"),
    ("cpu:1", r"the CPU has no index"),
    ("cuda:99", r"(no CUDA GPU that torch can use|this machine has \d+ CUDA GPU\(s\): cuda:0)"),
])
def test_a_device_a_tier_cannot_compute_on_is_refused_in_one_line(text, words):
    with pytest.raises(ConfigError, match=words):
        compute.torch_device(text)


def test_cpu_is_the_cpu():
    assert compute.torch_device("cpu") == compute.torch_device(" cpu ") == compute.torch_device("cpu:0") \
        == torch.device("cpu")
    assert compute.describe(torch.device("cpu")) == "cpu"


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA GPU")
def test_without_cuda_a_cuda_tier_is_refused_before_it_serves():
    """One line, exit 2, before it listens: not a traceback at the first client's load."""
    p = subprocess.run([sys.executable, "-m", "splitfed.cli", "tier", "--listen", "127.0.0.1:0", "--insecure",
                        "--torch-device", "cuda"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        "splitfed tier: error: --torch-device cuda: this machine has no CUDA GPU that torch can use (torch "
        f"{torch.__version__}, a CPU-only build); use cpu"]
    assert "listening" not in p.stdout


# ---------------------------------------------------------------- on a GPU

SPEC = resolve_spec("mlp")  # dropout in block 2
ASSIGN = {"client0": (1, 2), "client1": (0, 2), "client2": (1, 3)}  # block 2 on a server tier for some


def _batches(seed: int, steps: int = 3, batch: int = 16) -> Batches:
    x, y = synthetic(SPEC, steps * batch, seed).tensors
    return [(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]) for s in range(steps)]


def _round(where: str, mode: str, assign: dict[str, tuple[int, ...]], u_shape: bool = False) -> dict[str, torch.Tensor]:
    data = {c: _batches(i) for i, c in enumerate(assign)}
    cfg = RoundConfig("r", 1, SPEC, mode, u_shape=u_shape, optim=OptimConfig(lr=0.05, momentum=0.9), seed=3)
    state, _ = run_round(cfg, inprocess_chain(2, torch_device=where), initial_state(SPEC, 0), assign, data)
    return state


@needs_cuda
@pytest.mark.parametrize("mode", ["sflv1", "sflv2", "sl"])
def test_tiers_on_the_gpu_train_what_tiers_on_the_cpu_do(mode):
    """Dropout stays on the device here (cuts 3,4): the GPU's generator draws other masks than the CPU's."""
    assign = {c: (3, 4) for c in ASSIGN}
    cpu = _round("cpu", mode, assign)
    gpu = _round("cuda", mode, assign)
    assert cpu.keys() == gpu.keys() and all(v.device.type == "cpu" for v in gpu.values())
    for k in cpu:
        torch.testing.assert_close(gpu[k], cpu[k], rtol=1e-4, atol=1e-5, msg=k)


@needs_cuda
@pytest.mark.parametrize("mode, u_shape", [("sflv1", False), ("sflv2", False), ("sflv1", True)])
def test_dropout_on_a_gpu_tier_draws_the_same_masks_every_time(mode, u_shape):
    assign = {c: (*k, 4) if u_shape else k for c, k in ASSIGN.items()}
    gpu, again = _round("cuda", mode, assign, u_shape), _round("cuda", mode, assign, u_shape)
    assert all(torch.equal(gpu[k], again[k]) for k in gpu)
    assert not all(torch.equal(gpu[k], v) for k, v in _round("cpu", mode, assign, u_shape).items())  # it trained


@needs_cuda
def test_a_tier_process_on_the_gpu_says_so_and_serves_a_round(tmp_path):
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.process import TierProcess

    with TierProcess.start("cloud", insecure=True, extra_args=["--torch-device", "cuda:0"]) as cloud, \
            TierProcess.start("edge", next_address=cloud.address, insecure=True,
                              extra_args=["--torch-device", "cuda"]) as edge:
        name = torch.cuda.get_device_name(0)
        assert f"(computing on cuda:0 ({name}))" in edge.output()
        p = subprocess.run([sys.executable, "-m", "splitfed.cli", "ping", edge.address, cloud.address, "--count",
                            "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout.count(f"computes on cuda:0 ({name})") == 2, p.stdout + p.stderr
        controls = [GrpcTierClient(a, insecure=True) for a in (edge.address, cloud.address)]
        try:
            from splitfed.engine.device import Device

            cfg = RoundConfig("r", 1, SPEC, "sflv1", optim=OptimConfig(lr=0.05))
            state = initial_state(SPEC, 0)
            for tier, load in zip(controls, tier_loads(cfg, "c0", (1, 2), state), strict=True):
                tier.load(load)
            dev = Device(SPEC, controls[0], run_id="r", client_id="c0", round=1, cuts=(1, 2), state=state,
                         optim=cfg.optim)
            x, y = _batches(0, steps=1)[0]
            losses = [dev.train_step(x, y)[0] for _ in range(5)]
            assert losses[-1] < losses[0]
            fetched = controls[1].fetch("r", "c0")
            assert fetched and all(v.device.type == "cpu" for v in fetched.values())
        finally:
            for c in controls:
                c.close()


@needs_cuda
def test_a_gpu_the_machine_lacks_is_refused_naming_those_it_has():
    n = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=rf"this machine has {n} CUDA GPU\(s\): cuda:0"):
        compute.torch_device(f"cuda:{n}")
    assert compute.torch_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    assert compute.describe(torch.device("cuda", 0)).startswith("cuda:0 (")


# ---------------------------------------------------------------- the run setting (simulate, flwr run)


def test_the_run_setting_is_checked_for_form_where_it_is_read_and_for_the_machine_where_tiers_start():
    from splitfed.flower.config import RunSettings

    with pytest.raises(ConfigError, match="tier-torch-device 'gpu': not a device torch knows"):
        RunSettings(tier_torch_device="gpu")
    with pytest.raises(ConfigError, match="the tiers at tier-addresses run already: start them with splitfed tier "
                                          "--torch-device cuda:1"):
        RunSettings(tier_torch_device="cuda:1", tier_addresses="a:1,b:2")
    # a checkpoint's settings, read on a machine without the GPU it ran on, are still settings
    assert RunSettings(tier_torch_device="cuda:1").tier_torch_device == "cuda:1"


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA GPU")
def test_simulate_on_tiers_this_machine_cannot_compute_on_is_refused_before_anything_starts(tmp_path):
    p = subprocess.run([sys.executable, "-m", "splitfed.cli", "simulate", "--clients", "2", "--rounds", "1",
                        "--tier-torch-device", "cuda", "--out", str(tmp_path / "run")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "splitfed simulate: error: command line: tier-torch-device cuda: this machine has no CUDA GPU that torch can use "
        f"(torch {torch.__version__}, a CPU-only build); use cpu"], p.stderr
    assert not (tmp_path / "run").exists() and "Ray" not in p.stdout


def test_the_tiers_a_run_starts_are_told_where_to_compute():
    import psutil

    from splitfed.flower.config import RunSettings
    from splitfed.sim.tiers import tier_chain

    where = "cuda" if CUDA else "cpu"
    with tier_chain(RunSettings(tier_torch_device=where)) as chain:
        assert len(chain.pids) == 2
        for pid in chain.pids:
            args = psutil.Process(pid).cmdline()
            assert args[args.index("--torch-device") + 1] == where
        assert {i.compute.split()[0] for i in chain.infos} == {"cuda:0" if CUDA else "cpu"}


# ---------------------------------------------------------------- a device (a Jetson's GPU)


def test_a_node_names_where_its_device_computes_and_is_refused_a_gpu_it_lacks():
    from splitfed.flower.node import NodeConfig

    base = {"partition-id": 0, "num-partitions": 1}
    assert NodeConfig.parse(base).torch_device == "cpu"
    with pytest.raises(ConfigError, match="node config: torch-device 'gpu': not a device torch knows"):
        NodeConfig.parse({**base, "torch-device": "gpu"})
    if not CUDA:
        with pytest.raises(ConfigError, match="node config: torch-device cuda: this machine has no CUDA GPU"):
            NodeConfig.parse({**base, "torch-device": "cuda"})


def _device_round(where: str, u_shape: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One client, its device on ``where``, the tiers on the CPU; dropout (block 2) on the edge."""
    cuts = (1, 3, 4) if u_shape else (1, 3)
    cfg = RoundConfig("r", 1, SPEC, "sflv1", u_shape=u_shape, optim=OptimConfig(lr=0.05, momentum=0.9), seed=3)
    chain = inprocess_chain(2)
    state = initial_state(SPEC, 0)
    for tier, load in zip(chain.tiers, tier_loads(cfg, "c0", cuts, state), strict=True):
        tier.load(load)
    dev, res = train_client(cfg, chain, "c0", cuts, state, _batches(0, steps=4), torch_device=where)
    return dev.state(), [res.loss]


@needs_cuda
@pytest.mark.parametrize("u_shape", [False, True], ids=["plain", "u-shape"])
def test_a_device_on_the_gpu_trains_what_a_device_on_the_cpu_does(u_shape):
    cpu, cpu_loss = _device_round("cpu", u_shape)
    gpu, gpu_loss = _device_round("cuda", u_shape)
    assert cpu.keys() == gpu.keys() and all(v.device.type == "cpu" for v in gpu.values())
    for k in cpu:
        torch.testing.assert_close(gpu[k], cpu[k], rtol=1e-4, atol=1e-5, msg=k)
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4)


# ---------------------------------------------------------------- profiling on a GPU


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA GPU")
def test_profiling_on_a_gpu_the_machine_lacks_is_one_line(capsys):
    """``splitfed.cli.main`` in this process (its words and code; a process cost ~2 s of imports): the same
    refusal of tier and of simulate runs as a process above; profile runs as a process in test_profile_digest."""
    from splitfed.cli import main as cli

    capsys.readouterr()
    code = cli(["profile", "--model", "mlp", "--no-cache", "--torch-device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("splitfed profile: error: --torch-device cuda: this machine "
                                        "has no CUDA GPU"), err


@needs_cuda
def test_a_profile_measured_on_the_gpu_counts_what_the_cpu_does_and_says_where_it_ran():
    from splitfed.profile.profiler import profile_model

    spec = resolve_spec("cnn")
    cpu = profile_model(spec, 16, reps=1)
    gpu = profile_model(spec, 16, reps=1, torch_device="cuda")
    assert gpu is not cpu and f"({compute.describe(torch.device('cuda', 0))})" in gpu.host
    assert (gpu.fwd_flops, gpu.bwd_flops, gpu.param_bytes, gpu.out_bytes) == \
        (cpu.fwd_flops, cpu.bwd_flops, cpu.param_bytes, cpu.out_bytes)
    assert len(gpu.fwd_s) == gpu.n_blocks and all(t > 0 for t in gpu.fwd_s + gpu.bwd_s)
    assert gpu.host_flops() is not None
