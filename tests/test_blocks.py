"""Model -> blocks -> segments: legal cuts only, and the blocks compute the model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import fx

from splitfed.errors import ConfigError, CutError
from splitfed.models.blocks import to_blocks
from splitfed.models.segment import make_segment, segment_bounds, validate_cuts
from splitfed.models.zoo import ZOO, build, resolve_spec

SMALL = {"vgg11": {"width": 0.125}, "resnet18": {"width": 8}}


def spec_of(name: str):
    return resolve_spec(name, **SMALL.get(name, {}))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_blocks_compute_the_model(name: str) -> None:
    spec = spec_of(name)
    model = build(spec, seed=1).eval()
    blocks = to_blocks(model)
    assert len(blocks) >= 4
    x = spec.example_input(3)
    with torch.no_grad():
        assert torch.equal(model(x), blocks.whole().eval()(x))
    # every parameter of the model lives in exactly one block
    owned = [id(p) for m in blocks.modules for p in m.parameters()]
    assert sorted(owned) == sorted(id(p) for p in model.parameters())


def test_zoo_has_batchnorm_dropout_layernorm() -> None:
    kinds = set()
    for name in ZOO:
        for m in build(spec_of(name)).modules():
            kinds.add(type(m).__name__)
    assert {"BatchNorm2d", "Dropout", "LayerNorm"} <= kinds


def _modules_of(block: torch.nn.Module) -> set[str]:
    assert isinstance(block, fx.GraphModule)
    return {str(n.target) for n in block.graph.nodes if n.op == "call_module"}


def test_resnet_never_cut_inside_a_residual_block() -> None:
    model = build(spec_of("resnet18"))
    blocks = to_blocks(model)
    assert blocks.traced
    residual_units = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    for unit in residual_units:
        holders = [i for i, b in enumerate(blocks.modules) if any(t.startswith(unit + ".") for t in _modules_of(b))]
        assert len(holders) == 1, f"{unit} is split over blocks {holders}"
    # and the cuts between units are offered
    assert len(blocks) >= 10


def test_user_residual_model_keeps_its_unit_whole() -> None:
    spec = resolve_spec("tests.models_for_tests:residual", input_shape=(6,), num_classes=3)
    blocks = to_blocks(build(spec))
    unit_blocks = [i for i, b in enumerate(blocks.modules) if _modules_of(b) & {"unit_a", "unit_b"}]
    assert len(unit_blocks) == 1
    assert len(blocks) == 3  # stem | unit | head


def test_model_with_no_legal_cut_is_refused() -> None:
    spec = resolve_spec("tests.models_for_tests:skip_all", input_shape=(4,), num_classes=4)
    with pytest.raises(CutError, match="no legal cut"):
        to_blocks(build(spec))


def test_multi_input_model_is_refused() -> None:
    spec = resolve_spec("tests.models_for_tests:two_inputs", input_shape=(4,), num_classes=4)
    with pytest.raises(CutError, match="2 inputs"):
        to_blocks(build(spec))


def test_factory_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_spec("no_such_pkg.mod:f", input_shape=(3,))
    with pytest.raises(ConfigError, match="has no attribute"):
        resolve_spec("tests.models_for_tests:nope", input_shape=(3,))
    with pytest.raises(ConfigError, match="not torch.nn.Module"):
        build(resolve_spec("tests.models_for_tests:not_a_module", input_shape=(3,)))
    with pytest.raises(ConfigError, match="input-shape"):
        resolve_spec("tests.models_for_tests:residual")
    with pytest.raises(ConfigError, match="unknown model"):
        resolve_spec("lenet9000")


@pytest.mark.parametrize("cuts,match", [((3, 2), "non-decreasing"), ((1, 99), "out of range"),
                                        ((-1, 2), "out of range"), ((1,), "need 2 cut")])
def test_illegal_cuts(cuts: tuple[int, ...], match: str) -> None:
    with pytest.raises(CutError, match=match):
        validate_cuts(cuts, 7, tiers=3)


@given(n=st.integers(1, 30), data=st.data(), u=st.booleans())
def test_segment_bounds_partition_the_blocks(n: int, data: st.DataObject, u: bool) -> None:
    k = data.draw(st.integers(1, 4))
    cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=k, max_size=k)))
    bounds = segment_bounds(cuts, n, u_shape=u)
    covered = [i for a, z in bounds for i in range(a, z)]
    assert covered == list(range(n))
    assert len(bounds) == len(cuts) + 1 + (0 if not u else 0)


def test_segment_keys_are_global_block_indices() -> None:
    blocks = to_blocks(build(spec_of("cnn")))
    seg = make_segment(blocks, 2, 6)
    assert {k.split(".")[0] for k in seg.state_dict()} == {"2", "5"}  # 3, 4 have no state
    assert set(seg.state_dict()) <= set(blocks.whole().state_dict())
