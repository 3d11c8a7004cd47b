"""Coverage gaps of the cost model, the optimizer and the adapter: refusals, fallbacks and tie-breaks that no
other test reached, each checked for what it does (not only that it runs)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import splitfed.optimizer.assign as assign
from splitfed.cost import Scenario, client_cost, evaluate, option_table, server_memory, wire_bytes
from splitfed.cost.wire import codec_rules
from splitfed.errors import ConfigError, CutError
from splitfed.optimizer import Adapter, best_static, brute_force, exhaustive, solve, static
from splitfed.optimizer import classes as opt_classes
from splitfed.optimizer import ties as opt_ties
from splitfed.profile import Client, LinkProfile, ModelProfile, TierProfile

PROF = ModelProfile.synthetic([1e6, 2e6], [4000, 100], [1000, 500], input_bytes=800)
DEV = Client("c", "c", TierProfile(1e9, 1e9), LinkProfile(1e5, 2e5, 0.02), samples=10)
EDGE, CLOUD = TierProfile(1e10, 1e9), TierProfile(1e11, 1e9)
EDGE_LINK = LinkProfile(1e6, 1e6, 0.01)


def _sc(clients: tuple[Client, ...] = (DEV,), mode: str = "sflv1") -> Scenario:
    return Scenario(PROF, clients, (EDGE, CLOUD), (EDGE_LINK,), batch=4, mode=mode)


# ---------------------------------------------------------------- cost model: wire sizes


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 2.5, 3.0, 4.0, 8.0, 16.0]), min_size=1, max_size=6),
       st.sampled_from(["fp16", "int8", "topk:0.25"]))
def test_wire_bytes_on_arrays_refuses_sizes_no_floating_dtype_has(sizes: list[float], codec: str) -> None:
    """The option tables price every boundary at once (arrays): a floating boundary of an element size the wire
    carries no floating dtype of (float8's 1 byte, 3, 16) is refused naming each such size once, sorted; the
    same sizes on integer tensors (``floating`` False) are sent as they are, priced raw."""
    size = np.asarray(sizes)
    per = 12.0 * size
    bad = sorted({s for s in sizes if s not in (2.0, 4.0, 8.0)})
    if bad:
        with pytest.raises(ConfigError, match=rf"codec {codec.split(':')[0]}: .* values of "
                                              rf"{', '.join(f'{b:g}' for b in bad)} bytes$"):
            wire_bytes(codec, per, 3, itemsize=size)
    else:
        got = wire_bytes(codec, per, 3, itemsize=size)
        one = [float(wire_bytes(codec, float(p), 3, itemsize=float(s))) for p, s in zip(per, size, strict=True)]
        assert got.tolist() == one  # the array path prices as the one-message path
    raw = wire_bytes(codec, per, 3, floating=np.zeros(len(sizes), bool), itemsize=size)
    assert raw.tolist() == (per * 3).tolist()


def test_a_float8_boundary_is_refused_under_a_lossy_codec_and_priced_raw_without_one() -> None:
    """A measured profile may record a float8 boundary (a torch dtype, so the profile loads); no codec of the
    wire has a rule for 1-byte floats, so pricing it compressed is a clear refusal, not a wrong size."""
    prof = dataclasses.replace(PROF, out_dtype=("float8_e4m3fn", "float32"))
    assert prof.float_itemsize == (4.0, 1.0, 4.0)
    with pytest.raises(ConfigError, match="codec fp16: no floating dtype the wire carries has values of 1 bytes"):
        client_cost(dataclasses.replace(_sc(), profile=prof, codec="fp16"), "c", (1, 2))
    plain = client_cost(dataclasses.replace(_sc(), profile=prof), "c", (1, 2))
    assert plain.up_bytes == (10 * 4000 + 10 * 8, 0)  # no codec: the bytes as measured, labels beside them


@pytest.mark.parametrize("flaw", ["not affine", "sizes disagree"])
def test_codec_rules_refuse_a_transport_whose_sizes_they_cannot_express(monkeypatch: pytest.MonkeyPatch,
                                                                         flaw: str) -> None:
    """``codec_rules`` reads the per-value price off the transport's ``payload_size``; were that ever not
    header + n x value, or different for float16 and bfloat16 (one element size), pricing by size would be
    wrong, so it refuses. Only ``payload_size`` is replaced (a transport that does not exist cannot be run),
    and the cached function's undecorated body is called, so no cached rule is disturbed."""
    import torch

    from splitfed.transport import codec as tc

    real = tc.payload_size

    def fake(dtype: torch.dtype, shape: tuple[int, ...], codec: tc.Codec) -> int:
        n = int(np.prod(shape))
        if flaw == "not affine":
            return 16 + n * n
        return real(dtype, shape, codec) + (n if dtype == torch.bfloat16 else 0)

    monkeypatch.setattr(tc, "payload_size", fake)
    with pytest.raises(AssertionError, match="codec fp16: payload_size is not header"):
        codec_rules.__wrapped__("fp16")
    monkeypatch.undo()
    assert codec_rules.__wrapped__("fp16") == codec_rules("fp16")


# ---------------------------------------------------------------- cost model: scenarios and lookups


@pytest.mark.parametrize(("change", "words"), [
    ({"servers": (), "server_links": ()}, "a chain needs at least one server tier"),
    ({"batch": 0}, "batch and epochs must be >= 1, got 0, 1"),
    ({"epochs": 0}, "batch and epochs must be >= 1, got 4, 0"),
    ({"clients": ()}, "a scenario needs at least one client"),
])
def test_scenario_refuses_what_no_round_can_run(change: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        dataclasses.replace(_sc(), **change)


def test_a_client_is_found_by_name_and_an_unknown_name_is_refused() -> None:
    twin = dataclasses.replace(DEV, samples=99)
    sc = _sc((DEV, dataclasses.replace(DEV, name="d"), twin))
    assert sc.index("d") == 1 and sc.index("c") == 0  # repeated names: the first
    with pytest.raises(ConfigError, match="no client named 'nobody'"):
        client_cost(sc, "nobody", (1, 2))


def test_evaluate_names_the_client_whose_cuts_are_illegal() -> None:
    sc = _sc((DEV, dataclasses.replace(DEV, name="bad")))
    with pytest.raises(CutError, match=r"^client bad: "):
        evaluate(sc, {"c": (1, 2), "bad": (2, 1)})


def test_option_tables_of_a_model_with_over_50000_options_price_a_subset_as_the_full_table() -> None:
    """Past 50,000 legal cut vectors the scenario keeps no option -> row index, so a table of chosen options
    (every ``client_cost`` and ``evaluate``) prices each message itself: it must equal the full table's rows,
    with a codec per link and a U-shape tail (both message kinds)."""
    L = 70
    rng = np.random.default_rng(0)
    prof = ModelProfile.synthetic(list(rng.integers(1, 50, L) * 1e6), list(rng.integers(1, 60, L) * 1e3),
                                  list(rng.integers(0, 400, L) * 1e3), input_bytes=3e3)
    sc = Scenario(prof, (DEV,), (EDGE, CLOUD), (EDGE_LINK,), batch=4, u_shape=True, codec=("int8", "topk:0.1"))
    assert len(sc.options) > 50_000 and sc._rows(sc.options[:1]) is None
    full = option_table(sc, DEV)
    pick = np.array([0, 5, 1000, 30_000, len(sc.options) - 1])
    sub = option_table(sc, DEV, sc.options[pick])
    for f in dataclasses.fields(full):
        got, want = getattr(sub, f.name), getattr(full, f.name)[pick]
        assert np.array_equal(got, want), f.name
    one = client_cost(sc, "c", tuple(int(x) for x in sc.options[1000]))
    assert one.up_bytes == tuple(full.up_bytes[1000]) and one.round_s == full.round_s[1000]


@pytest.mark.parametrize("mode", ["sflv1", "sflv2", "sl"])
def test_server_memory_of_no_clients_is_nothing(mode: str) -> None:
    sc = _sc(mode=mode)
    got = server_memory(sc, np.zeros((0, 2), np.int64), np.zeros((0, 2)), np.zeros((0, 2)))
    assert got.tolist() == [0.0, 0.0]


def test_client_cost_to_dict_is_its_numbers_as_json() -> None:
    c = client_cost(_sc(), "c", (1, 2))
    d = json.loads(json.dumps(c.to_dict()))
    assert d["name"] == "c" and d["cuts"] == [1, 2] and d["time_s"] == c.round_s and d["batch_s"] == c.batch_s
    assert d["batch"] == {k: list(v) for k, v in c.batch().items()}
    assert sum(sum(v) for v in d["batch"].values()) == pytest.approx(c.batch_s)
    assert (d["up_bytes"], d["down_bytes"], d["memory_bytes"]) == ([40080, 0], [40000, 0], list(c.memory))
    assert d["compute_s"] == list(c.compute_s) and d["exchange_bytes"] == c.exchange_bytes


# ---------------------------------------------------------------- optimizer


def test_best_static_ranks_cut_vectors_with_the_staged_base() -> None:
    """sflv1: two clients holding the same server blocks stage them (the base) while they load. The cheapest
    ten cut vectors all put the 1 MB block 9 on the edge, and its base overflows the edge beside both
    replicas; only keeping everything on the device fits. ``best_static`` ranked by memory without the base,
    re-priced its 8 best (all over), and refused though a static fits (``static`` and brute force find it)."""
    L = 10
    prof = ModelProfile.synthetic([1e6] * L, [100.0] * L, [0.0] * (L - 1) + [1e6], input_bytes=100)
    dev = [Client(n, n, TierProfile(1e8, 1e12), LinkProfile(1e9, 1e9, 0.0), samples=4) for n in "ab"]
    cap = 2 * prof.fixed_bytes[-1] + 0.5e6  # both replicas fit; the 1 MB base beside them does not
    sc = Scenario(prof, tuple(dev), (TierProfile(1e12, cap),), batch=4)
    for k in range(L):
        assert not evaluate(sc, {"a": (k,), "b": (k,)}).feasible
    fits = static(sc, (L,))
    assert fits.cost.feasible
    got = best_static(sc)
    assert got.assignment == {"a": (L,), "b": (L,)} and got.makespan_s == fits.makespan_s
    assert exhaustive(sc).makespan_s <= got.makespan_s


def test_solve_refuses_an_unknown_method() -> None:
    with pytest.raises(ConfigError, match="method must be auto, direct, bisect or sequential, got 'fastest'"):
        solve(_sc(), method="fastest")


def _coupled(mode: str) -> Scenario:
    """tests/test_optimizer.py's scenario where the clients' fastest cuts overflow the edge beside the largest
    holder: ``auto`` must search holder sizes (sl, sflv2)."""
    prof = ModelProfile.synthetic([5e6, 1e6, 5e6], [100, 3e3, 10e3], [987e3, 987e3, 10e3], input_bytes=41e3,
                                  optimizer_slots=0)
    devices = [(3e10, 1e7, 1e7, 292), (3e10, 1e7, 5e6, 51), (1e9, 1e5, 1e7, 51)]
    clients = tuple(Client(f"c{i}", f"c{i}", TierProfile(f, 1e12), LinkProfile(up, down, 0.01), n)
                    for i, (f, up, down, n) in enumerate(devices))
    return Scenario(prof, clients, (TierProfile(5e10, 4_287_600), TierProfile(1e12, 1e15)),
                    (LinkProfile(1e7, 1e7, 0.01),), batch=32, mode=mode)


@pytest.mark.parametrize("mode", ["sl", "sflv2"])
def test_too_many_holder_candidates_fall_back_to_the_bisection(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Past ``HOLDER_CANDIDATES`` (holder sizes x options; 4,000,000, lowered to 0 here so a small fleet passes
    it) the sequential rule hands over to the bisection MILPs, which find the same optimum brute force does."""
    sc = _coupled(mode)
    truth = exhaustive(sc)
    assert solve(sc, gap=0.0).note.startswith(f"{mode} sequential")
    monkeypatch.setattr(assign, "HOLDER_CANDIDATES", 0)
    got = solve(sc, gap=0.0)
    assert got.note.startswith(f"{mode} bisect") and got.optimal
    assert got.makespan_s == truth.makespan_s and got.cost.feasible


def test_a_time_limit_spent_before_the_tie_break_returns_the_optimum() -> None:
    """sl's sequential rule needs no MILP, so a solve whose time limit is already spent still finds the
    optimum; the tie-break towards ``prefer`` (MILPs) then gets no time and the optimum is returned as is,
    and its note says the tie that moves least was not looked for."""
    sc = _coupled("sl")
    opt = solve(sc)
    prefer = {c.name: (3, 3) for c in sc.clients}  # all on the device: slower than the optimum
    assert evaluate(sc, prefer).makespan_s > opt.makespan_s * 1.01
    got = solve(sc, time_limit=0.0, prefer=prefer)
    assert got.assignment == opt.assignment and got.makespan_s == opt.makespan_s
    assert "least move cost" not in got.note
    assert got.note.endswith("; no time left to look for the tie that moves least")  # said, not silent
    moved = solve(sc, prefer=prefer)  # with time, as fast, but it would move less had it a choice
    assert moved.makespan_s == pytest.approx(opt.makespan_s, rel=1e-9)
    assert "no time left" not in moved.note


# a block of almost no work: moving it between edge and cloud changes a time by ~1e-12 relative
_TINY = ModelProfile.synthetic([1e6, 1e-4, 1e6], [1000.0, 1000.0, 100.0], [0.0, 0.0, 0.0], input_bytes=1000)


def _tiny(n: int) -> Scenario:
    clients = tuple(Client(f"c{i}", "k", TierProfile(1e9, 1e12), LinkProfile(1e6, 1e6, 0.01), samples=8)
                    for i in range(n))
    return Scenario(_TINY, clients, (TierProfile(1e10, 1e12), TierProfile(1e11, 1e12)),
                    (LinkProfile(1e7, 1e7, 0.001),), batch=4)


def test_polish_moves_the_slowest_client_to_an_option_a_hair_faster() -> None:
    """A MILP's tolerance cannot tell (0, 1) from (0, 2) (block 1 on the cloud or the edge: 2e-12 s apart);
    the polish moves the client that sets the makespan to the faster one."""
    sc = _tiny(1)
    cost = evaluate(sc, {"c0": (0, 2)})
    assert cost.bottleneck == "client c0"
    got = opt_ties.polish(sc, opt_classes.price_classes(sc), cost)
    assert got.assignment() == {"c0": (0, 1)}
    assert cost.makespan_s * (1 - 1e-9) < got.makespan_s < cost.makespan_s


def test_polish_unloads_the_shared_resource_that_sets_the_makespan() -> None:
    """Twenty clients on (0, 2) make the edge's compute the bottleneck; (0, 1) loads it a hair less (block 1
    goes to the cloud), so the polish moves them, one per pass, until the edge is as light as it gets."""
    sc = _tiny(20)
    cost = evaluate(sc, {c.name: (0, 2) for c in sc.clients})
    assert cost.bottleneck == "edge compute"
    got = opt_ties.polish(sc, opt_classes.price_classes(sc), cost)
    assert set(got.assignment().values()) == {(0, 1)} and got.bottleneck == "edge compute"
    assert got.makespan_s < cost.makespan_s and got.makespan_s == evaluate(sc, got.assignment()).makespan_s


@pytest.mark.parametrize(("sizes", "text"), [
    ([9996, 10**12], "~1e+16"),     # 9.996e15 would print as 10e+15
    ([9994, 10**12], "~9.99e+15"),
    ([7, 11], "77"),
    ([10**8, 10**8], "~1e+16"),
])
def test_count_text_never_prints_a_mantissa_of_ten(sizes: list[int], text: str) -> None:
    assert brute_force.count_text(sizes) == text


# ---------------------------------------------------------------- adapter


@pytest.mark.parametrize("kw", [{"jump": 1.0}, {"hysteresis": -0.01}, {"rounds": 0}])
def test_adapter_refuses_a_jump_hysteresis_or_round_count_out_of_range(kw: dict) -> None:
    args = {"rounds": 5, **kw}
    with pytest.raises(ConfigError, match="jump must be > 1, hysteresis >= 0 and rounds >= 1"):
        Adapter(_sc(), args.pop("rounds"), **args)
