"""A tier's activation memory is what autograd keeps once for the blocks it runs together.

Neighbouring blocks on one tier often keep one tensor between them: the ReLU ending block i keeps its output
for backward and the conv starting block i+1 keeps the same tensor as its input. The profiler measures each
block alone, so it records that shared part (``ModelProfile.shared_act``) and the cost model counts it
once. The truth here is a run of each tier's segment as the engine runs it (``Segment``, its input as the
tier takes it, the device's batch held), counting the unique storages autograd saves.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from splitfed.cost import Scenario
from splitfed.cost.model import option_table
from splitfed.engine.template import grad_reach, trains_before
from splitfed.errors import ConfigError
from splitfed.models.segment import Blocks, make_segment
from splitfed.models.zoo import ModelSpec, model_blocks, resolve_spec
from splitfed.profile import Client, LinkProfile, TierProfile
from splitfed.profile.profiler import ModelProfile, profile_model

B = 4
EDGE, CLOUD = TierProfile(1e10, 1e15), TierProfile(1e11, 1e15)
LINK, EDGE_LINK = LinkProfile(1e6, 1e6, 0.01), LinkProfile(1e7, 1e7, 0.005)

SPECS = {
    "cnn": lambda: resolve_spec("cnn"),
    "vgg11": lambda: resolve_spec("vgg11", width=0.125),
    "resnet18": lambda: resolve_spec("resnet18", width=8),
    "mlp": lambda: resolve_spec("mlp"),
    "transformer": lambda: resolve_spec("transformer"),
    "frozen_first": lambda: resolve_spec("tests.test_frozen_params:frozen_first", (6,), 3),
    "tuple_between": lambda: resolve_spec("tests.own_models:tuple_between", (16,), 3),
    "inplace_first": lambda: resolve_spec("tests.own_models:inplace_first", (16,), 3),
}


def _saved(run: object, own: set[int]) -> tuple[object, dict[int, int]]:
    """``run()`` under a hook that records the storages autograd saves (data pointer -> bytes)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()  # type: ignore[operator]
    return out, saved


def _true_act(spec: ModelSpec, cuts: tuple[int, ...], u_shape: bool, blocks: Blocks | None = None) -> list[float]:
    """Per tier, the bytes autograd keeps for one step of ``B`` samples under ``cuts``, the device's input
    batch counted once whoever keeps it. ``blocks``: the model's, built once for every cut vector (a forward
    changes no tensor's size, and no step is taken); else built here."""
    torch.manual_seed(0)
    if blocks is None:
        _, blocks = model_blocks(spec, seed=0)
    for m in blocks.modules:
        m.train()
    L = len(blocks)
    k = list(cuts[: len(cuts) - u_shape])
    E = cuts[-1] if u_shape else L
    edges = [0, *k, E]
    own = {t.untyped_storage().data_ptr() for m in blocks.modules for t in [*m.parameters(), *m.buffers()]}
    keep: list[object] = []  # every graph alive until all is counted: no storage address is reused
    x = spec.example_input(B)
    head = make_segment(blocks, 0, edges[1])
    local = u_shape and edges[1] == E
    tail = make_segment(blocks, E, L)

    def device_run() -> object:
        out = head(x)
        return tail(out) if local else out

    out, saved = _saved(device_run, own)
    keep.append(out)
    saved.setdefault(x.untyped_storage().data_ptr(), x.untyped_storage().nbytes())  # the batch it holds
    act = [float(sum(saved.values()))]
    if not local and edges[1] < E:  # it sends its head's output on and waits for its gradient
        act[0] += _sent(saved, out, trains_before(spec, edges[1]), both=True)
    relays = []  # U-shape servers before the last: each keeps the chain's output it relays back as its reply
    for t, (a, b) in enumerate(itertools.pairwise(edges[1:]), 1):
        xin = out.detach()  # type: ignore[union-attr]
        if trains_before(spec, a) and xin.is_floating_point():
            xin.requires_grad_(True)  # as a tier takes it (Tier._input); Segment clones it then
        out, saved = _saved(lambda s=make_segment(blocks, a, b), xin=xin: s(xin), own)
        keep.append(out)
        if a < E:  # the chain enters it: it holds what it received for the whole step, whoever keeps it
            saved.setdefault(xin.untyped_storage().data_ptr(), xin.untyped_storage().nbytes())
        sent = 0.0
        if a < E and b < E:  # on to the next server: a U-shape forward lets go of it once that one answers
            sent = _sent(saved, out, trains_before(spec, b), both=not u_shape)
            relays += [t] if u_shape else []
        elif u_shape and a < E == b:  # to the device's tail, whose gradient always comes back
            sent = _sent(saved, out, grad_reach(spec)[E], both=True)
        act.append(float(sum(saved.values())) + sent)
    for t in relays:
        act[t] += out.numel() * out.element_size()  # type: ignore[union-attr]
    if u_shape and not local:
        mid = out.detach().requires_grad_(True)  # type: ignore[union-attr]
        out, saved = _saved(lambda: tail(mid), own)
        keep.append(out)
        act[0] += sum(saved.values()) + mid.untyped_storage().nbytes()  # the tail keeps a clone of it
    return act


def _sent(saved: dict[int, int], out: object, back: bool, both: bool) -> float:
    """What a tier holds of the output it sends on beyond what its blocks keep (none of a view of what they
    keep, or of what it received), and of the gradient that comes back for it (``back``, floating): both at
    once, or (``both`` False) the larger."""
    assert isinstance(out, torch.Tensor)
    held = 0 if out.untyped_storage().data_ptr() in saved else out.numel() * out.element_size()
    grad = out.numel() * out.element_size() if back and out.is_floating_point() else 0
    return float(held + grad if both else max(held, grad))


def _predicted(prof: ModelProfile, cuts: np.ndarray, u_shape: bool) -> np.ndarray:
    dev = Client("c", "c", TierProfile(1e9, 1e15), LINK, samples=B)
    sc = Scenario(prof, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B, u_shape=u_shape)
    return option_table(sc, dev, cuts).act_memory


@pytest.mark.parametrize("model", sorted(SPECS))
@pytest.mark.parametrize("u_shape", [False, True])
def test_activation_memory_per_tier_is_what_its_segment_keeps(model: str, u_shape: bool) -> None:
    """Every legal cut vector of each model (3 tiers, with and without the U-shape tail): the cost model's
    activation memory of each tier equals the bytes its segments keep, run as the engine runs them."""
    spec = SPECS[model]()
    prof = profile_model(spec, batch=B, reps=1, use_cache=False)
    dev = Client("c", "c", TierProfile(1e9, 1e15), LINK, samples=B)
    options = Scenario(prof, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B, u_shape=u_shape).options
    rng = np.random.default_rng(len(model) + u_shape)
    rows = options if len(options) <= 40 else options[rng.choice(len(options), 40, replace=False)]
    predicted = _predicted(prof, rows, u_shape)
    _, blocks = model_blocks(spec, seed=0)  # tracing resnet18 took 90% of the test when built for each row
    for r, cuts in enumerate(rows):
        truth = _true_act(spec, tuple(int(c) for c in cuts), u_shape, blocks)
        assert predicted[r] == pytest.approx(truth, rel=1e-9, abs=1e-6), (model, tuple(cuts))


def test_neighbouring_blocks_share_what_one_keeps_as_output_and_the_next_as_input() -> None:
    """cnn: block 0 is conv + ReLU (the ReLU keeps its output), block 1 starts with a conv (it keeps its
    input): the tensor between them is shared, in full; and block 0's conv keeps the input batch. mlp: a
    Flatten (block 0, keeping nothing) passes the batch's storage to the Linear of block 1."""
    prof = profile_model(SPECS["cnn"](), batch=B, reps=1, use_cache=False)
    pairs = {(j, i): b for j, i, b in prof.shared_act}
    assert pairs[(0, 1)] == prof.out_bytes[0] > 0
    assert pairs[(-1, 0)] == prof.input_bytes
    mlp = profile_model(SPECS["mlp"](), batch=B, reps=1, use_cache=False)
    assert mlp.act_bytes[0] == 0 and (-1, 1, mlp.input_bytes) in mlp.shared_act
    for p in (prof, mlp):
        again = ModelProfile.from_dict(json.loads(json.dumps(p.to_dict())))
        assert again.shared_act == p.shared_act and again.grad_shared_act == p.grad_shared_act


@pytest.mark.parametrize("triples, why", [
    ([[0, 0, 1.0]], "is not"), ([[-2, 1, 1.0]], "is not"), ([[0, 2, 1.0]], "is not"), ([[0, 1, -1.0]], "is not"),
    ([[0, 1]], "is not"), ([["a", 1, 1.0]], "is not"), ([[0.5, 1, 1.0]], "is not"),
    ([[0, 1, 60.0], [-1, 1, 50.0]], "exceeds a block's activation bytes")])
def test_a_synthetic_profile_shares_nothing_and_a_malformed_pair_is_refused(triples: list, why: str) -> None:
    syn = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800)
    assert syn.shared_act == () and syn.grad_shared_act == ()
    d = syn.to_dict()
    d["shared_act"] = triples
    with pytest.raises(ConfigError, match=f"shared_act .*{why}|shared_act {why}"):
        ModelProfile.from_dict(d)


def test_a_server_tier_holds_the_tensor_it_receives_less_what_its_blocks_keep_of_it() -> None:
    """A server tier holds the tensor it receives for the whole step. Taken with a gradient (a block before
    it trains), its segment keeps a clone and the received tensor is held besides (transformer, edge [1, 2):
    the embedding's output, 4 x 8192 bytes, that was priced at 0); taken without one, its blocks keep that
    very tensor (mlp: a Flatten passes the batch's storage to the Linear after it) and it is counted once."""
    tr = profile_model(SPECS["transformer"](), batch=B, reps=1, use_cache=False)
    dev = Client("c", "c", TierProfile(1e9, 1e15), LINK, samples=B)
    sc = Scenario(tr, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B)
    got = option_table(sc, dev, np.array([[1, 2]])).act_memory[0]
    alone = B * (tr.act_bytes[1] - sum(b for j, i, b in tr.shared_act if j == 1 == i))
    sent = 2 * B * tr.out_bytes[1]  # it sends block 1's output on (kept by none), and its gradient comes back
    assert got[1] == pytest.approx(alone + B * tr.out_bytes[0] + sent) and B * tr.out_bytes[0] == 32_768
    mlp = profile_model(SPECS["mlp"](), batch=B, reps=1, use_cache=False)
    assert (0, 1, mlp.input_bytes) in mlp.input_kept  # the batch, kept by block 1 through block 0's view
    sc = Scenario(mlp, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B)
    kept, relayed = option_table(sc, dev, np.array([[0, 2], [0, 0]])).act_memory
    assert (2, 1, mlp.out_bytes[1]) in mlp.out_kept  # block 1 (Linear, ReLU) keeps the output it sends on
    # the batch once, in block 1's; and the gradient of what it sends on
    assert kept[1] == pytest.approx(B * (mlp.act_bytes[0] + mlp.act_bytes[1] + mlp.out_bytes[1]))
    assert relayed[1] == pytest.approx(B * mlp.input_bytes)  # the edge relays it to the cloud: held, kept by none
    # the cloud holds every block: the batch it receives once (block 1 keeps it), each pair of its blocks once
    assert relayed[2] == pytest.approx(B * (sum(mlp.act_bytes) - sum(b for j, i, b in mlp.shared_act if j >= 0)))
    again = ModelProfile.from_dict(json.loads(json.dumps(mlp.to_dict())))
    assert (again.input_kept, again.out_kept, again.out_views) == (mlp.input_kept, mlp.out_kept, mlp.out_views)


def test_a_tier_holds_what_it_sends_on_until_its_gradient_comes_back() -> None:
    """cnn: block 0 ends in a ReLU, which keeps its output: a device holding it sends that very tensor and holds
    only the gradient that comes back besides; block 1 (a max-pool) keeps no output: holding [0, 2) it holds its
    output until the gradient comes, and that too. A tier that computes the loss sends nothing on. mlp: an edge
    holding the Flatten alone sends on a view of the batch it received, held once."""
    cnn = profile_model(SPECS["cnn"](), batch=B, reps=1, use_cache=False)
    dev = Client("c", "c", TierProfile(1e9, 1e15), LINK, samples=B)
    sc = Scenario(cnn, (dev,), (EDGE,), (), batch=B)
    one, two, whole = option_table(sc, dev, np.array([[1], [2], [cnn.n_blocks]])).act_memory
    head = option_table(Scenario(cnn, (dev,), (EDGE,), (), batch=B), dev, np.array([[0]])).act_memory[0]
    assert (1, 0, cnn.out_bytes[0]) in cnn.out_kept and not any(k == 2 for k, _, _ in cnn.out_kept)
    shared = {(j, i): b for j, i, b in cnn.shared_act}
    assert one[0] == pytest.approx(B * (cnn.act_bytes[0] - shared[(-1, 0)] + cnn.input_bytes + cnn.out_bytes[0]))
    assert two[0] == pytest.approx(B * (cnn.act_bytes[0] + cnn.act_bytes[1] - shared[(-1, 0)] - shared.get((0, 1), 0)
                                        + cnn.input_bytes + 2 * cnn.out_bytes[1]))
    assert whole[1] == 0 and head[0] == B * cnn.input_bytes  # the device trains alone / holds no block
    mlp = profile_model(SPECS["mlp"](), batch=B, reps=1, use_cache=False)
    assert (1, 0, mlp.out_bytes[0]) in mlp.out_views
    sc = Scenario(mlp, (dev,), (EDGE, CLOUD), (EDGE_LINK,), batch=B)
    assert option_table(sc, dev, np.array([[0, 1]])).act_memory[0][1] == B * mlp.input_bytes  # the batch, once


@pytest.mark.parametrize("field, triples", [("out_kept", [[0, -1, 1.0]]), ("out_kept", [[1, -2, 1.0]]),
                                            ("out_kept", [[1, 1, 1.0]]), ("out_kept", [[1, 0, 4001.0]]),
                                            ("out_views", [[1, -1, 1.0]]), ("out_views", [[3, 0, 1.0]]),
                                            ("out_views", [[2, 0, -1.0]]), ("out_kept", [[1, 0]])])
def test_a_malformed_out_kept_or_view_is_refused(field: str, triples: list) -> None:
    d = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800).to_dict()
    d[field] = triples
    with pytest.raises(ConfigError, match=f"{field} entry .* is not"):
        ModelProfile.from_dict(d)


@pytest.mark.parametrize("triples", [[[1, 0, 1.0]], [[-1, 0, 1.0]], [[0, 2, 1.0]], [[0, 1, -1.0]], [[0, 1]],
                                     [["a", 1, 1.0]], [[0.5, 1, 1.0]], [[0, 1, 101.0]]])
def test_a_malformed_input_kept_is_refused(triples: list) -> None:
    syn = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800)
    assert syn.input_kept == ()  # a synthetic profile: every server tier holds what it receives in full
    d = syn.to_dict()
    d["input_kept"] = triples
    with pytest.raises(ConfigError, match="input_kept entry .* is not"):
        ModelProfile.from_dict(d)
