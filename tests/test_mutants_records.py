"""The typed Flower records (splitfed.flower.records): what a user or the optimizer reads from them, the
defaults an older node's record takes when it leaves a key out, and the refusals, pinned on real Flower
ConfigRecords / MetricRecords (found by mutation testing)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from flwr.app import ConfigRecord, MetricRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from splitfed.engine.types import OptimConfig
from splitfed.errors import ConfigError
from splitfed.flower.records import NodeInfo, TrainInstruction, TrainReport
from splitfed.models.zoo import ModelSpec, resolve_spec
from splitfed.profile.devices import LinkProfile
from splitfed.profile.fleet import MAX_SAMPLES

SPEC = resolve_spec("cnn")


def _instruction(**kw: object) -> TrainInstruction:
    base: dict[str, object] = dict(run_id="run", round=1, client_id="client0", cuts=(1, 3), mode="sflv1",
                                   u_shape=False, model=SPEC, optim=OptimConfig(), seed=0, dataset="digits",
                                   partition="iid", batch_size=8, local_epochs=1, edge_address="x:1")
    base.update(kw)
    return TrainInstruction(**base)  # type: ignore[arg-type]


def _with(rec: ConfigRecord, **values: object) -> ConfigRecord:
    """The record with keys (``_`` written ``-``) set to values (None: left out)."""
    d = dict(rec)
    for k, v in values.items():
        key = k.replace("_", "-")
        if v is None:
            d.pop(key, None)
        else:
            d[key] = v
    return ConfigRecord(d)  # type: ignore[arg-type]


# ---------------------------------------------------------------- TrainInstruction


def test_instruction_defaults_when_an_older_server_leaves_keys_out():
    """The server's instruction never sets deadline_s: every node's tier deadline is this 60 s default."""
    assert _instruction().deadline_s == 60.0
    assert _instruction().to_record()["deadline-s"] == 60.0
    rec = _with(_instruction(deadline_s=5.0, measure_speed=True).to_record(), deadline_s=None, measure_speed=None)
    ins = TrainInstruction.from_record(rec)
    assert ins.deadline_s == 60.0
    assert ins.measure_speed is False


def test_instruction_deadline_must_be_positive():
    for bad in (0.0, 0, -1.0):
        with pytest.raises(ConfigError, match="deadline-s must be > 0"):
            TrainInstruction.from_record(_with(_instruction().to_record(), deadline_s=bad))
    for good in (0.5, 1e-3, 1, 600.0):  # under a second is a deadline too
        assert TrainInstruction.from_record(_with(_instruction().to_record(), deadline_s=good)).deadline_s == good


def test_instruction_deadline_must_be_finite():
    with pytest.raises(ConfigError, match="deadline-s must be a finite number"):
        TrainInstruction.from_record(_with(_instruction().to_record(), deadline_s=math.inf))


def test_instruction_integer_fields_refuse_fractions():
    with pytest.raises(ConfigError, match="seed must be an integer, got 1.5"):
        TrainInstruction.from_record(_with(_instruction().to_record(), seed=1.5))
    with pytest.raises(ConfigError, match="seed must be an integer"):
        TrainInstruction.from_record(_with(_instruction().to_record(), seed="3"))


def test_instruction_cuts_must_be_integers():
    for bad in ([1.5, 3.0], [1.0, 3.0]):
        with pytest.raises(ConfigError, match="cuts must be a list of integers"):
            TrainInstruction.from_record(_with(_instruction().to_record(), cuts=bad))
    assert TrainInstruction.from_record(_with(_instruction().to_record(), cuts=[2, 2])).cuts == (2, 2)


def test_equal_instructions_make_identical_records():
    """Messages are reproducible: a model's kwargs travel ordered by key, whatever order they were given in."""
    a = ModelSpec("cnn", (1, 8, 8), 10, kwargs={"width": 4, "act": "relu"})
    b = ModelSpec("cnn", (1, 8, 8), 10, kwargs={"act": "relu", "width": 4})
    assert a == b
    assert _instruction(model=a).to_record()["model"] == _instruction(model=b).to_record()["model"]


# ---------------------------------------------------------------- TrainReport


def _report(**kw: object) -> TrainReport:
    base: dict[str, object] = dict(samples=40, steps=3, loss=0.5, correct=30, compute_s=0.2, link_s=0.3,
                                   bytes_up=1000, bytes_down=900)
    base.update(kw)
    return TrainReport(**base)  # type: ignore[arg-type]


def _metrics(rep: TrainReport, **values: object) -> MetricRecord:
    d = dict(rep.to_record())
    for k, v in values.items():
        key = "num-examples" if k == "samples" else k.replace("_", "-")
        if v is None:
            d.pop(key, None)
        else:
            d[key] = v
    return MetricRecord(d)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(up=st.integers(0, 10**12), down=st.integers(0, 10**12), link_s=st.floats(1e-6, 1e6))
def test_throughput_is_bytes_both_ways_per_link_second(up, down, link_s):
    rep = _report(bytes_up=up, bytes_down=down, link_s=link_s)
    assert rep.throughput == (up + down) / link_s
    assert rep.to_record()["throughput"] == (up + down) / link_s


def test_throughput_exact_and_zero_without_link_time():
    assert _report(bytes_up=1000, bytes_down=500, link_s=0.5).throughput == 3000.0
    assert _report(bytes_up=1000, bytes_down=500, link_s=0.0).throughput == 0.0


def test_report_rtt_parsing():
    rep = _report(rtt_ms=12.5)
    assert TrainReport.from_record(_metrics(rep)).rtt_ms == 12.5  # a fraction of a ms is a measure
    assert TrainReport.from_record(_metrics(rep, rtt_ms=0.0)).rtt_ms == 0.0  # a loopback edge: 0 ms
    assert TrainReport.from_record(_metrics(rep, rtt_ms=0.5)).rtt_ms == 0.5
    assert TrainReport.from_record(_metrics(rep, rtt_ms=None)).rtt_ms == -1.0  # an older node: not measured
    assert TrainReport.from_record(_metrics(rep, rtt_ms=-3.0)).rtt_ms == -1.0


def test_report_speed_defaults_when_left_out():
    rep = _report(speed_blocks=2, speed_samples=32, speed_s=0.25)
    assert TrainReport.from_record(_metrics(rep)).speed is not None
    got = TrainReport.from_record(_metrics(rep, speed_blocks=None, speed_samples=None, speed_s=None))
    assert (got.speed_blocks, got.speed_samples, got.speed_s, got.speed) == (0, 0, 0.0, None)


def test_report_loss_zero_is_a_loss():
    assert TrainReport.from_record(_metrics(_report(loss=0.0))).loss == 0.0
    with pytest.raises(ConfigError, match="loss must be >= 0"):
        TrainReport.from_record(_metrics(_report(), loss=-0.5))


def test_report_samples_steps_and_correct_must_agree():
    ok = [dict(samples=0, steps=0, correct=0), dict(samples=1, steps=1, correct=1),
          dict(samples=40, steps=3, correct=40), dict(samples=1, steps=5, correct=0)]
    for kw in ok:
        assert TrainReport.from_record(_metrics(_report(), **kw)) == _report(**kw)
    bad = [dict(samples=0, steps=1, correct=0), dict(samples=5, steps=0, correct=0),
           dict(samples=1, steps=0, correct=0), dict(samples=0, steps=1, correct=0),
           dict(samples=40, steps=3, correct=41), dict(samples=1, steps=1, correct=2)]
    for kw in bad:
        with pytest.raises(ConfigError, match="no round trains so"):
            TrainReport.from_record(_metrics(_report(), **kw))


def test_report_malformed_value_is_a_config_error():
    with pytest.raises(ConfigError, match="train report: malformed"):
        TrainReport.from_record(_metrics(_report(), loss=[0.5, 0.5]))


# ---------------------------------------------------------------- NodeInfo


def test_node_info_defaults_when_an_older_node_leaves_keys_out():
    got = NodeInfo.from_record(ConfigRecord({"partition-id": 3, "num-partitions": 10}))
    assert (got.partition_id, got.num_partitions, got.samples, got.profile, got.edge_address) == (3, 10, 0, "", "")
    assert (got.up_mbps, got.down_mbps, got.rtt_ms, got.protocol, got.version, got.link_error) == (
        0.0, 0.0, 0.0, 0, "", "")
    assert (got.speed_blocks, got.speed_samples, got.speed_s, got.speed_error, got.own_data) == (0, 0, 0.0, "", False)
    assert got.link is None and got.speed is None


def test_node_info_link_left_out_keys():
    """A node that sends its up and down rates but no rtt: 0 ms; one that leaves either rate out: no link."""
    full = NodeInfo(3, 10, 144, up_mbps=8.0, down_mbps=16.0, rtt_ms=20.0).to_record()
    assert NodeInfo.from_record(_with(full, rtt_ms=None)).link == LinkProfile(1e6, 2e6, 0.0)
    assert NodeInfo.from_record(_with(full, up_mbps=None)).link is None
    assert NodeInfo.from_record(_with(full, down_mbps=None)).link is None


def test_node_info_own_data_only_when_said_true():
    rec = NodeInfo(3, 10, own_data=True).to_record()
    assert NodeInfo.from_record(rec).own_data is True
    assert NodeInfo.from_record(_with(rec, own_data=None)).own_data is False


@settings(max_examples=60, deadline=None)
@given(up=st.floats(1e-6, 1e9), down=st.floats(1e-6, 1e9), rtt=st.floats(0.0, 1e7))
def test_node_info_link_in_cost_model_units(up, down, rtt):
    link = NodeInfo.from_record(NodeInfo(0, 1, up_mbps=up, down_mbps=down, rtt_ms=rtt).to_record()).link
    assert link == LinkProfile(up * 1e6 / 8, down * 1e6 / 8, rtt / 1e3)


def test_node_info_link_exact_and_slow_links_count():
    assert NodeInfo(0, 1, up_mbps=8.0, down_mbps=80.0, rtt_ms=20.0).link == LinkProfile(1e6, 1e7, 0.02)
    # under 1 Mbit/s is a (slow) link, not "not measured"
    assert NodeInfo(0, 1, up_mbps=0.5, down_mbps=0.25, rtt_ms=300.0).link == LinkProfile(62500.0, 31250.0, 0.3)
    for up, down in ((0.0, 8.0), (8.0, 0.0), (-1.0, 8.0), (8.0, -1.0)):
        assert NodeInfo(0, 1, up_mbps=up, down_mbps=down, rtt_ms=20.0).link is None


def test_node_info_samples_bounds_exact():
    for ok in (0, 1, MAX_SAMPLES):
        assert NodeInfo.from_record(NodeInfo(0, 1, samples=ok).to_record()).samples == ok
    for bad in (-1, MAX_SAMPLES + 1):
        with pytest.raises(ConfigError, match="samples must be in 0.."):
            NodeInfo.from_record(NodeInfo(0, 1, samples=bad).to_record())


# ---------------------------------------------------------------- frozen


@pytest.mark.parametrize("value", [_instruction(), _report(), NodeInfo(0, 1)], ids=lambda v: type(v).__name__)
def test_records_are_frozen(value):
    name = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, name, getattr(value, name))
