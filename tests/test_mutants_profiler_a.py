"""Parts of ``splitfed.profile.profiler`` that a mutation run found unpinned (its first half, up to the profile
key): a profile's refusal of a ``reps`` that is no count, this host's training FLOP/s (``host_flops``: total work
over total measured seconds, None without either), a synthetic profile's batch of 1, the bounds of the triples
``shared_act``, ``input_kept``, ``out_kept`` and ``out_views`` accept at their edges (zero bytes, fractional bytes,
a block that keeps nothing, the last boundary), and the profile key of a user's model (``code_digest``): empty
for a zoo model, following the file the user names even when its factory object is defined in another, and
working for a factory with no module (a notebook cell). Expected values are worked out here by hand."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from splitfed.errors import ConfigError
from splitfed.models.zoo import resolve_spec
from splitfed.profile import ModelProfile
from splitfed.profile.digest import code_digest

# two blocks: per-sample FLOPs, bytes; fixed bytes are not what these tests look at
NAMES = ("a", "b")
FWD, BWD = (10.0, 30.0), (20.0, 60.0)
PARAM, OUT, ACT, FIXED = (5.0, 50.0), (8.0, 80.0), (12.0, 120.0), (100.0, 1000.0)


def _profile(batch: int = 1, **kw: object) -> ModelProfile:
    return ModelProfile("m", batch, NAMES, 4.0, FWD, BWD, PARAM, OUT, ACT, FIXED, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- reps


@pytest.mark.parametrize("reps", [-1, "3", 2.0, None])
def test_reps_that_are_not_a_count_are_refused_even_when_not_a_bool(reps: object) -> None:
    """Each of the three conditions refuses on its own: a negative integer, a string, a float, None (none of them
    a bool, which the first condition catches)."""
    with pytest.raises(ConfigError, match=r"^profile of m: reps must be an integer >= 0, got "
                                          + re.escape(repr(reps)) + "$"):
        _profile(reps=reps)


def test_zero_reps_and_a_positive_count_are_accepted() -> None:
    assert _profile(reps=0).reps == 0
    assert _profile(reps=5).reps == 5


# ---------------------------------------------------------------- host_flops


def test_host_flops_is_the_whole_models_training_work_over_its_measured_seconds() -> None:
    """Work: (10 + 30 forward + 20 + 60 backward) FLOP/sample x batch 4 = 480 FLOP; time: 1 + 2 forward + 3 + 6
    backward = 12 s (backward longer than forward, as usual): 40 FLOP/s."""
    prof = _profile(batch=4, fwd_s=(1.0, 2.0), bwd_s=(3.0, 6.0))
    assert prof.host_flops() == pytest.approx(40.0, rel=1e-12)


def test_host_flops_counts_fractions_of_a_flop_and_of_a_second() -> None:
    """Work below one FLOP and time below one second are still a rate: 0.5 FLOP in 0.25 s = 2 FLOP/s."""
    prof = ModelProfile("m", 1, ("a",), 4.0, (0.25,), (0.25,), (0.0,), (1.0,), (1.0,), (0.0,),
                        fwd_s=(0.125,), bwd_s=(0.125,))
    assert prof.host_flops() == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize(("fwd_s", "bwd_s"), [((), ()), ((0.0, 0.0), (0.0, 0.0))])
def test_host_flops_is_none_without_measured_time(fwd_s: tuple, bwd_s: tuple) -> None:
    """No time (not measured, or measured as 0): no rate, not a division by zero."""
    assert _profile(fwd_s=fwd_s, bwd_s=bwd_s).host_flops() is None


def test_host_flops_is_none_for_a_model_with_no_work() -> None:
    """A model of only pooling and activations costs ~0 FLOPs: no rate (not 0 FLOP/s) however long it took."""
    prof = ModelProfile("m", 8, ("pool",), 4.0, (0.0,), (0.0,), (0.0,), (1.0,), (1.0,), (0.0,),
                        fwd_s=(1.0,), bwd_s=(1.0,))
    assert prof.host_flops() is None


# ---------------------------------------------------------------- synthetic


def test_a_synthetic_profile_is_per_sample_with_a_batch_of_one() -> None:
    """Its FLOPs are per sample, and its batch is 1: the training work host_flops sees is one sample's."""
    prof = ModelProfile.synthetic([3.0, 5.0], [1.0, 1.0], [0.0, 0.0], input_bytes=1.0)
    assert prof.batch == 1
    prof = dataclasses.replace(prof, fwd_s=(1.0, 1.0), bwd_s=(1.0, 1.0))
    assert prof.host_flops() == pytest.approx((3 + 5 + 6 + 10) / 4.0, rel=1e-12)


# ---------------------------------------------------------------- the triples at their edges


@pytest.mark.parametrize("shared", [0.0, 0.5])
def test_shared_act_accepts_zero_and_fractional_bytes(shared: float) -> None:
    """Bytes per sample are >= 0, not >= 1: a shared tensor of no bytes, or of half a byte per sample."""
    prof = _profile(shared_act=((0, 1, shared),), grad_shared_act=((-1, 0, shared),))
    assert prof.shared_act == ((0, 1, shared),)
    assert prof.grad_shared_act == ((-1, 0, shared),)


def test_shared_act_is_refused_past_a_blocks_activation_bytes() -> None:
    with pytest.raises(ConfigError, match="shared_act exceeds a block's activation bytes"):
        _profile(shared_act=((0, 1, 120.0 * 1.001),))
    assert _profile(shared_act=((0, 1, 120.0),)).shared_act == ((0, 1, 120.0),)


@pytest.mark.parametrize("kept", [0.0, 0.5, 12.0])
def test_input_kept_accepts_zero_fractional_and_all_of_a_blocks_bytes(kept: float) -> None:
    assert _profile(input_kept=((0, 0, kept),)).input_kept == ((0, 0, kept),)


def test_input_kept_of_nothing_by_a_block_that_keeps_nothing_is_accepted() -> None:
    """A block that keeps no activation (act 0) keeps 0 bytes of its tier's input: 0 <= 0 <= 0."""
    prof = ModelProfile("m", 1, NAMES, 4.0, FWD, BWD, PARAM, OUT, (0.0, 120.0), FIXED, input_kept=((0, 0, 0.0),))
    assert prof.input_kept == ((0, 0, 0.0),)


@pytest.mark.parametrize("field", ["out_kept", "out_views"])
@pytest.mark.parametrize("kept", [0.0, 0.5, 80.0])
def test_out_kept_and_out_views_accept_the_last_boundary_and_any_bytes_up_to_it(field: str, kept: float) -> None:
    """k runs up to the number of blocks (the model's output, boundary 2 here), and the bytes from 0 (fractions
    included) to the boundary's bytes."""
    prof = _profile(**{field: ((2, 0, kept),)})
    assert getattr(prof, field) == ((2, 0, kept),)


@pytest.mark.parametrize("field", ["out_kept", "out_views"])
def test_out_kept_and_out_views_refuse_a_boundary_past_the_last(field: str) -> None:
    with pytest.raises(ConfigError, match=f"{field} entry \\(3, 0, 1.0\\) is not \\(k, j, bytes\\) with 1 <= k <= 2"):
        _profile(**{field: ((3, 0, 1.0),)})


@pytest.mark.parametrize("field", ["out_kept", "out_views"])
def test_out_kept_of_nothing_at_a_boundary_of_no_bytes_is_accepted(field: str) -> None:
    """A block whose output has no bytes (an empty tensor): 0 bytes of it kept, 0 <= 0 <= 0."""
    prof = ModelProfile("m", 1, NAMES, 4.0, FWD, BWD, PARAM, (0.0, 80.0), ACT, FIXED, **{field: ((1, 0, 0.0),)})
    assert getattr(prof, field) == ((1, 0, 0.0),)


# ---------------------------------------------------------------- code_digest


def test_a_zoo_models_code_digest_is_the_empty_string() -> None:
    """A zoo model is splitfed's code: its digest is "" (a str, as typed), and its key has no "code"."""
    assert code_digest(resolve_spec("mlp", input_shape=(8,), num_classes=3)) == ""


MAKER = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.act = act

    def forward(self, x):
        return self.act(self.a(x))


class Maker:
    def __init__(self, act):
        self.act = act

    def __call__(self):
        return Net(self.act)
"""
ENTRY = """\
from {maker} import Maker


def act(x):
    return {body}


make = Maker(act)
"""



def test_the_key_follows_the_named_module_when_its_factory_object_comes_from_another(
        tag: str, tmp_path: Path) -> None:
    """``entry:make`` is a factory object of a class in ``maker``, given a function of ``entry``'s own that the
    model's forward calls: the module the user names (the part before the colon) is in the key, so an edit to
    that function makes a new key (the model's structure is the same)."""
    maker, entry = f"maker_{tag}", f"entry_{tag}"
    (tmp_path / f"{maker}.py").write_text(MAKER)
    (tmp_path / f"{entry}.py").write_text(ENTRY.format(maker=maker, body="x.relu()"))
    spec = resolve_spec(f"{entry}:make", input_shape=(4,), num_classes=4)
    first = code_digest(spec)
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert code_digest(spec) == first  # stable while nothing changes
    (tmp_path / f"{entry}.py").write_text(ENTRY.format(maker=maker, body="x.relu() * 2"))
    assert code_digest(spec) != first


def test_the_key_of_a_factory_with_no_module_is_made(tag: str) -> None:
    """A function made in a namespace without ``__name__`` (a notebook cell exec'd, ``eval``) has no module
    (``__module__`` is None): the key is made from the module named and the model, not refused with a crash."""
    namespace: dict = {}
    exec("from torch import nn\ndef cell():\n    return nn.Sequential(nn.Linear(6, 3))\n", namespace)  # noqa: S102
    assert namespace["cell"].__module__ is None
    name = f"cell_{tag}"
    sys.modules[name] = type(sys)(name)
    sys.modules[name].cell = namespace["cell"]  # type: ignore[attr-defined]
    digest = code_digest(resolve_spec(f"{name}:cell", input_shape=(6,), num_classes=3))
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
