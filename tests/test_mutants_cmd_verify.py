"""What ``splitfed verify`` promises that the mutation run of ``splitfed/commands/verify.py`` found unpinned.

``--cuts`` is required (argparse's own refusal, exit 2, not a traceback); a run without ``--steps`` and
``--rounds`` trains 2 steps in 1 round; a U-shape vector of K cuts is a chain of K
tiers; the exit status is 1 when the split and whole models differ beyond the tolerance.
"""

from __future__ import annotations

import json

import pytest

from splitfed import cli

BASE = ["verify", "--model", "mlp", "--cuts", "1,2", "--json"]


def _verify(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    code = cli.main([*BASE, *extra])
    return code, json.loads(capsys.readouterr().out)


def test_cuts_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "--model", "mlp", "--json"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "the following arguments are required: --cuts" in err


def test_a_run_without_flags_takes_the_documented_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """Steps and rounds are in the answer, and a run given them explicitly answers the same."""
    code, plain = _verify(capsys)
    assert code == 0 and plain["ok"] is True
    assert (plain["steps"], plain["rounds"], plain["tiers"], plain["clients"]) == (2, 1, 3, 1)
    code, explicit = _verify(capsys, "--steps", "2", "--rounds", "1")
    assert code == 0 and explicit == plain


def test_a_u_shape_vector_of_k_cuts_is_a_chain_of_k_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["verify", "--model", "mlp", "--cuts", "1,2", "--u-shape", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["tiers"] == 2 and out["u_shape"] is True and out["ok"] is True


def test_a_difference_beyond_the_tolerance_exits_1(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A tolerance nothing meets stands in for a split that trains otherwise than the whole model (a legal
    model cannot be made to: the zoo's and the user's are checked to train as themselves)."""
    from splitfed.engine import verify

    monkeypatch.setattr(verify, "TOLERANCE", -1.0)
    code, out = _verify(capsys)
    assert code == 1 and out["ok"] is False
    assert cli.main(BASE[:-1]) == 1
    assert capsys.readouterr().out.rstrip().endswith("MISMATCH")


@pytest.mark.xdist_group("transport-processes")
def test_grpc_runs_the_server_tiers_as_processes_and_inproc_does_not(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``--transport grpc`` starts one real tier process per server tier (named edge, cloud), plaintext on
    127.0.0.1, serving the zoo's models only; ``inproc`` starts none. The chain is watched, not replaced: the
    real ``local_chain`` runs (the CLI in a subprocess, as ``test_cli_foundation`` runs it, is out of reach of
    the mutation tool's copy)."""
    from splitfed.transport import process

    started: list[tuple[list[str], dict]] = []
    real = process.local_chain

    def watched(names, *args, **kwargs):  # type: ignore[no-untyped-def]
        started.append((list(names), kwargs))
        return real(names, *args, **kwargs)

    monkeypatch.setattr(process, "local_chain", watched)
    code, out = _verify(capsys, "--transport", "grpc")
    assert code == 0 and out["ok"] is True and out["transport"] == "grpc" and out["tiers"] == 3
    assert [names for names, _ in started] == [["edge", "cloud"]]
    assert started[0][1]["insecure"] is True and tuple(started[0][1]["allow_models"]) == ()
    started.clear()
    code, out = _verify(capsys)
    assert code == 0 and out["transport"] == "inproc" and started == []
