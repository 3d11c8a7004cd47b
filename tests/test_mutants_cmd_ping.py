"""What ``splitfed ping`` promises that the mutation run of ``splitfed/commands/ping.py`` found unpinned.

Its help starts with the module's first paragraph; a ping without ``--count`` or ``--timeout`` times 5 round
trips and waits 10 s; a bad ``--compress``, a ``--fleet-entry`` name with a space (or none), and a
``--fleet-entry`` with two addresses are refused (exit 2) before any tier is asked, while a chain of two
addresses without ``--fleet-entry`` is checked; only a chain of several tiers that all answered gets its
``chain: A -> B ok`` line; a forwarding tier says where it forwards and the last that it ends the chain; a
tier that would not build ``--model`` says so, and one that would says nothing of it; ``--json`` is indented
by 2; ``--fleet-entry``'s training rate is the fastest of 7 single passes on a batch of 32, from a profile
already cached however few reps timed it. The tiers are real (``serve_tier`` on 127.0.0.1), in process.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from splitfed import cli
from splitfed.transport.server import serve_tier


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed: asking it would fail late


@pytest.fixture
def chain() -> Iterator[tuple[str, str]]:
    """An edge forwarding to a cloud, both in process on 127.0.0.1."""
    with serve_tier("cloud", insecure=True) as cloud, \
            serve_tier("edge", next_address=cloud.address, insecure=True) as edge:
        yield edge.address, cloud.address


# ---------------------------------------------------------------- the command line

def test_the_help_describes_the_command_with_the_modules_first_paragraph(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["ping", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "splitfed ping ADDRESS...: reach tier servers, print what each is, and check them as a chain." in out
    assert "For each address" not in out  # the second paragraph is the module's, not the help's
    assert "a batch of 32 on one thread, the fastest of 7 passes" in out  # what training_rate does (below)


def test_without_count_and_timeout_a_ping_times_5_round_trips_and_waits_10_s(
        chain: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """As ``--count``'s help says (default 5), and ``--timeout``'s 10 s for each tier."""
    from splitfed.transport import probe

    seen: list[tuple[int, float]] = []
    real = probe.measure_link

    def spy(client: Any, count: int, timeout: float, **kw: Any) -> Any:
        seen.append((count, timeout))
        return real(client, count, timeout, **kw)

    monkeypatch.setattr(probe, "measure_link", spy)
    assert cli.main(["ping", chain[1]]) == 0
    assert seen == [(5, 10.0)]
    assert cli.main(["ping", chain[1], "--count", "2", "--timeout", "3"]) == 0
    assert seen[1:] == [(2, 3.0)]
    capsys.readouterr()


@pytest.mark.parametrize("extra, why", [
    (["--compress", "zip"], "unknown codec 'zip'"),
    (["--fleet-entry", "my box"], "without spaces, got 'my box'"),
    (["--fleet-entry", ""], "must be non-empty, without spaces, got ''"),
    # before: ignored without a model to shape, and the ping said nothing of them
    (["--model-kwargs", '{"width": 4}'], "--model-kwargs shapes the model of --model (or the one --fleet-entry "
                                         "times): give --model NAME, or leave it out"),
    (["--input-shape", "1,8,8", "--num-classes", "4"], "--input-shape, --num-classes shape the model of --model"),
], ids=["codec", "spaced_name", "empty_name", "kwargs_without_model", "shape_without_model"])
def test_bad_flags_are_refused_before_any_tier_is_asked(extra: list[str], why: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Refused input (exit 2, its reason), not a tier that did not answer (exit 1, ``no answer``)."""
    assert cli.main(["ping", _closed_port(), *extra, "--timeout", "2", "--count", "1"]) == 2
    out, err = capsys.readouterr()
    assert why in err and "no answer" not in out + err, (out, err)


def test_a_fleet_entry_takes_one_address_and_a_chain_of_two_without_one_is_checked(
        chain: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    edge, cloud = chain
    assert cli.main(["ping", _closed_port(), _closed_port(), "--fleet-entry", "box", "--timeout", "2"]) == 2
    assert "--fleet-entry measures this host's link to its edge: give exactly one address" in capsys.readouterr().err
    assert cli.main(["ping", edge, cloud, "--count", "1"]) == 0
    out, err = capsys.readouterr()
    assert "chain: edge -> cloud ok" in out and err == ""


# ---------------------------------------------------------------- what it prints

def test_a_chain_of_two_says_who_forwards_where_and_who_ends_it(chain: tuple[str, str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    edge, cloud = chain
    assert cli.main(["ping", edge, cloud, "--count", "1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"edge at {edge}: splitfed ")
    assert lines[1].startswith(f"  forwards to {cloud}, compressing with none: reached (instance "), lines[1]
    cloud_at = next(i for i, x in enumerate(lines) if x.startswith(f"cloud at {cloud}: "))
    assert lines[cloud_at + 1] == "  ends the chain (computes the loss)"
    assert out.count("forwards to") == 1 and out.count("ends the chain") == 1
    assert lines[-1] == "chain: edge -> cloud ok"
    assert "will not build" not in out  # no --model asked: nothing to refuse


def test_one_tier_is_no_chain_line(chain: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ping", chain[1], "--count", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cloud at {chain[1]}: ") and "chain:" not in out, out


def test_a_chain_with_a_tier_down_has_no_chain_line(chain: tuple[str, str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    down = _closed_port()
    assert cli.main(["ping", chain[0], down, "--count", "1", "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert f"{down}: no answer: " in out and "chain:" not in out, out


def test_a_tier_that_would_not_build_the_model_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    """A tier whose build limit (``tier --max-model-mb``) the model exceeds says so under its description; one
    that would build it says nothing of the model."""
    from splitfed.engine.limits import BuildLimits, current_limits, set_limits

    with serve_tier("cloud", insecure=True) as cloud:
        before = current_limits()
        set_limits(BuildLimits(model_bytes=1))  # the tier is in process: its limits are this process's
        try:
            assert cli.main(["ping", cloud.address, "--count", "1", "--model", "cnn"]) == 1
        finally:
            set_limits(before)
        out = capsys.readouterr().out
        assert "\n  will not build the model: RESOURCE_EXHAUSTED: " in out, out
        assert cli.main(["ping", cloud.address, "--count", "1", "--model", "cnn"]) == 0
        assert "will not build" not in capsys.readouterr().out


def test_json_is_indented_by_2(chain: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ping", chain[1], "--count", "1", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["ok"] is True and [t["name"] for t in doc["tiers"]] == ["cloud"]
    lines = out.splitlines()
    assert lines[0] == "{" and lines[1] == '  "ok": true,', lines[:3]
    assert lines[2] == '  "tiers": [' and lines[3] == "    {", lines[:4]


# ---------------------------------------------------------------- --fleet-entry's training rate

@pytest.fixture
def no_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No profile in memory or in the disk cache but the test's own."""
    from splitfed.profile import profiler

    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(profiler, "_MEMORY", {})


def test_the_rate_is_the_fastest_of_7_single_passes_on_a_batch_of_32(
        no_profiles: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--fleet-entry``'s help: "a batch of 32 on one thread, the fastest of 7 passes": 7 measurements of one
    timed pass each (a measurement of several would be their median: a stalled pass would count)."""
    from splitfed.commands.ping import SPEED_PASSES, training_rate
    from splitfed.models.zoo import resolve_spec
    from splitfed.profile import speed

    seen: list[tuple[int, int]] = []
    real = speed.measure_speed

    def spy(spec: Any, x: Any, where: Any = None, **kw: Any) -> Any:
        seen.append((int(x.shape[0]), kw.get("reps", speed.REPS)))
        return real(spec, x, where, **kw)

    monkeypatch.setattr(speed, "measure_speed", spy)
    rate = training_rate(resolve_spec("mlp"))
    assert rate > 0
    assert SPEED_PASSES == 7 and seen == [(32, 1)] * 7


def test_the_rate_uses_a_profile_already_cached_from_one_rep(
        no_profiles: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the profile's FLOPs are used: the 1-rep profile ``optimize`` keeps serves, nothing is profiled again."""
    from splitfed.commands.ping import training_rate
    from splitfed.models.zoo import resolve_spec
    from splitfed.profile import profiler

    spec = resolve_spec("mlp")
    profiler.profile_model(spec, 32, reps=1)

    def again(*a: Any, **k: Any) -> Any:
        raise AssertionError("profiled again")

    monkeypatch.setattr(profiler, "_measured", again)
    assert training_rate(spec) > 0
