"""``splitfed optimize --compress``: the name simulate, ping and tier give the per-link codec list.

Before, optimize alone took it as ``--codec`` (``--compress`` was refused as an unknown argument); ``--codec`` is
kept as a hidden alias of the same setting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitfed.cli import main

FLEET = """
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "phone"
profile = "phone-mid"
count = 2
[[device]]
name = "pi"
profile = "rpi4"
samples = 200
"""


@pytest.fixture()
def fleet_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "fleet.toml"
    p.write_text(FLEET)
    return str(p)


def _makespan(fleet_file: str, capsys: pytest.CaptureFixture[str], *flags: str) -> float:
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--static", "2,5", "--json", *flags]) == 0
    return float(json.loads(capsys.readouterr().out)["makespan_s"])


def test_optimize_takes_compress_and_codec_as_one_setting(fleet_file: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """int8 shrinks what crosses the phones' links: the makespan of the same cuts drops, by either name."""
    plain = _makespan(fleet_file, capsys)
    assert _makespan(fleet_file, capsys, "--compress", "none") == plain  # the default, spelled out
    compressed = _makespan(fleet_file, capsys, "--compress", "int8")
    assert compressed < plain
    assert _makespan(fleet_file, capsys, "--codec", "int8") == compressed  # the old name, still read


def test_optimize_help_shows_compress_not_codec(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["optimize", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "[--compress CODEC]" in text and "  --compress CODEC      compression of boundary tensors:" in text
    assert "--codec" not in text


@pytest.mark.parametrize("flag", ["--compress", "--codec"])
def test_a_codec_list_that_does_not_fit_the_chain_names_compress(fleet_file: str, capsys: pytest.CaptureFixture[str],
                                                                 flag: str) -> None:
    assert main(["optimize", "--model", "cnn", "--fleet", fleet_file, "--tiers", "2", flag, "none,int8"]) == 2
    printed = capsys.readouterr()
    assert printed.err == ("splitfed optimize: error: --compress 'none,int8': 2 tiers have 1 link(s): give one "
                           "codec\n")
    assert printed.out == ""
