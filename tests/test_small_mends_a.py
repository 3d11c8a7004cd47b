"""Small mends: the optimizer benchmark's codec flag, ping's codec refusals, a fleet folder taken for a file,
experiments' figure paths, and the README's word on what top-k sends.

- ``benchmarks/optimizer.py --compress``: the name ``splitfed optimize``, simulate, ping and tier give the codec
  (before: ``--codec`` only, ``--compress`` an unknown argument); ``--codec`` still reads, hidden, and the JSON
  keeps its ``codec`` key;
- ``splitfed ping --compress``: an unknown or empty codec is refused as such; only a count that does not fit the
  addresses says a codec per link needs every address of the chain (before, every refusal said so);
- :func:`absolute_paths`: a folder in the current folder named like a shipped fleet is no fleet file (before, the
  run recorded the fleet as the folder's absolute path);
- an experiment's ``results.json`` names its figures by absolute paths, as it names its runs (before, relative
  to the folder the experiment ran in);
- README: top-k sends a 4-byte index beside each value kept, so ``topk:F`` of float32 is 2F times ``none``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from simulations import common
from splitfed import cli
from splitfed.fleets import shipped_fleets
from splitfed.flower.config import RunSettings, absolute_paths
from splitfed.report.runs import RoundRow, Run
from splitfed.transport.codec import Codec, payload_size
from tests.bench_fixtures import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _benchmark() -> ModuleType:
    """benchmarks/optimizer.py under a name of its own (``optimizer`` is also a package of splitfed's)."""
    return load_benchmark("optimizer", "bench_optimizer_a")


bo = _benchmark()


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    """The benchmark and the experiments set torch's threads: put them back for the tests after these."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- 1. benchmarks/optimizer.py --compress


def test_the_optimizer_benchmark_says_compress_in_its_help_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bo.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--compress CODEC" in out and "--codec" not in out  # the old name reads, unlisted
    assert "benchmarks/optimizer.py [--mode sflv1|sflv2|sl] [--compress none|fp16|int8|topk:F]" in bo.__doc__


@pytest.mark.parametrize("flag", ["--compress", "--codec"])
def test_the_optimizer_benchmark_refuses_an_unknown_codec_under_the_flag_given(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bo.main([flag, "junk"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"benchmarks/optimizer.py: error: argument {flag}: unknown codec 'junk': use "
                                       "none, fp16, int8 or topk:FRACTION (see benchmarks/optimizer.py --help)\n")


@pytest.mark.parametrize("argv, codec", [([], "none"), (["--compress", "fp16"], "fp16"),
                                         (["--codec", "int8"], "int8"), (["--compress", "topk:0.1"], "topk:0.1")],
                         ids=["default", "compress", "codec_alias", "topk"])
def test_compress_and_its_alias_fill_the_codec_the_json_records(monkeypatch: pytest.MonkeyPatch,
                                                                 argv: list[str], codec: str) -> None:
    """``measure`` stands in for the real one, which profiles vgg11 and resnet18 and solves fleets of 10,000
    clients (minutes): what it is given is what the JSON's ``codec`` and ``args`` record."""
    seen: list[dict[str, object]] = []
    monkeypatch.setattr(bo, "measure", lambda args: seen.append(vars(args)) or 0)
    assert bo.main(argv) == 0
    (args,) = seen
    assert args["codec"] == codec and "compress" not in args


# ---------------------------------------------------------------- 2. splitfed ping --compress


@pytest.mark.parametrize("compress, addresses, why", [
    ("bogus", 1, "--compress: unknown codec 'bogus': use none, fp16, int8 or topk:FRACTION"),
    ("none,bogus", 2, "--compress: unknown codec 'bogus': use none, fp16, int8 or topk:FRACTION"),
    ("none,bogus", 1, "--compress: unknown codec 'bogus': use none, fp16, int8 or topk:FRACTION"),
    ("int8,,", 1, "--compress 'int8,,': codec 2 of 3 is empty"),
    ("none,int8", 1, "--compress (a codec per link needs every address of the chain) 'none,int8': 2 tiers have "
                     "1 link(s): give one codec"),
    ("none,int8,fp16", 2, "--compress (a codec per link needs every address of the chain) 'none,int8,fp16': 3 "
                          "tiers have 2 link(s): give one codec for every link, or 2, one per link (the device's "
                          "first)"),
], ids=["unknown", "unknown_of_two", "unknown_and_too_many", "empty", "too_many", "too_many_of_two"])
def test_ping_says_a_codec_per_link_needs_every_address_only_where_the_count_is_wrong(
        compress: str, addresses: int, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any tier is asked (nothing listens on port 1: a tier asked would be ``no answer``)."""
    assert cli.main(["ping", *["127.0.0.1:1"] * addresses, "--compress", compress]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"splitfed ping: error: {why}\n")


# ---------------------------------------------------------------- 3. absolute_paths: a fleet folder


def test_a_folder_named_like_a_shipped_fleet_is_no_fleet_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "small" in shipped_fleets()
    (tmp_path / "small").mkdir()
    assert absolute_paths(RunSettings().with_(fleet="small")).fleet == "small"
    (tmp_path / "mine.toml").write_text("")  # a file here is named by its absolute path, as before
    assert absolute_paths(RunSettings().with_(fleet="mine.toml")).fleet == str(tmp_path / "mine.toml")


# ---------------------------------------------------------------- 4. results.json: absolute figures


def _run(label: str) -> Run:
    return Run(label, tuple(RoundRow(i + 1, a, s, bytes_up=10, bytes_down=20)
                            for i, (s, a) in enumerate(((1.0, 0.5), (2.0, 0.75)))))


def test_report_runs_names_its_figures_by_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """An experiment's --out given relative: the figures it returns (results.json's) are named from /, and
    summary.md beside them still links them relative to itself."""
    monkeypatch.chdir(tmp_path)
    images = common.report_runs([_run("a"), _run("b")], Path("rel"), 0.7)
    capsys.readouterr()
    assert images and all(p == str(tmp_path / "rel" / Path(p).name) and Path(p).is_file() for p in images.values())
    summary = (tmp_path / "rel" / "summary.md").read_text()
    assert all(f"]({Path(p).name})" in summary for p in images.values())


# the experiments' own figures (the sweep's, drift's makespan one): tests/test_simulations.py's runs of them


# ---------------------------------------------------------------- 5. README: what top-k sends


def test_the_readme_says_what_topk_sends_as_the_transport_sizes_it() -> None:
    """A 4-byte index beside each value kept: float32 at topk:F is 2F times none (twice at F = 1, even at 0.5),
    float16 3F times; the README's sentence says so."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("It sends each kept value beside its 4-byte index, ceil(F x values) x (4 + the value's bytes): "
            "`topk:F` of float32 sends 2F times the bytes of `none`, so near F = 1 about twice them (it saves "
            "bytes only below F = 0.5; of float16, 3F times, below F = 1/3).") in readme
    shape = (32, 1000)
    for dtype, per in ((torch.float32, 2), (torch.float16, 3)):
        none = payload_size(dtype, shape, Codec.parse("none"))
        for f in (1.0, 0.5, 0.1):
            assert payload_size(dtype, shape, Codec.parse(f"topk:{f}")) == pytest.approx(per * f * none)
