"""A process refuses to build a model it could never hold, before allocating any of it."""

from __future__ import annotations

import pytest

from splitfed.engine import template
from splitfed.engine.limits import DEFAULT_LIMITS, BuildLimits, set_limits
from splitfed.engine.rounds import initial_state, select
from splitfed.engine.tier import Tier
from splitfed.engine.types import SegmentLoad
from splitfed.errors import ConfigError, ResourceExhausted
from splitfed.models.zoo import resolve_spec


def test_sizes_are_measured_without_building() -> None:
    params, peak = template.size(resolve_spec("vgg11"))
    assert params == 4 * sum(p.numel() for p in template.template(resolve_spec("vgg11")).whole().parameters())
    assert peak > 0
    # 10^5-wide resnet18: ~10^8 MiB of parameters; sized in well under a second, nothing allocated
    huge, _ = template.size(resolve_spec("resnet18", width=100_000))
    assert huge > 1e14


@pytest.mark.parametrize(("spec", "what"), [
    (resolve_spec("resnet18", width=100_000), r"^model 'resnet18' \{'width': 100000\} has [\d,]+ MiB of parameters"),
    (resolve_spec("vgg11", input_shape=(3, 2048, 2048)), "MiB tensor per sample"),
])
def test_a_tier_refuses_a_model_too_large_to_hold(spec, what) -> None:  # type: ignore[no-untyped-def]
    tier = Tier("edge")
    with pytest.raises(ResourceExhausted, match=what):
        tier.load(SegmentLoad("r", "c", 1, spec, 0, 1, "c", None))
    assert not tier._bindings  # nothing half-done
    ok = resolve_spec("vgg11", width=0.125)
    tier.load(SegmentLoad("r", "c", 1, ok, 0, 1, "c", select(initial_state(ok, 0), 0, 1)))
    assert tier._bindings


def test_over_grpc_the_refusal_is_resource_exhausted_and_the_tier_keeps_serving() -> None:
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.server import serve_tier

    ok = resolve_spec("vgg11", width=0.125)
    with serve_tier("edge", insecure=True) as server, GrpcTierClient(server.address, insecure=True) as client:
        with pytest.raises(ResourceExhausted, match="MiB of parameters"):
            client.load(SegmentLoad("r", "big", 1, resolve_spec("resnet18", width=100_000), 0, 1, "big", None))
        client.load(SegmentLoad("r", "c", 1, ok, 0, 1, "c", select(initial_state(ok, 0), 0, 1)))
        assert set(client.fetch("r", "c")) == set(select(initial_state(ok, 0), 0, 1))


@pytest.fixture
def restore_limits():  # type: ignore[no-untyped-def]
    yield
    set_limits(DEFAULT_LIMITS)


def test_lowered_limits_apply_to_zoo_models_and_to_models_built_before(restore_limits) -> None:  # type: ignore[no-untyped-def]
    vgg = resolve_spec("vgg11")  # 35 MiB of parameters
    template.template(vgg)  # built (and cached) under the default limits
    set_limits(BuildLimits(model_bytes=1 << 20))
    tier = Tier("edge")
    with pytest.raises(ResourceExhausted, match=r"^model 'vgg11' has 35.2 MiB of parameters; this process builds at "
                                                r"most 1 MiB$"):  # before: two spaces after the name
        tier.load(SegmentLoad("r", "c", 1, vgg, 0, 1, "c", None))
    assert not tier._bindings
    small = resolve_spec("vgg11", width=0.125)  # 0.56 MiB
    tier.load(SegmentLoad("r", "c", 1, small, 0, 1, "c", select(initial_state(small, 0), 0, 1)))
    assert tier._bindings


def test_limits_refuse_impossible_values() -> None:
    with pytest.raises(ConfigError, match="sample_bytes must be positive, got 0"):
        BuildLimits(sample_bytes=0)
    with pytest.raises(ConfigError, match="model_bytes must be positive, got -1"):
        BuildLimits(model_bytes=-1)
    with pytest.raises(ConfigError, match=r"held_bytes must be >= 0 \(0: three quarters"):
        BuildLimits(held_bytes=-1)
    # the smallest of each is taken (a byte: a bound that refuses every model is the user's to set)
    one = BuildLimits(model_bytes=1, sample_bytes=1, held_bytes=0)
    assert (one.model_bytes, one.sample_bytes, one.held_bytes) == (1, 1, 0)


def test_a_tier_process_takes_its_limits_from_the_command_line() -> None:
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.process import TierProcess

    small = resolve_spec("vgg11", width=0.125)
    with TierProcess.start("edge", insecure=True, extra_args=["--max-model-mb", "1"]) as edge, \
            GrpcTierClient(edge.address, insecure=True) as client:
        with pytest.raises(ResourceExhausted, match="this process builds at most 1 MiB"):
            client.load(SegmentLoad("r", "big", 1, resolve_spec("vgg11"), 0, 1, "big", None))
        client.load(SegmentLoad("r", "c", 1, small, 0, 1, "c", select(initial_state(small, 0), 0, 1)))
        assert set(client.fetch("r", "c")) == set(select(initial_state(small, 0), 0, 1))
