"""Every draw splitfed makes from torch's process-wide generator is made holding it (``splitfed.models.rng``).

Two runs in one process (tiers are services many runs share; a simulation's tiers run beside its
ServerApp) drew from the one generator while one of them held it seeded: a run starting up checked its
model's forward in training mode under a bare ``fork_rng``, and a node timed its training speed between a
bare get and set of the generator's state. Whatever seeded step ran meanwhile (another run's dropout,
its initial weights) drew from a generator moved under it, or had it set back, and trained on another
mask: a shared run ended a few tenths off where it ends alone, about once in 150 tries. A law over each
place that draws catches it every time, not once in 150: a stochastic module runs in training mode only
by a thread that holds the lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from splitfed.data import synthetic
from splitfed.engine.device import Device
from splitfed.engine.rounds import RoundConfig, initial_state, inprocess_chain, tier_loads
from splitfed.models import rng
from splitfed.models.zoo import model_blocks, resolve_spec
from splitfed.profile.profiler import profile_model
from splitfed.profile.speed import measure_speed

DRAWS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)


def _held_by_me() -> bool:
    """Whether this thread holds :data:`rng.LOCK`: held by somebody if another thread cannot take it, and by
    this one if it can take it again (an RLock)."""
    free: list[bool] = []

    def probe() -> None:
        got = rng.LOCK.acquire(blocking=False)
        if got:
            rng.LOCK.release()
        free.append(got)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    if free[0] or not rng.LOCK.acquire(blocking=False):
        return False
    rng.LOCK.release()
    return True


@contextlib.contextmanager
def draws_seen() -> Iterator[list[tuple[str, bool]]]:
    """Each forward of a module that draws, in training mode: (its type, whether the thread held the lock)."""
    seen: list[tuple[str, bool]] = []

    def hook(module: nn.Module, _args: object) -> None:
        if isinstance(module, DRAWS) and module.training and module.p > 0:
            seen.append((type(module).__name__, _held_by_me()))

    handle = nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def test_the_probe_tells_a_held_lock_from_a_free_one() -> None:
    assert not _held_by_me()
    with rng.seeded():
        assert _held_by_me()
        with rng.seeded(3):  # re-entered
            assert _held_by_me()
        assert _held_by_me()
    assert not _held_by_me()
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with rng.LOCK:
            taken.set()
            done.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert taken.wait(30)
        assert not _held_by_me()  # held, by someone else
    finally:
        done.set()
        t.join()


def _unheld(seen: list[tuple[str, bool]]) -> list[str]:
    assert seen, "nothing drew: the check saw no dropout in training mode"
    return [kind for kind, held in seen if not held]


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_a_run_starting_checks_its_model_holding_the_generator(model: str) -> None:
    """``model_blocks`` (every initial model, every tier's template) runs the model once in training mode
    to check its logits: a draw."""
    spec = resolve_spec(model)
    with draws_seen() as seen:
        model_blocks(spec, 0)
        initial_state(spec, 1)
    assert _unheld(seen) == []


def test_timing_a_nodes_speed_holds_the_generator() -> None:
    spec = resolve_spec("cnn")  # its dropout is in block 5: a budget no pass reaches times every block
    x = synthetic(spec, 8, 0).tensors[0]
    before = torch.default_generator.get_state()
    with draws_seen() as seen:
        got = measure_speed(spec, x, budget_s=1e9, reps=1)
    assert got.blocks == 7
    assert _unheld(seen) == []
    assert torch.equal(torch.default_generator.get_state(), before)  # given back as it was


def test_profiling_and_split_steps_hold_the_generator() -> None:
    spec = resolve_spec("mlp")  # dropout on the device side and on the server side of cut 1
    with draws_seen() as seen:
        profile_model(spec, 8, reps=1, use_cache=False)
        chain = inprocess_chain(1)
        cfg = RoundConfig("run", 0, spec, seed=3)
        state = initial_state(spec, 3)
        for cut in (1, 3):  # the device's dropout, then the tier's
            (load,) = tier_loads(cfg, f"c{cut}", (cut,), state)
            chain.tiers[0].load(load)
            dev = Device(spec, chain.link, run_id="run", client_id=f"c{cut}", round=0, cuts=(cut,), state=state,
                         seed=3)
            x, y = synthetic(spec, 8, cut).tensors
            dev.train_step(x, y)
    assert _unheld(seen) == []
    assert len(seen) >= 3  # the profile's, the device's and the tier's


def test_a_starting_run_moves_no_mask_of_a_step_drawing_meanwhile() -> None:
    """The race itself, forced: a run starting in another thread is stopped where its check draws; a step
    then seeds the generator and draws its mask in two parts, and the check goes on between them. Both parts
    are the seed's. Unheld, the check had saved the generator's state before the step seeded it, drew, and
    set it back: the step's second part came from that state, not its seed. Held, the check ends before
    the step can seed (its wait for the step times out)."""
    spec = resolve_spec("mlp")
    model_blocks(spec, 0)  # its template and verdict built: the run below only builds and checks
    torch.default_generator.manual_seed(11)
    expected = torch.rand(64)
    entered, go, finished = threading.Event(), threading.Event(), threading.Event()

    def hook(module: nn.Module, _args: object) -> None:
        if isinstance(module, DRAWS) and module.training and threading.current_thread() is starting \
                and not entered.is_set():
            entered.set()
            go.wait(1.0)

    def start() -> None:
        model_blocks(spec, 0)
        finished.set()

    handle = nn.modules.module.register_module_forward_pre_hook(hook)
    starting = threading.Thread(target=start)
    try:
        starting.start()
        assert entered.wait(60)
        with rng.seeded(11):
            first = torch.rand(32)
            go.set()
            assert finished.wait(60)
            second = torch.rand(32)
    finally:
        go.set()
        starting.join(60)
        handle.remove()
    assert torch.equal(torch.cat([first, second]), expected)
