"""Review of the session's transport changes, each reproduced against a real tier on 127.0.0.1:

1. the bound on what a tier's Describe reports as its largest tensor (an int64) was put on ``splitfed tier
   --max-tensor-mb`` only: a tier served with ``wire.Limits(max_tensor_bytes=2**63)`` failed every Describe
   ("Exception calling application: Value out of range"), though no tensor above ``Limits.stream_bytes`` can
   reach it anyway;
2. a backward may now carry no gradient, yet one carrying two tensors was refused as if it needed exactly one.
"""

from __future__ import annotations

import grpc
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.transport import codec as tc
from splitfed.transport import wire
from splitfed.transport.client import GrpcTierClient
from splitfed.transport.pb import method, pb
from splitfed.transport.server import serve_tier


@settings(max_examples=4, deadline=None)
@given(extra=st.sampled_from([0, 1, 1 << 40, (1 << 63) - (1 << 36), 1 << 63, 1 << 70]))
def test_a_tier_describes_itself_whatever_its_tensor_limit(extra: int) -> None:
    """Describe says the largest tensor the tier takes: its limit, or what one call's frames carry if less."""
    lim = wire.Limits()
    lim = wire.Limits(max_tensor_bytes=lim.stream_bytes + extra)
    with serve_tier("edge", insecure=True, limits=lim) as srv, \
            GrpcTierClient(srv.address, retries=0, insecure=True) as c:
        assert c.describe(shallow=True).max_tensor_bytes == lim.stream_bytes
    small = wire.Limits(max_tensor_bytes=4096)
    with serve_tier("edge", insecure=True, limits=small) as srv, \
            GrpcTierClient(srv.address, retries=0, insecure=True) as c:
        assert c.describe(shallow=True).max_tensor_bytes == 4096


def test_a_backward_with_two_tensors_is_refused_saying_it_carries_at_most_one() -> None:
    """A backward carries the gradient or none; the refusal said it must carry exactly one."""
    head = pb.StepHeader(run_id="run", client_id="a", round=0, seq=0, phase=pb.PHASE_BACKWARD)
    t = tc.encode(torch.zeros(2, 3), tc.NONE)
    frames = list(wire.iter_frames(head, [("", t), ("", t)], 1 << 20))
    with serve_tier("cloud", insecure=True) as srv, grpc.insecure_channel(srv.address) as ch:
        call = ch.stream_stream(method("StepStream"))
        with pytest.raises(grpc.RpcError) as e:
            list(call(iter(frames), timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == ("PHASE_BACKWARD carries at most 1 tensor(s) (gradient; none: no gradient reached "
                                 "the forward's output), got 2")

