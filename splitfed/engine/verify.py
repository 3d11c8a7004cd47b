"""The invariance law as a user tool: split training must equal unsplit training.

The reference trains whole models (one autograd graph, one optimizer, no
detach, no link) on the same batches from the same seed:

- ``sflv1``: FedAvg of the unsplit model (each client trains a whole copy);
- ``sl``: one whole model trained by the clients in turn;
- ``sflv2``: each client trains a whole model assembled from its own device
  copy and the blocks of the one server-side model, which it updates in place
  (whichever server tier the client puts them on).

Tolerance: 1e-5 absolute on float32 weights. Split and whole training run the
same kernels in the same order, so the difference is normally exactly 0; the
tolerance leaves room for reduction-order changes in kernels (e.g. a
different thread count on another tier) while still catching any real error,
which shows up at 1e-3 or above after one step.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from splitfed.aggregate import aggregate
from splitfed.engine import template
from splitfed.engine.rounds import (
    Batches,
    Chain,
    RoundConfig,
    device_state,
    initial_state,
    inprocess_chain,
    run_round,
    select,
    server_bounds,
)
from splitfed.engine.types import OptimConfig, State
from splitfed.errors import ConfigError
from splitfed.models.segment import Segment, step_rng
from splitfed.models.zoo import ModelSpec

TOLERANCE = 1e-5
TRANSPORTS = ("inproc", "grpc")  # what a chain can be, as a result names it


def _whole(model: ModelSpec, blocks: dict[int, torch.nn.Module]) -> Segment:
    n = template.num_blocks(model)
    return Segment({str(i): blocks[i] for i in range(n)}, 0, n)


def _train_whole(cfg: RoundConfig, cid: str, whole: Segment, batches: Batches) -> None:
    whole.train()
    opt = cfg.optim.build(list(whole.parameters()))
    for seq, (x, y) in enumerate(batches):
        out = whole(x, rng=step_rng(cfg.seed, cid, cfg.round, seq))
        loss = F.cross_entropy(out, y)
        if loss.requires_grad:  # a model whose output nothing trains reaches (a last block detaches): no backward
            loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)


def _load(model: ModelSpec, state: State) -> dict[int, torch.nn.Module]:
    return {int(k): b for k, b in template.whole_model(model, state).named_children()}


def reference_round(cfg: RoundConfig, global_state: State, assignment: dict[str, tuple[int, ...]],
                    data: dict[str, Batches], n_tiers: int) -> State:
    """The same round computed on whole models."""
    model = cfg.model
    n = template.num_blocks(model)
    if cfg.mode == "sflv1":
        contributions: list[tuple[State, float]] = []
        for cid in assignment:
            whole = _whole(model, _load(model, global_state))
            _train_whole(cfg, cid, whole, data[cid])
            contributions.append((whole.state_dict(), sum(int(x.shape[0]) for x, _ in data[cid])))
        return aggregate(contributions, previous=global_state)
    if cfg.mode == "sl":
        whole = _whole(model, _load(model, global_state))
        for cid in assignment:
            _train_whole(cfg, cid, whole, data[cid])
        return {k: v.detach().clone() for k, v in whole.state_dict().items()}
    # sflv2: one server-side model (whatever the tiers), device copies per client
    bank = _load(model, global_state)
    trained: dict[int, float] = {}
    contributions = []
    for cid, cuts in assignment.items():
        own = _load(model, global_state)
        blocks = dict(own)
        for a, z in server_bounds(cuts, n, cfg.u_shape):
            for i in range(a, z):
                blocks[i] = bank[i]
                trained[i] = trained.get(i, 0.0) + sum(int(x.shape[0]) for x, _ in data[cid])
        _train_whole(cfg, cid, _whole(model, blocks), data[cid])
        dev = device_state(_whole(model, own).state_dict(), cuts, n, cfg.u_shape)
        contributions.append((dev, sum(int(x.shape[0]) for x, _ in data[cid])))
    state = _whole(model, bank).state_dict()
    for i, w in trained.items():
        contributions.append((select(state, i, i + 1), w))
    return aggregate(contributions, previous=global_state)


def largest_diff(a: State, b: State) -> tuple[float, str]:
    """The largest ``|a - b|`` over every key, and the key it is in ("" where none differs): what a MISMATCH
    names, so that the block that trains otherwise is found without a debugger."""
    if set(a) != set(b):
        raise AssertionError(f"state keys differ: {sorted(set(a) ^ set(b))[:5]}")
    worst, where = 0.0, ""
    for k in a:
        d = (a[k].to(torch.float64) - b[k].to(torch.float64)).abs()
        m = float(d.max()) if d.numel() else 0.0
        if m > worst:
            worst, where = m, k
    return worst, where


def max_abs_diff(a: State, b: State) -> float:
    return largest_diff(a, b)[0]


@dataclass
class VerifyResult:
    model: str
    cuts: list[list[int]]
    mode: str
    tiers: int
    u_shape: bool
    rounds: int
    clients: int
    steps: int
    max_abs_diff: float
    tolerance: float
    transport: str
    worst_key: str = ""  # the state key ("<block>.<name>") of max_abs_diff; "" when nothing differs

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["ok"] = self.ok
        return d


def _copies(data: dict[str, Batches]) -> dict[str, Batches]:
    return {c: [(x.clone(), y.clone()) for x, y in b] for c, b in data.items()}


def _cut_vectors(cuts: object) -> list[tuple[int, ...]]:
    """``cuts`` as one tuple of integer cuts per client; a ConfigError for anything else (a flat ``[2, 5]``, one
    client's vector, would fail with a TypeError; a ``2.5`` would be cut at 2)."""
    example = "cuts=[(2, 5)] for one client on 3 tiers, cuts=[(2, 5), (1, 3)] for two"
    if isinstance(cuts, (str, bytes)) or not isinstance(cuts, Sequence) or not cuts:
        raise ConfigError(f"verify needs a cut vector per client, e.g. {example}: got {cuts!r}")
    out = []
    for c in cuts:
        try:
            if isinstance(c, (str, bytes)) or not isinstance(c, Sequence) or not c or any(isinstance(k, bool) for k in c):
                raise TypeError
            out.append(tuple(operator.index(k) for k in c))
        except TypeError:
            raise ConfigError(f"verify needs a cut vector (a tuple of integers) per client, e.g. {example}: got "
                              f"{c!r} in {cuts!r}") from None
    return out


def verify(model: ModelSpec, cuts: Sequence[Sequence[int]], *, mode: str = "sflv1", u_shape: bool = False,
           steps: int = 2, batch: int = 4, rounds: int = 1, seed: int = 0, optim: OptimConfig | None = None,
           chain: Chain | None = None, transport: str = "inproc",
           data_fn: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]] | None = None) -> VerifyResult:
    """Train split (one cut vector per client) and whole; compare the final global weights. ``chain``: the
    tiers the split side trains on (in process when None); ``transport``: what that chain is, as the result
    reports it. It trains with one torch thread, as tier processes do, and gives the caller's count back."""
    from splitfed.data import synthetic

    if transport not in TRANSPORTS:  # it only labels the result: a value no chain is would be reported as checked
        raise ConfigError(f"verify: transport must be one of {', '.join(map(repr, TRANSPORTS))} (the kind of chain "
                          f"it trains on, as the result reports it), got {transport!r}")
    if transport == "grpc" and chain is None:  # it would train in process, and report gRPC checked
        raise ConfigError("verify: transport 'grpc' needs the gRPC chain itself: chain=grpc_chain(addresses) of "
                          "running tiers (splitfed verify --transport grpc starts them); without one it trains in "
                          "process")
    cuts = _cut_vectors(cuts)
    for what, v in (("steps", steps), ("batch", batch), ("rounds", rounds)):  # 0 would train nothing: a vacuous OK
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"verify: {what} must be an integer >= 1, got {v!r}")
    if batch == 1 and (why := template.one_sample_error(model)):
        raise ConfigError(f"batch 1: model {model.name} cannot train on one sample ({why}); give a batch of 2 "
                          "or more")
    n_tiers = len(cuts[0]) + 1 - (1 if u_shape else 0)
    chain = chain or inprocess_chain(n_tiers - 1)
    optim = optim or OptimConfig(lr=0.05, momentum=0.9)
    assignment = {f"client{i}": c for i, c in enumerate(cuts)}
    data: dict[str, Batches] = {}
    for i, cid in enumerate(assignment):
        if data_fn is not None:
            x, y = data_fn(steps * batch, seed * 1000 + i)
        else:
            ds = synthetic(model, steps * batch, seed * 1000 + i)
            x, y = ds.tensors
        data[cid] = [(x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]) for s in range(steps)]
    split = initial_state(model, seed)
    whole = {k: v.clone() for k, v in split.items()}
    run_id = f"verify-{uuid.uuid4().hex[:8]}"
    threads = torch.get_num_threads()
    # one thread, as every tier process and simulation computes: with torch's default the whole model sums in
    # another order than a gRPC chain's tiers (a BatchNorm differs in the last bit); the caller's count given back
    torch.set_num_threads(1)
    try:
        for r in range(rounds):
            cfg = RoundConfig(run_id, r, model, mode, u_shape, optim, seed)
            split, _ = run_round(cfg, chain, split, assignment, _copies(data))  # each side its own batches: a
            whole = reference_round(cfg, whole, assignment, _copies(data), n_tiers)  # model may write its input
    finally:
        torch.set_num_threads(threads)
    diff, key = largest_diff(split, whole)
    return VerifyResult(model.name, [list(c) for c in assignment.values()], mode, n_tiers, u_shape, rounds,
                        len(assignment), steps, diff, TOLERANCE, transport, key)
