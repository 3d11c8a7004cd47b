"""One syntax of cut vectors, one parser: ``--cuts static:K1,K2/K1,K2`` (simulate, a config's ``cuts``) and
``splitfed verify --cuts K1,K2/K1,K2`` read it with :func:`splitfed.flower.policy.parse_cuts`.

Before: ``parse_static`` skipped an empty ``/`` entry, so ``static:1,3/`` and ``static:1,3//2,5`` ran as if the
empty vector had never been written, while ``verify`` refused the same text ("empty cut vector"). An empty cut
(``2,,5``) is refused by both, naming the text as written."""

from __future__ import annotations

import pytest

from splitfed.cli import main as cli_main
from splitfed.commands.verify import _cut_vectors
from splitfed.errors import ConfigError
from splitfed.flower.config import RunSettings
from splitfed.flower.policy import make_policy, parse_cuts, parse_static

LIKE = "are integers like 'static:2,5' or 'static:1,3/2,5' (one vector per client)"


@pytest.mark.parametrize(("text", "said"), [
    ("1,3/", "empty cut vector in 'static:1,3/'"),
    ("1,3//2,5", "empty cut vector in 'static:1,3//2,5'"),
    ("/1,3", "empty cut vector in 'static:/1,3'"),
    ("2,,5", "empty cut in 'static:2,,5'"),
    ("2,5,", "empty cut in 'static:2,5,'"),
    ("1,3/2, ,5", "empty cut in 'static:1,3/2, ,5'"),
])
def test_static_cuts_with_an_empty_vector_or_cut_are_refused_naming_the_text(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_policy(RunSettings(cuts=f"static:{text}", tiers=3))
    assert str(e.value) == f"{said}: static cuts {LIKE}"


def test_simulate_refuses_an_empty_cut_vector_before_anything_starts(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    assert cli_main(["simulate", "--cuts", "static:1,3/", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"splitfed simulate: error: command line: cuts: empty cut vector in 'static:1,3/': static cuts {LIKE}"]
    assert not out.exists()


@pytest.mark.parametrize(("text", "said"), [
    ("1,3//2,5", "empty cut vector in '1,3//2,5'"),
    ("2,,5", "empty cut in '2,,5'"),
    ("x", "cuts must be integers like '2,5' or '1,3/2,5', got 'x'"),
])
def test_verify_refuses_what_static_refuses_with_the_same_words(
        text: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli_main(["verify", "--model", "mlp", "--cuts", text])
    assert e.value.code == 2
    assert f"argument --cuts: {said}" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["2,5", "1,3/2,5", " 1, 3 / 2,5 ", "0,5/5,5/2,4"])
def test_both_read_the_same_vectors(text: str) -> None:
    assert _cut_vectors(text) == parse_static(text) == parse_cuts(text)
    assert make_policy(RunSettings(cuts=f"static:{text}", tiers=3)).options == parse_cuts(text)  # type: ignore[attr-defined]


@pytest.mark.parametrize("text", ["", "/", " / ", "1,3/", "1,3//2,5", "2,,5", ",", "2;5", "1.5,3"])
def test_both_refuse_the_same_texts(text: str) -> None:
    with pytest.raises(ConfigError) as static:
        parse_static(text)
    with pytest.raises(ConfigError) as plain:
        parse_cuts(text)
    assert str(static.value).replace("static:", "").replace("static cuts", "cuts") == str(plain.value)
