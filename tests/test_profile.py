"""Block profiler, named device profiles and fleet files."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.models import build, resolve_spec, to_blocks
from splitfed.profile import (
    PROFILES,
    ModelProfile,
    load_fleet,
    mbps,
    parse_fleet,
    profile_model,
    shipped_fleets,
)
from splitfed.profile import profiler as profiler_mod
from splitfed.units import MIB

torch.set_num_threads(1)


# ---------------------------------------------------------------- profiler


def test_cnn_profile_matches_the_model() -> None:
    spec = resolve_spec("cnn")
    prof = profile_model(spec, batch=4, reps=1)
    model = build(spec, 0)
    blocks = to_blocks(model)
    assert prof.n_blocks == len(blocks)
    assert prof.input_bytes == 1 * 8 * 8 * 4
    # block 0: Conv2d(1->16) at 8x8: output 16x8x8 fp32 per sample; params 16*9 + 16
    assert prof.out_bytes[0] == 16 * 8 * 8 * 4
    assert prof.param_bytes[0] == (16 * 9 + 16) * 4
    assert sum(prof.param_bytes) == sum(p.numel() * 4 for p in model.parameters())
    assert prof.fixed_bytes[0] == prof.param_bytes[0] * 3  # params + grads + momentum
    assert prof.fwd_flops[1] == 0 and prof.fwd_flops[0] > 0  # a max-pool has no matmul FLOPs
    assert prof.bwd_flops[2] == pytest.approx(2 * prof.fwd_flops[2])  # grad input + grad weight
    assert prof.bwd_flops[0] == pytest.approx(prof.fwd_flops[0])  # the input needs no gradient
    assert all(a > 0 for a in prof.act_bytes[:4])
    assert len(prof.fwd_s) == prof.n_blocks and all(t > 0 for t in prof.fwd_s)


def test_block_flops_add_up_to_the_whole_model() -> None:
    spec = resolve_spec("cnn")
    prof = profile_model(spec, batch=4, reps=1)
    with FlopCounterMode(display=False) as fc:
        build(spec, 0)(spec.example_input(4))
    assert sum(prof.fwd_flops) * 4 == pytest.approx(fc.get_total_flops())


def test_traced_model_with_token_input() -> None:
    prof = profile_model(resolve_spec("transformer"), batch=2, reps=1)
    assert prof.input_bytes == 64 * 8  # int64 token ids
    assert sum(prof.fwd_flops) > 0 and prof.n_blocks == len(prof.out_bytes)


def test_profile_is_cached_in_memory_and_on_disk(tmp_path, monkeypatch) -> None:
    spec = resolve_spec("mlp")
    first = profile_model(spec, batch=3, reps=1, cache_dir=tmp_path)
    assert list(tmp_path.glob("mlp-*.json"))

    def boom(*a, **k):  # noqa: ANN002, ANN003
        raise AssertionError("profiled again")

    monkeypatch.setattr(profiler_mod, "_measure", boom)
    assert profile_model(spec, batch=3, reps=1, cache_dir=tmp_path) is first
    profiler_mod.clear_cache()
    again = profile_model(spec, batch=3, reps=1, cache_dir=tmp_path)
    assert again == first
    with pytest.raises(AssertionError):
        profile_model(spec, batch=5)  # another batch is another profile


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The reps of every measurement made from now on (the real one is run); the memory cache emptied."""
    profiler_mod.clear_cache()
    made: list[int] = []
    real = profiler_mod._measure

    def measure(spec, batch, slots, reps, *a):  # noqa: ANN001, ANN002, ANN202
        made.append(reps)
        return real(spec, batch, slots, reps, *a)

    monkeypatch.setattr(profiler_mod, "_measure", measure)
    return made


def test_a_profile_cached_with_fewer_reps_is_measured_again(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    # before: reps were not in the key and a hit returned whatever was stored (1-rep timings for --reps 500)
    spec = resolve_spec("mlp")
    made = _counting(monkeypatch)
    one = profile_model(spec, batch=3, reps=1, cache_dir=tmp_path)
    four = profile_model(spec, batch=3, reps=4, cache_dir=tmp_path)
    assert made == [1, 4] and (one.reps, four.reps) == (1, 4)
    (entry,) = tmp_path.glob("mlp-*.json")
    assert json.loads(entry.read_text())["reps"] == 4  # the better profile replaced the other
    profiler_mod.clear_cache()
    assert profile_model(spec, batch=3, reps=2, cache_dir=tmp_path) == four  # more reps than asked: a hit
    assert profile_model(spec, batch=3, reps=4, cache_dir=tmp_path) == four
    assert made == [1, 4]


def test_no_cache_neither_reads_nor_writes_a_cache(tmp_path, monkeypatch, capsys) -> None:  # noqa: ANN001
    # before: --no-cache passed cache_dir=None, which fell through to SPLITFED_PROFILE_CACHE
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path))
    made = _counting(monkeypatch)
    argv = ["profile", "--model", "mlp", "--batch", "2", "--reps", "1", "--json"]
    assert main([*argv, "--no-cache"]) == 0
    assert not list(tmp_path.iterdir())  # nothing written
    assert main(argv) == 0
    (entry,) = tmp_path.glob("mlp-*.json")
    doctored = {**json.loads(entry.read_text()), "reps": 99, "fwd_s": [123.0] * 3}
    entry.write_text(json.dumps(doctored))
    profiler_mod.clear_cache()
    capsys.readouterr()
    assert main([*argv, "--no-cache"]) == 0
    assert json.loads(capsys.readouterr().out)["fwd_s"] != [123.0] * 3  # the cached entry was not read
    assert json.loads(entry.read_text()) == doctored  # nor rewritten
    assert made == [1, 1, 1]
    spec = resolve_spec("mlp")
    kept = profile_model(spec, batch=2, reps=1)
    assert profile_model(spec, batch=2, reps=1, use_cache=False) is not kept  # nor the one in memory


def test_profile_after_optimize_measures_its_own_reps(tmp_path, monkeypatch, capsys) -> None:  # noqa: ANN001
    # before: optimize kept a 1-rep profile and `splitfed profile` (3 reps) printed its timings
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path))
    assert main(["optimize", "--model", "mlp", "--fleet", "small", "--json"]) == 0
    made = _counting(monkeypatch)
    capsys.readouterr()
    assert main(["profile", "--model", "mlp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reps"] == 3
    assert made == [3]
    assert main(["profile", "--model", "mlp", "--reps", "5"]) == 0
    assert "median of 5 run(s)" in capsys.readouterr().out
    assert made == [3, 5]


@settings(max_examples=40)
@given(asks=st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=8))
def test_the_cache_returns_at_least_the_reps_asked_and_measures_only_for_more(asks: list[tuple[int, bool]]) -> None:
    """Any sequence of requests (some after the in-memory cache is dropped, as in a new process): each
    answer was timed with at least the reps asked; a measurement happens exactly when more are asked for
    than any cached profile has."""
    spec = resolve_spec("mlp")
    made: list[int] = []

    def measure(spec, batch, slots, reps, *a):  # noqa: ANN001, ANN002, ANN202
        made.append(reps)
        return dataclasses.replace(ModelProfile.synthetic([1.0], [1.0], [1.0], input_bytes=1.0), reps=reps)

    profiler_mod.clear_cache()
    with tempfile.TemporaryDirectory() as d, mock.patch.object(profiler_mod, "_measure", measure):
        best, expected = 0, []
        for reps, new_process in asks:
            if new_process:
                profiler_mod.clear_cache()
            got = profile_model(spec, batch=2, reps=reps, cache_dir=d)
            if reps > best:
                best = reps
                expected.append(reps)
            assert got.reps == best >= reps
            assert made == expected
    profiler_mod.clear_cache()


def test_profile_json_round_trip() -> None:
    prof = profile_model(resolve_spec("cnn"), batch=4, reps=1)
    back = ModelProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back == prof


def test_profile_rejects_inconsistent_lists() -> None:
    with pytest.raises(ConfigError, match="out_bytes has 1 entries for 2 blocks"):
        ModelProfile("m", 1, ("a", "b"), 4, (1, 1), (1, 1), (1, 1), (1,), (1, 1), (1, 1))


def test_profile_command_json(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path))
    assert main(["profile", "--model", "cnn", "--batch", "4", "--reps", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"] == "cnn" and len(d["fwd_flops"]) == 7 and d["batch"] == 4
    assert main(["profile", "--model", "cnn", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "fwd MFLOP" in out and "Conv2d" in out


# ---------------------------------------------------------------- named profiles and fleets


def test_every_named_profile_says_where_its_numbers_come_from() -> None:
    assert {"rpi4", "jetson-nano-cpu", "jetson-nano-gpu", "phone-mid", "phone-flagship", "laptop",
            "edge-server", "cloud-gpu"} <= set(PROFILES)
    for name, p in PROFILES.items():
        assert p.source, name
        assert p.flops > 0 and p.memory_mb > 0


def test_reference_fleet_is_large_and_heterogeneous() -> None:
    assert {"reference", "small"} <= set(shipped_fleets())
    f = load_fleet("reference")
    assert len(f.clients) >= 50
    assert len(f.kinds) >= 5 and sum(f.kinds.values()) == len(f.clients)
    assert len({c.device.flops for c in f.clients}) >= 4
    assert len({c.link.up for c in f.clients}) >= 4
    assert f.cloud is not None and f.edge_link is not None
    field = f.client("pi-field-0")
    assert field.device.flops == PROFILES["rpi4"].flops and field.link.up == mbps(2)  # override beats profile
    assert field.samples == 600


def test_counts_profiles_and_defaults() -> None:
    f = parse_fleet("""
samples = 123
[edge]
flops = 1e12
memory_mb = 1024
[[device]]
name = "a"
profile = "phone-mid"
count = 3
memory_mb = 512
[[device]]
name = "b"
flops = 2e9
memory_mb = 100
up_mbps = 8
down_mbps = 16
rtt_ms = 0
samples = 7
""", "x.toml")
    assert [c.name for c in f.clients] == ["a-0", "a-1", "a-2", "b"]
    a = f.client("a-1")
    assert a.samples == 123 and a.device.memory == 512 * MIB and a.device.flops == PROFILES["phone-mid"].flops
    assert a.link.rtt == pytest.approx(0.05)
    b = f.client("b")
    assert b.samples == 7 and b.link.up == 1e6 and b.link.down == 2e6 and b.link.rtt == 0
    assert f.cloud is None
    f.servers(2)
    with pytest.raises(ConfigError, match="no \\[cloud\\]"):
        f.servers(3)


def test_drift_changes_a_device_from_its_round_on() -> None:
    f = load_fleet("small")
    laptop = f.client("laptop")
    assert f.at_round(4).client("laptop") == laptop
    after = f.at_round(5).client("laptop")
    assert after.link.up == pytest.approx(laptop.link.up * 0.1)
    assert after.link.down == laptop.link.down and after.device == laptop.device
    assert f.at_round(9).client("laptop").link.up == pytest.approx(after.link.up)
    assert f.at_round(5).client("pi") == f.client("pi")


def test_drift_sets_and_scales_in_round_order() -> None:
    f = parse_fleet("""
[edge]
flops = 1e12
memory_mb = 1024
[[device]]
name = "d"
profile = "rpi4"
[[device.drift]]
round = 6
flops_scale = 0.5
[[device.drift]]
round = 3
flops = 1e9
rtt_ms = 100
""")
    assert f.at_round(2).client("d").device.flops == PROFILES["rpi4"].flops
    assert f.at_round(3).client("d").device.flops == 1e9
    assert f.at_round(3).client("d").link.rtt == pytest.approx(0.1)
    assert f.at_round(7).client("d").device.flops == 0.5e9


def test_sample_draws_from_the_device_classes() -> None:
    f = load_fleet("reference")
    s = f.sample(500, seed=3)
    assert len(s.clients) == 500 and len({c.name for c in s.clients}) == 500
    assert s.clients == f.sample(500, seed=3).clients
    assert s.clients != f.sample(500, seed=4).clients
    assert {c.kind for c in s.clients} <= set(f.kinds)
    assert sum(s.kinds.values()) == 500
    tmpl = {c.kind: (c.device, c.link, c.samples) for c in f.clients}
    assert all((c.device, c.link, c.samples) == tmpl[c.kind] for c in s.clients)
    # weighted by count: phone-mid (16 of 60) is drawn more often than nano-cpu (4 of 60)
    assert s.kinds["phone-mid"] > s.kinds["nano-cpu"]


GOOD_EDGE = '[edge]\nflops = 1e12\nmemory_mb = 1024\n'
GOOD_DEV = '[[device]]\nname = "d"\nprofile = "rpi4"\n'


@pytest.mark.parametrize("text, message", [
    ("bogus = 1\n" + GOOD_EDGE + GOOD_DEV, "f.toml: top level: unknown key 'bogus'"),
    ('[edge]\nflops = 1e12\nmemory_mb = 1024\nspeed = 3\n' + GOOD_DEV, "f.toml: \\[edge\\]: unknown key 'speed'"),
    (GOOD_EDGE + GOOD_DEV + "upmbps = 3\n", "f.toml: \\[\\[device\\]\\] #1 \\('d'\\): unknown key 'upmbps'"),
    (GOOD_EDGE + GOOD_DEV + "flops = -1\n", "#1 \\('d'\\): 'flops' must be a finite number > 0, got -1"),
    (GOOD_EDGE + GOOD_DEV + "rtt_ms = -1\n", "'rtt_ms' must be a finite number >= 0"),
    (GOOD_EDGE + GOOD_DEV + "up_mbps = 0\n", "'up_mbps' must be a finite number > 0, got 0"),
    (GOOD_EDGE + GOOD_DEV + "memory_mb = nan\n", "'memory_mb' must be a finite number > 0"),
    (GOOD_EDGE + GOOD_DEV + "count = 0\n", "'count' must be an integer >= 1, got 0"),
    (GOOD_EDGE + GOOD_DEV + "count = true\n", "'count' must be an integer >= 1, got True"),
    (GOOD_EDGE + GOOD_DEV + "samples = 2.5\n", "'samples' must be an integer >= 1"),
    (GOOD_EDGE + GOOD_DEV + 'profile = "pi5"\n', None),  # duplicate key: TOML itself refuses
    (GOOD_EDGE + '[[device]]\nname = "d"\nprofile = "pi5"\n', "'profile' 'pi5' is unknown"),
    (GOOD_EDGE + '[[device]]\nname = "d"\nflops = 1e9\nmemory_mb = 10\n', "#1 \\('d'\\): missing 'up_mbps'"),
    (GOOD_EDGE + '[[device]]\nprofile = "rpi4"\n', "\\[\\[device\\]\\] #1: missing 'name'"),
    (GOOD_EDGE + GOOD_DEV + GOOD_DEV, "#2 \\('d'\\): 'name' 'd' is used by an earlier device"),
    (GOOD_EDGE + GOOD_DEV + "count = 2\n" + '[[device]]\nname = "d-1"\nprofile = "rpi4"\n', "two clients are named 'd-1'"),
    (GOOD_EDGE, "no \\[\\[device\\]\\] entries"),
    (GOOD_DEV, "missing \\[edge\\] table"),
    (GOOD_EDGE + '[cloud]\nflops = 1e13\nmemory_mb = 1\n' + GOOD_DEV, "\\[edge\\]: missing 'up_mbps'"),
    (GOOD_EDGE.replace("flops = 1e12\n", "") + GOOD_DEV, "\\[edge\\]: missing 'flops'"),
    (GOOD_EDGE + GOOD_DEV + "[[device.drift]]\nup_scale = 0.1\n", "drift #1: missing 'round'"),
    (GOOD_EDGE + GOOD_DEV + "[[device.drift]]\nround = 0\nup_scale = 0.1\n", "drift #1: 'round' must be an integer >= 1"),
    (GOOD_EDGE + GOOD_DEV + "[[device.drift]]\nround = 2\nup = 0.1\n", "drift #1: unknown key 'up'"),
    (GOOD_EDGE + GOOD_DEV + "[[device.drift]]\nround = 2\nup_scale = -1\n", "'up_scale' must be a finite number > 0"),
    (GOOD_EDGE + GOOD_DEV + "[[device.drift]]\nround = 2\n", "drift #1: changes nothing"),
    ("[edge\n", "f.toml: not valid TOML"),
])
def test_fleet_errors_name_file_entry_and_key(text: str, message: str | None) -> None:
    with pytest.raises(ConfigError, match=message or "not valid TOML"):
        parse_fleet(text, "f.toml")


def test_a_fleet_too_large_to_hold_is_refused_before_any_client_is_made() -> None:
    from splitfed.profile.fleet import MAX_CLIENTS

    # before: 10**8 Client objects were built (out of memory); now refused, the file, entry and key named
    with pytest.raises(ConfigError, match=r"^f\.toml: \[\[device\]\] #1 \('d'\): 'count' 100,000,000 brings "
                                          r"the fleet to 100,000,000 clients, more than the 100,000 .*lower 'count'$"):
        parse_fleet(GOOD_EDGE + GOOD_DEV + "count = 100000000\n", "f.toml")
    two = GOOD_EDGE + GOOD_DEV + f"count = {MAX_CLIENTS // 2}\n" + '[[device]]\nname = "e"\nprofile = "rpi4"\n'
    assert len(parse_fleet(two + f"count = {MAX_CLIENTS // 2}\n", "f.toml").clients) == MAX_CLIENTS
    with pytest.raises(ConfigError, match=r"#2 \('e'\): 'count' 50,001 brings the fleet to 100,001 clients"):
        parse_fleet(two + f"count = {MAX_CLIENTS // 2 + 1}\n", "f.toml")
    reference = load_fleet("reference")
    assert len(reference.sample(10_000).clients) == 10_000  # the optimizer benchmark's largest fleet
    with pytest.raises(ConfigError, match=r"sample size must be in 1\.\.100,000 \(MAX_CLIENTS\), got 100,001"):
        reference.sample(MAX_CLIENTS + 1)


def test_missing_fleet_file_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="no such file.*reference"):
        load_fleet("no/such/fleet.toml")


def test_a_profile_of_ones_own_model_follows_edits_to_it(tmp_path) -> None:  # noqa: ANN001
    """Profiles were cached by the model's name: after widening a layer (or adding a block) `profile` and
    `optimize` priced the old model. The cache key now holds the factory's source file and the model's
    structure; a zoo model's key is as it was. Separate processes, as a user's edit-and-profile loop runs.
    That an unchanged model keeps its key across processes (the cached profile, no second entry) is
    test_profile_digest's test_a_fresh_profile_process_measures_again_after_the_helper_changes."""
    import json
    import os
    import subprocess
    import sys

    module = tmp_path / "mynet.py"
    env = {**os.environ, "SPLITFED_PROFILE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}

    def profile(hidden: int, blocks: int) -> dict:
        layers = ["nn.Linear(16, HIDDEN)", "nn.ReLU()", "nn.Linear(HIDDEN, 3)"]
        if blocks > 3:
            layers[2:2] = ["nn.Linear(HIDDEN, HIDDEN)", "nn.ReLU()"]
        module.write_text(f"from torch import nn\nHIDDEN = {hidden}\n\ndef net():\n"
                          f"    return nn.Sequential({', '.join(layers)})\n")
        p = subprocess.run([sys.executable, "-m", "splitfed.cli", "profile", "--model", "mynet:net",
                            "--input-shape", "16", "--num-classes", "3", "--json"],
                           capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    first = profile(16, 3)
    assert sum(first["param_bytes"]) == 4 * (16 * 16 + 16 + 16 * 3 + 3)
    wider = profile(512, 3)
    assert sum(wider["param_bytes"]) == 4 * (16 * 512 + 512 + 512 * 3 + 3)
    deeper = profile(16, 5)
    assert len(deeper["names"]) == 5 and len(first["names"]) == 3
    assert len(list((tmp_path / "cache").iterdir())) == 3  # one cached profile per version of the model


def test_a_cached_profile_follows_an_edit_to_a_model_class_in_another_file(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The factory in one file, the model's class in another, and only its forward edited (the same modules
    and sizes): the key holds the source files of the model's own classes too. And in one process, a factory
    without a source file (a notebook cell) re-defined with another width is keyed apart. The first profile is
    kept by this process (as ``splitfed profile``'s defaults keep it: batch 32, 3 reps), the edited model is
    profiled by the command in a new process: a process for the first cost ~3 s of imports and showed nothing
    more."""
    import json
    import os
    import subprocess
    import sys

    from splitfed.models.zoo import resolve_spec
    from splitfed.profile.digest import code_digest
    from splitfed.profile.profiler import profile_model

    (tmp_path / "fac.py").write_text("from net import Net\n\ndef make():\n    return Net()\n")
    env = {**os.environ, "SPLITFED_PROFILE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}

    def write_net(times: int) -> None:
        (tmp_path / "net.py").write_text(
            "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.a = nn.Linear(16, 16)\n        self.b = nn.Linear(16, 3)\n\n"
            f"    def forward(self, x):\n        for _ in range({times}):\n            x = self.a(x)\n"
            "        return self.b(x)\n")

    def flops() -> float:
        p = subprocess.run([sys.executable, "-m", "splitfed.cli", "profile", "--model", "fac:make", "--input-shape",
                            "16", "--num-classes", "3", "--json"], capture_output=True, text=True, timeout=300,
                           env=env, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return sum(json.loads(p.stdout)["fwd_flops"])

    write_net(1)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fac", "net"):  # this test's modules, not another's of the same name; forgotten afterwards
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = resolve_spec("fac:make", input_shape=(16,), num_classes=3)
    once = sum(profile_model(spec, 32, optimizer_slots=1, reps=3, cache_dir=tmp_path / "cache").fwd_flops)
    for name in ("fac", "net"):
        sys.modules.pop(name, None)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    write_net(3)
    thrice = flops()
    assert thrice > once  # the edited forward, measured: not the cached profile of the first
    assert len(list((tmp_path / "cache").iterdir())) == 2
    namespace: dict = {}
    digests = []
    for width in (16, 64):  # a notebook cell run twice
        exec(f"from torch import nn\ndef cell():\n    return nn.Sequential(nn.Linear(12, {width}), nn.ReLU(), "  # noqa: S102
             f"nn.Linear({width}, 3))\n", namespace)
        sys.modules["notebook_cell"] = type(sys)("notebook_cell")
        sys.modules["notebook_cell"].cell = namespace["cell"]  # type: ignore[attr-defined]
        digests.append(code_digest(resolve_spec("notebook_cell:cell", input_shape=(12,), num_classes=3)))
    del sys.modules["notebook_cell"]
    assert digests[0] != digests[1]


def test_a_model_class_in_a_main_without_a_file_is_profiled(tmp_path) -> None:  # noqa: ANN001
    """``python -c``, a REPL, a notebook: inspect has no source for the class, and the profile key crashed with
    OSError where it should fall back to the model's structure."""
    import subprocess
    import sys

    code = ("from torch import nn\n"
            "class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__(); self.a = nn.Linear(4, 8); self.b = nn.Linear(8, 3)\n"
            "    def forward(self, x): return self.b(self.a(x).relu())\n"
            "def make(): return Net()\n"
            "from splitfed.models.zoo import resolve_spec\n"
            "from splitfed.profile.profiler import profile_model\n"
            "s = resolve_spec('__main__:make', input_shape=(4,), num_classes=3)\n"
            f"print(profile_model(s, 8, reps=1, cache_dir={str(tmp_path)!r}).param_bytes)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "(160.0, 108.0)"
