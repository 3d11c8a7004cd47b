"""Paths no other test ran in-process: cutting (``models.blocks``), the profiler, the shared command-line
argument types, ``verify``'s cut list, and the experiment scripts' shared code (``simulations.common``).

Two failed before their fixes: a traced model with a sparse embedding (``nn.Embedding(sparse=True)``) was
neither refused nor accepted but raised torch's NotImplementedError from the check that its blocks train as
itself (the largest gradient, and a gradient judged equal to rounding, were read off a sparse tensor); and an
experiment's results holding a numpy array raised ValueError (``.item()`` taken for a scalar's).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import site
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from torch import nn

from simulations import common
from splitfed.cli import main as cli_main
from splitfed.commands import _args
from splitfed.engine import template
from splitfed.engine.verify import verify
from splitfed.errors import ConfigError, CutError, Terminated
from splitfed.models import check, segment, trace, tying
from splitfed.models.blocks import to_blocks
from splitfed.models.zoo import resolve_spec
from splitfed.profile import digest as D
from splitfed.profile import profile_model
from splitfed.profile.profiler import ModelProfile

HERE = "tests.test_gaps_models_profile"


# ---------------------------------------------------------------- models of one's own (factories by path too)


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x.relu()
        return h, h * 2


class _First(nn.Module):
    """Doubles the first tensor of its input in place (what a cloned input keeps apart), giving a new one."""

    def forward(self, x: Any) -> torch.Tensor:
        first = x[0] if isinstance(x, (tuple, list)) else x["a"]
        return first.mul_(2) + 1


class _DictOut(nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"a": x.relu(), "b": x}


class _RaisesInTraining(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError("no training here")
        return x


class _OneBatchSize(nn.Module):
    """Works on a batch of two samples only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(2, 4)


class _Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))


class _TwoExtra(_Two):
    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(2, 2)


class _TwoOfFlat(_Two):
    """The same parameters, another input: what a factory building another model each time gives."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x.flatten(1)[:, :4])))


class _TwoTuple(_Two):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        h = super().forward(x)
        return h, h.sum()


class _Counts(_Two):
    """Counts its calls in a buffer apart from its input: the traced blocks run it once, at trace time."""

    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.count.fill_(self.calls)
        return super().forward(x)


class _TrainOnlyTraceable(_Two):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return super().forward(x)
        if x.sum() > 0:  # fx cannot follow a branch on a value
            return self.b(self.a(x))
        return self.b(x)


class _OneOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


class _LinearRelu(_OneOp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.a(x))


class _NoForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)


class _BuiltinForward(_NoForward):
    forward = torch.relu  # no signature inspect can read, and no code fx can trace


class _SparseTraced(nn.Module):
    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.e, self.b = nn.Embedding(10, 4, sparse=True), nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.e(x).mean(1)))


def sparse_traced(num_classes: int = 2) -> nn.Module:
    return _SparseTraced(num_classes)


class _AuxInTraining(nn.Module):
    """Auxiliary outputs in training mode only (as torchvision's GoogLeNet gives; one of them None)."""

    def forward(self, x: torch.Tensor) -> Any:
        return (x, (x * 0.5, None)) if self.training else x


def aux_in_training(num_classes: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, num_classes), _AuxInTraining())


class _AllocatesPerSample(nn.Module):
    """Past 4 samples asks for 4 PiB: the allocator refuses it at once (nothing is allocated)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:
            torch.empty(1 << 50)
        return x


class _FailsPerSample(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:
            raise RuntimeError("a fault of one's own past 4 samples")
        return x


def allocates(num_classes: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), _AllocatesPerSample(), nn.Linear(4, num_classes))


def fails(num_classes: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), _FailsPerSample(), nn.Linear(4, num_classes))


# ---------------------------------------------------------------- models.blocks: segments and cuts


@given(st.integers(-3, 8), st.integers(-3, 8))
def test_a_segment_outside_the_blocks_is_refused(start: int, stop: int) -> None:
    blocks = to_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)))
    if 0 <= start <= stop <= 5:
        seg = segment.make_segment(blocks, start, stop)
        assert (seg.start, seg.stop, list(seg._modules)) == (start, stop, [str(i) for i in range(start, stop)])
    else:
        with pytest.raises(CutError, match=rf"segment \[{start}, {stop}\) is outside the model's 5 blocks"):
            segment.make_segment(blocks, start, stop)


@pytest.mark.parametrize("children", [0, 1])
def test_a_sequential_of_fewer_than_two_children_is_refused(children: int) -> None:
    counted = {0: "0 children", 1: "1 child"}[children]
    with pytest.raises(CutError, match=f"Sequential model has {counted}; it needs at least 2 to be cut: make each "):
        to_blocks(nn.Sequential(*[nn.Linear(4, 4)] * children))


def test_no_cut_at_all_is_refused() -> None:
    with pytest.raises(CutError, match=r"at least one cut is needed \(2 tiers\)"):
        segment.validate_cuts((), 4)


def test_a_model_that_takes_one_batch_size_only_is_still_cut() -> None:
    """Its batch-first check needs a batch of one more sample, which the model refuses: not told, not joined."""
    blocks = to_blocks(nn.Sequential(nn.Linear(4, 4), _OneBatchSize(), nn.Linear(4, 2)))
    joined = tying.join_at_tuples(blocks, torch.randn(2, 4))
    assert [type(m) for m in joined.modules] == [nn.Linear, _OneBatchSize, nn.Linear]


def test_an_empty_parameter_counts_whole_beside_the_rest() -> None:
    empty = torch.empty(0, dtype=torch.float64)
    tied = torch.ones(6)
    assert tying.param_sizes([empty, tied, tied[:3], torch.ones(2, dtype=torch.float64)]) == (8, 6 * 4 + 2 * 8)
    assert tying.param_sizes([empty]) == (0, 0)


def test_a_joined_blocks_data_tie_survives_a_memory_format_change() -> None:
    """``.to(memory_format=...)`` gives each tied weight data of its own (a move, not a cast): the joined
    block views one copy again, so the tie holds (a tier's update to one is the other's)."""
    seq = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(48, 2))
    seq[1].weight.data = seq[0].weight.data
    blocks = to_blocks(seq)
    assert isinstance(blocks.modules[0], tying.Joined)
    joined: Any = blocks.modules[0]
    before = joined[0].weight.detach().clone()
    joined.to(memory_format=torch.channels_last)
    a, b = joined[0].weight, joined[1].weight
    assert torch.equal(a, before) and torch.equal(b, before)
    with torch.no_grad():
        a.add_(1)
    assert torch.equal(b, before + 1)


# ---------------------------------------------------------------- models.blocks: telling values apart


_T = torch.tensor


def _sparse(indices: list[list[int]], values: list[float], size: tuple[int, ...]) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values), size, check_invariants=True)


@pytest.mark.parametrize(("a", "b", "same"), [
    (_T([1.0]), 1.0, False),                                            # a tensor and a number
    (_T([1.0, 2.0]), _T([1.0]), False),                                 # shapes
    (_T([1.0]), _T([1.0], dtype=torch.float64), False),                 # dtypes
    (torch.empty(2, device="meta"), torch.empty(2, device="meta"), True),  # no values to tell apart
    (_T([1, 2]), _T([1, 3]), False),                                    # integers: exactly
    (_T([1.0, math.nan]), _T([1.0, math.nan]), True),                   # NaN where the other has NaN
    (_T([1.0, math.nan]), _T([math.nan, 1.0]), False),
    ({"x": _T([1.0]), "y": 2}, {"x": _T([1.0]), "y": 2}, True),         # mappings, by key
    ({"x": _T([1.0])}, {"x": _T([2.0])}, False),
    ({"x": _T([1.0])}, {"z": _T([1.0])}, False),
    ((_T([1.0]), 2), [_T([1.0]), 2], False),                            # a tuple is no list
    (_sparse([[0, 2]], [1.0, 2.0], (4,)), _sparse([[2, 0]], [2.0, 1.0], (4,)),
     True),                                                             # sparse: by value, not by layout in memory
])
def test_same_is_bitwise_through_containers(a: object, b: object, same: bool) -> None:
    assert check.same_values(a, b) is same
    assert check.same_values(b, a) is same


@pytest.mark.parametrize(("a", "b", "close"), [
    (_T([1.0, 2.0]), _T([1.0, 2.0 + 1e-7]), True),                     # rounding
    (_T([1.0, 2.0]), _T([1.0, 2.01]), False),
    (_T([1.0, math.nan]), _T([1.0, 2.0]), False),                       # NaN where the other has a number
    (_T([1, 2]), _T([1, 3]), False),                                    # integers: exactly
    (_T([1.0]), _T([1.0, 1.0]), False),                                 # shapes
    (_sparse([[0]], [1.0], (3,)), _sparse([[0]], [1.0 + 1e-7], (3,)), True),
    (_sparse([[0]], [1.0], (3,)), _sparse([[0]], [3.0], (3,)), False),
])
def test_close_is_equal_to_rounding_only(a: torch.Tensor, b: torch.Tensor, close: bool) -> None:
    assert check.close_values(a, b) is close


def test_first_line_names_the_type_and_the_first_line_only() -> None:
    assert check._first_line(ValueError()) == "ValueError"
    assert check._first_line(ValueError("  one\ntwo  ")) == "ValueError: one"


# ---------------------------------------------------------------- models.blocks: what draws random numbers


@pytest.mark.parametrize("first", [_Pair, _DictOut])
def test_blocks_that_write_their_input_in_place_draw_nothing(first: type[nn.Module]) -> None:
    """Each run of a block gets a copy of its input (a tuple's or a dict's tensors too): a block that doubles it
    in place gives the same output under both seeds, not twice the first run's."""
    blocks = segment.Blocks([first(), _First()], ["first", "inplace"], traced=False)
    x = torch.randn(2, 4)
    assert check.stochastic_flags(blocks, x) == [False, False]


def test_a_block_that_cannot_run_in_training_counts_as_drawing() -> None:
    blocks = segment.Blocks([nn.Linear(4, 4), _RaisesInTraining()], ["a", "b"], traced=False)
    assert check.stochastic_flags(blocks, torch.randn(2, 4)) == [False, True]


# ---------------------------------------------------------------- models.blocks: a traced model trains as itself


def _check(model: nn.Module, reference: nn.Module, example: torch.Tensor | None = None) -> None:
    check.check_trains_as_model(to_blocks(model), model, reference, torch.randn(2, 4) if example is None else example,
                            "mine")


def test_a_reference_with_a_parameter_the_traced_model_lacks_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"model mine would not train as itself.*the traced model has no "
                                          r"'extra\.weight'"):
        _check(_Two(), _TwoExtra())


def test_a_model_that_outputs_a_tuple_cannot_train_a_step() -> None:
    with pytest.raises(ConfigError, match="model mine cannot train a step on 2 samples: TypeError: the model "
                                          "outputs a tuple$"):
        _check(_TwoTuple(), _TwoTuple())


def test_blocks_that_raise_where_the_model_does_not_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"would not train as itself.*\(its blocks raise RuntimeError: .* in "
                                          r"training step 1\)"):
        _check(_Two(), _TwoOfFlat(), torch.randn(2, 8))


def test_a_buffer_forward_changes_apart_from_its_input_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"would not train as itself.*\(buffer 'count' differs after training "
                                          r"step 1\)"):
        _check(_Counts(), _Counts())


def test_a_traced_model_with_a_sparse_embedding_trains_as_itself() -> None:
    """Before: NotImplementedError ('aten::max' on the SparseCPU backend) from the check itself."""
    torch.manual_seed(0)
    model = _SparseTraced()
    torch.manual_seed(0)
    _check(model, _SparseTraced(), torch.randint(0, 10, (2, 3)))
    spec = resolve_spec(f"{HERE}:sparse_traced", input_shape=(3,), num_classes=2, vocab=10)
    assert template.num_blocks(spec) == 2
    result = verify(spec, cuts=[(1,)], steps=2)
    assert result.ok, result


# ---------------------------------------------------------------- models.blocks: tracing refusals


def test_a_model_traceable_in_training_only_is_refused_as_reading_self_training() -> None:
    with pytest.raises(CutError, match="model _TrainOnlyTraceable reads self.training in forward, "):
        to_blocks(_TrainOnlyTraceable())


@pytest.mark.parametrize(("model", "said"), [
    (_OneOp, r"model _OneOp has 1 operation\(s\): nothing to cut"),
    (_LinearRelu, "model _LinearRelu has no legal cut that leaves parameters on both sides"),
])
def test_a_traced_model_without_two_parts_is_refused(model: type[nn.Module], said: str) -> None:
    with pytest.raises(CutError, match=said):
        to_blocks(model())


def test_a_tracing_failure_in_torch_alone_names_no_line() -> None:
    with pytest.raises(CutError) as e:
        to_blocks(_NoForward())
    assert 'cannot be traced by torch.fx' in str(e.value) and 'missing the required "forward"' in str(e.value)
    assert " (at " not in str(e.value)
    assert str(e.value).endswith('NotImplementedError: Module [_NoForward] is missing the required "forward" function')


def test_a_forward_without_a_signature_is_refused_by_the_tracer() -> None:
    """Its defaults cannot be read: none are taken, and the tracer says what it cannot follow."""
    assert trace._defaults(_BuiltinForward()) == {}
    with pytest.raises(CutError, match="model _BuiltinForward cannot be traced by torch.fx.*Expected FunctionType"):
        to_blocks(_BuiltinForward())


# ---------------------------------------------------------------- profile.profiler: a profile's own checks


def _synthetic(**kw: Any) -> ModelProfile:
    return ModelProfile.synthetic([1.0, 2.0], [4.0, 4.0], [8.0, 8.0], input_bytes=4.0, **kw)


@given(st.one_of(st.integers(max_value=-1), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3)))
def test_a_profile_with_reps_that_are_no_count_is_refused(reps: Any) -> None:
    with pytest.raises(ConfigError, match=r"profile of synthetic: reps must be an integer >= 0, got"):
        dataclasses.replace(_synthetic(), reps=reps)


@pytest.mark.parametrize("bad", [-1.0, math.nan])
@pytest.mark.parametrize("field", ["fwd_flops", "act_bytes", "train_bytes"])
def test_a_profile_with_a_negative_or_nan_entry_is_refused(field: str, bad: float) -> None:
    with pytest.raises(ConfigError, match=f"profile of synthetic: {field} has a negative or NaN entry"):
        dataclasses.replace(_synthetic(), **{field: (1.0, bad)})  # type: ignore[arg-type]


@pytest.mark.parametrize("reach", [(True, True), (True, True, True, True), (True, 1, True)])
def test_a_profile_needs_one_boolean_grad_reach_per_boundary(reach: tuple[Any, ...]) -> None:
    with pytest.raises(ConfigError, match=r"grad_reach needs 3 booleans \(one per boundary\)"):
        dataclasses.replace(_synthetic(), grad_reach=reach)
    assert dataclasses.replace(_synthetic(), grad_reach=(True, False, True)).grad_reach == (True, False, True)


def test_a_profile_of_no_blocks_is_refused() -> None:
    with pytest.raises(ConfigError, match="profile of nothing has no blocks"):
        ModelProfile("nothing", 1, (), 4.0, (), (), (), (), (), ())


def test_a_synthetic_profile_needs_train_bytes_per_block() -> None:
    with pytest.raises(ConfigError, match="train_bytes has 1 entries for 2 blocks"):
        _synthetic(train_bytes=[8.0])


@given(st.integers(max_value=0))
def test_a_batch_below_one_is_refused_before_any_work(batch: int) -> None:
    with pytest.raises(ConfigError, match=f"batch must be >= 1, got {batch}"):
        profile_model(resolve_spec("mlp"), batch=batch)


# ---------------------------------------------------------------- profile.profiler: the user's files in its key


def test_the_installed_folders_are_found_in_an_old_virtualenv_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """An old virtualenv's ``site`` module has no ``getsitepackages`` (which cannot be installed here: taken
    off ``site`` for the test); the standard library and splitfed's folder are still no user's."""
    D._installed_dirs.cache_clear()
    monkeypatch.delattr(site, "getsitepackages")
    try:
        dirs = D._installed_dirs()
        assert not D._is_users_file(D.__file__) and not D._is_users_file(argparse.__file__)
        assert str(Path(D.__file__).resolve().parents[1]) + "/" in dirs
    finally:
        D._installed_dirs.cache_clear()


def test_a_module_entry_without_a_dict_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    class Slotted:
        __slots__ = ()

    monkeypatch.setitem(sys.modules, "gap_slotted_entry", Slotted())
    assert D._user_files({"gap_slotted_entry"}) == []


def test_a_package_path_that_no_finder_can_search_locates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    pkg = types.ModuleType("gap_odd_package")
    pkg.__path__ = ["bad\x00path"]
    monkeypatch.setitem(sys.modules, "gap_odd_package", pkg)
    assert D._locate("gap_odd_package.sub") is None


def test_a_file_that_cannot_be_parsed_or_read_imports_nothing(tmp_path: Path) -> None:
    broken = tmp_path / "broken_helper.py"
    broken.write_text("import os\ndef f(:\n")
    assert D._imports(str(broken), "") == []
    assert D._imports(str(tmp_path / "gone.py"), "") == []
    assert D._file_digest(str(broken)) != ""


def test_what_has_no_source_file_has_no_digest_nor_own_source(tmp_path: Path) -> None:
    assert D._file_digest(len) == ""                          # built in: no source file
    assert D._file_digest(str(tmp_path / "gone.py")) == ""    # no such file
    assert D._own_source(int) == ""                            # built in
    assert D._own_source(nn.Linear) == ""                      # torch's: its version is in the key
    assert D._own_source(_Two) == __file__


# ---------------------------------------------------------------- profile.profiler: measuring


def test_an_output_of_two_tensors_in_training_is_refused_before_it_is_profiled() -> None:
    """A model whose output in training mode is more than its logits (auxiliary outputs, nested, beside a None)
    cannot be trained (the loss takes logits): it is refused before it is profiled, not measured."""
    spec = resolve_spec(f"{HERE}:aux_in_training", input_shape=(4,), num_classes=2)
    with pytest.raises(ConfigError, match="outputs tuple in training mode"):
        profile_model(spec, batch=4, reps=1, use_cache=False)


def test_a_profile_that_runs_out_of_memory_says_so_in_one_line() -> None:
    spec = resolve_spec(f"{HERE}:allocates", input_shape=(4,), num_classes=2)
    with pytest.raises(ConfigError, match=rf"profiling model {HERE}:allocates at batch 8 runs out of memory: "
                                          r".*allocate.*; use a smaller batch$"):
        profile_model(spec, batch=8, reps=1, use_cache=False)


def test_another_runtime_error_while_profiling_is_not_taken_for_memory() -> None:
    spec = resolve_spec(f"{HERE}:fails", input_shape=(4,), num_classes=2)
    with pytest.raises(RuntimeError, match="^a fault of one's own past 4 samples$"):
        profile_model(spec, batch=8, reps=1, use_cache=False)


# ---------------------------------------------------------------- commands: argument types


def _refused(parse: Any, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse(text)
    return str(e.value)


def test_integer_lists_and_shapes() -> None:
    assert _args.int_list("3, 7") == (3, 7)
    assert _refused(_args.int_list, "  ") == "expected at least one integer"
    assert _refused(_args.int_list, "3,,5") == "expected comma-separated integers, got '3,,5'"
    assert _args.shape("3,32,32") == (3, 32, 32)
    assert _refused(_args.shape, "3,0") == "shape dimensions must be positive, got '3,0'"


@given(st.integers(-10**6, 10**6))
def test_positive_int_takes_exactly_the_positive_integers(v: int) -> None:
    if v > 0:
        assert _args.positive_int(str(v)) == v
    else:
        assert _refused(_args.positive_int, str(v)) == f"expected a positive integer, got {v}"


def test_positive_int_refuses_what_is_no_integer() -> None:
    assert _refused(_args.positive_int, "2.5") == "expected a positive integer, got '2.5'"


@given(st.floats(allow_nan=True, allow_infinity=True))
@example(math.inf)
@example(math.nan)
@example(-0.0)
def test_non_negative_float_takes_finite_numbers_from_zero(v: float) -> None:
    if v >= 0 and math.isfinite(v):
        assert _args.non_negative_float(repr(v)) == v
    else:
        assert _refused(_args.non_negative_float, repr(v)).startswith("expected a finite number >= 0, got ")


def test_non_negative_float_refuses_what_is_no_number() -> None:
    assert _refused(_args.non_negative_float, "fast") == "expected a number >= 0, got 'fast'"


def test_a_json_out_that_cannot_be_written_is_refused_when_read(tmp_path: Path) -> None:
    out = _args.json_out("bench.json")
    assert out(str(tmp_path / "new" / "r.json")) == str(tmp_path / "new" / "r.json")
    assert _refused(out, str(tmp_path)) == f"{tmp_path} is a folder: name the JSON file to write, e.g. " \
                                           f"{tmp_path / 'bench.json'}"
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    assert _refused(out, str(afile / "sub" / "r.json")) == f"{afile} is not a folder, so {afile}/sub/r.json " \
                                                           "cannot be written"


def test_a_benchmark_takes_zoo_models_by_name_only() -> None:
    assert _args.zoo_model("mlp") == "mlp"
    said = _refused(_args.zoo_model, "tests.models_audit33:pruned")
    assert said.startswith("unknown model 'tests.models_audit33:pruned': this benchmark takes a zoo model (a "
                           "module:factory model needs an input shape it has no flag for): ")
    assert "mlp" in said and "resnet18" in said


def test_verify_refuses_an_empty_cut_vector(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli_main(["verify", "--model", "mlp", "--cuts", "2,5/"])
    assert e.value.code == 2
    assert "argument --cuts: empty cut vector in '2,5/'" in capsys.readouterr().err


# ---------------------------------------------------------------- simulations.common: config files


@dataclasses.dataclass(frozen=True)
class _Typed:
    maybe: int | None = 0
    either: int | str = 0
    pair: tuple[int, str] = (0, "")
    names: list[str] = dataclasses.field(default_factory=list)
    table: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str = ""


def test_config_values_are_read_as_their_fields_types() -> None:
    cfg = common.config_from_mapping({"maybe": None, "either": "x", "pair": [1, "a"], "names": ["n"],
                                      "table": {"k": 1}, "label": "l"}, _Typed)
    assert cfg == _Typed(None, "x", (1, "a"), ["n"], {"k": 1}, "l")
    assert common.config_from_mapping({"either": 3}, _Typed).either == 3


@pytest.mark.parametrize(("key", "value", "said"), [
    ("maybe", "x", "c: maybe: expected an integer, got 'x'"),
    ("either", 1.5, "c: either: expected an integer, got 1.5"),  # the first of the union's errors
    ("pair", "ab", "c: pair: expected a list, got 'ab'"),
    ("pair", [1], "c: pair: expected 2 values, got 1"),
    ("pair", [1, 2], r"c: pair\[1\]: expected a string, got 2"),
    ("names", ["a", 1], r"c: names\[1\]: expected a string, got 1"),
    ("table", 3, "c: table: expected a table, got 3"),
    ("label", 3, "c: label: expected a string, got 3"),
])
def test_a_config_value_of_another_type_is_refused_naming_the_key(key: str, value: object, said: str) -> None:
    with pytest.raises(ConfigError, match=f"^{said}$"):
        common.config_from_mapping({key: value}, _Typed, "c")


def test_a_training_config_refuses_an_unknown_backend() -> None:
    with pytest.raises(ConfigError, match="^c: backend must be one of flower, inprocess, got 'ray'$"):
        common.config_from_mapping({"backend": "ray"}, common.TrainingConfig, "c")
    with pytest.raises(ConfigError, match="^backend must be one of flower, inprocess, got 'ray'$"):
        common.check_cases([], "ray")


@pytest.mark.parametrize("target", [0.0, -0.5, 1.5])
def test_a_target_accuracy_outside_zero_to_one_is_refused(target: float) -> None:
    with pytest.raises(ValueError, match=rf"target_accuracy must be in \(0, 1\], got {target}"):
        common.check_target(target)
    common.check_target(1.0)


def test_results_hold_dataclasses_paths_and_numpy_values(tmp_path: Path) -> None:
    import json

    path = common.write_json(tmp_path / "r.json", {"cfg": _Typed(label="l"), "where": tmp_path / "x",
                                                   "n": np.int64(3), "v": np.array([1.5, 2.0])})
    got = json.loads(path.read_text())
    assert got["cfg"]["label"] == "l" and got["where"] == str(tmp_path / "x")
    assert got["n"] == 3 and got["v"] == [1.5, 2.0]
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        common.write_json(tmp_path / "bad.json", {"x": object()})


# ---------------------------------------------------------------- simulations.common: the command line


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 1


def _config(tmp_path: Path) -> str:
    p = tmp_path / "c.toml"
    p.write_text("n = 2\n")
    return str(p)


@pytest.mark.parametrize(("stop", "code", "said"), [(KeyboardInterrupt, 130, "interrupted"),
                                                    (Terminated, 143, "terminated")])
def test_an_experiment_stopped_before_its_first_run_points_at_no_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], stop: type[BaseException], code: int, said: str) -> None:
    def experiment(cfg: _Cfg, out: Path) -> dict[str, Any]:
        raise stop()

    out = tmp_path / "out"
    assert common.main("gap", _Cfg, experiment, ["--config", _config(tmp_path), "--out", str(out)]) == code
    err = capsys.readouterr().err
    assert f"simulations.gap: {said}; it keeps no runs to continue from (results.json comes at the end); to " \
           "start again: the same command" in err
    assert "--resume" not in err


def test_an_experiment_runs_outside_the_main_thread_leaving_sigterm_alone(tmp_path: Path) -> None:
    """Signals are the main thread's only (``signal.signal`` raises ValueError elsewhere): an experiment started
    from another thread runs without taking SIGTERM."""
    handler = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def experiment(cfg: _Cfg, out: Path) -> dict[str, Any]:
        seen.append(signal.getsignal(signal.SIGTERM))
        return {"n": cfg.n}

    out = tmp_path / "out"
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(
        common.main("gap", _Cfg, experiment, ["--config", _config(tmp_path), "--out", str(out)])))
    t.start()
    t.join(60)
    assert codes == [0] and seen == [handler]
    assert signal.getsignal(signal.SIGTERM) is handler
    import json

    assert json.loads((out / common.RESULTS).read_text())["n"] == 2
