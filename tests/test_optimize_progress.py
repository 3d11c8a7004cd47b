"""``splitfed optimize`` says on stderr that it is still working, every ``TICK_S``, while a policy is priced.

Before, a large fleet's solve was silent up to its ``--time-limit`` (1,000 distinct vgg11 devices: 18 s, then the
table). Each test's stand-in policy waits for the lines it expects (no timing): the solve itself is real.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import pytest

import splitfed.optimizer as optimizer
from splitfed.cli import main
from splitfed.commands import optimize

ARGS = ["optimize", "--model", "mlp", "--fleet", "small"]


def _ticker_alive() -> bool:
    return any(t.name == "optimize-ticker" and t.is_alive() for t in threading.enumerate())


def _waiting(real: Callable, err: io.StringIO, lines: int) -> Callable:
    """``real``, once stderr holds ``lines`` lines (each a tick; 60 s at most)."""

    def slow(*a: object, **k: object) -> object:
        end = time.monotonic() + 60
        while err.getvalue().count("\n") < lines and time.monotonic() < end:
            time.sleep(0.01)
        return real(*a, **k)

    return slow


@pytest.mark.parametrize(("flag", "attr", "line"), [
    ([], "solve", "still choosing the cuts of 5 clients of mlp: 0 s so far; it gives up at 60 s (--time-limit); "
                  "Ctrl-C stops it\n"),
    (["--best-static", "--time-limit", "9"], "best_static",
     "still pricing --best-static for 5 clients of mlp: 0 s so far; it gives up at 9 s (--time-limit); Ctrl-C "
     "stops it\n"),
    (["--greedy"], "greedy", "still pricing --greedy for 5 clients of mlp: 0 s so far; Ctrl-C stops it\n"),
])
def test_a_long_pricing_says_so_until_it_ends(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                              flag: list[str], attr: str, line: str) -> None:
    """Two ticks while the policy runs, none once it has returned (the ticker is stopped and joined), and stdout
    is the table as ever."""
    monkeypatch.setattr(optimize, "TICK_S", 0.02)
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(optimizer, attr, _waiting(getattr(optimizer, attr), err, 2))
    assert main([*ARGS, *flag]) == 0
    assert not _ticker_alive()
    assert err.getvalue().startswith(line * 2), err.getvalue()
    assert set(err.getvalue().splitlines()) == {line.rstrip("\n")}
    assert "makespan" in capsys.readouterr().out


def test_a_quick_pricing_says_nothing_and_json_stays_json(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    """A policy done before the first tick prints no line (stdout is the JSON object alone)."""
    import json

    monkeypatch.setattr(optimize, "TICK_S", 3600.0)
    assert main([*ARGS, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["makespan_s"] > 0 and err == ""
    assert not _ticker_alive()


def test_ctrl_c_stops_the_ticker_too(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(optimize, "TICK_S", 0.02)

    def interrupted(*a: object, **k: object) -> object:
        while not _ticker_alive():
            time.sleep(0.01)
        raise KeyboardInterrupt

    monkeypatch.setattr(optimizer, "solve", interrupted)
    assert main(ARGS) == 130
    assert not _ticker_alive()


def test_a_closed_stderr_ends_the_ticker_not_the_solve(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    """stderr closed under it (a reader gone): the ticker stops quietly, the answer still comes."""
    monkeypatch.setattr(optimize, "TICK_S", 0.02)
    err = io.StringIO()
    err.close()
    monkeypatch.setattr("sys.stderr", err)
    real = optimizer.solve

    def slow(*a: object, **k: object) -> object:
        end = time.monotonic() + 60
        while _ticker_alive() and time.monotonic() < end:
            time.sleep(0.01)  # the ticker's first write fails and it returns
        return real(*a, **k)

    monkeypatch.setattr(optimizer, "solve", slow)
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    assert main(ARGS) == 0
    assert "makespan" in capsys.readouterr().out
    assert raised == []  # it returned; it did not die of the closed file


def test_a_long_comparison_says_so_and_what_gives_up(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    """--compare runs two policies under --time-limit, one after the other: its tick names both limits, not one
    time to give up at."""
    from splitfed.optimizer import compare

    monkeypatch.setattr(optimize, "TICK_S", 0.02)
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(compare, "compare", _waiting(compare.compare, err, 2))
    assert main([*ARGS, "--compare", "--time-limit", "9"]) == 0
    assert not _ticker_alive()
    line = ("still comparing the policies for 5 clients of mlp (the solve and --best-static each give up at 9 s, "
            "--time-limit): 0 s so far; Ctrl-C stops it")
    assert set(err.getvalue().splitlines()) == {line}, err.getvalue()
    assert "optimizer" in capsys.readouterr().out
