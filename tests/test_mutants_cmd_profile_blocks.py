"""What ``splitfed profile`` and ``splitfed blocks`` promise that the mutation run found unpinned.

``profile``: its defaults (``--batch 32``, ``--reps 3``, ``--optimizer-slots 1``, each visible in ``--json``'s
``batch``, ``reps``, ``optimizer_slots`` and in the fixed bytes the slots price), the choices of
``--optimizer-slots`` (0, 1 and 2 run, anything else is refused naming them), ``--json``'s layout (one key a line,
indented by one space), the table's "this host" on the CPU, and ``render``'s table: a profile without times prints
'-' in the time columns (also one with forward times only, rather than failing), says nothing of timed runs and
gives no training rate.

``blocks``: each block's output shape and the cut after it (``--json``), and the table's ``trainable`` column shown
only where some block has a frozen parameter.

Run in-process (``cli.main``) on the zoo's tiny ``mlp``; ``--no-cache`` keeps every profile off the cache."""

from __future__ import annotations

import json
import re

import pytest

from splitfed.cli import main
from splitfed.commands.profile import render
from splitfed.profile import ModelProfile

MLP_LINEAR1 = 64 * 128 + 128  # parameters of the mlp's first Linear (block 1)
F32 = 4


def _profile_json(capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    assert main(["profile", "--model", "mlp", "--no-cache", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------- profile: defaults and choices

def test_profile_defaults_are_batch_32_three_reps_and_one_optimizer_slot(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help``'s defaults: a batch of 32, the median of 3 timed runs, one optimizer tensor per parameter
    (momentum), so a trainable block's fixed bytes are its parameters, their gradient and one slot."""
    out = _profile_json(capsys)
    assert (out["batch"], out["reps"], out["optimizer_slots"]) == (32, 3, 1)
    assert out["fixed_bytes"][1] == 3 * F32 * MLP_LINEAR1


@pytest.mark.parametrize("slots", [0, 1, 2])
def test_each_optimizer_slot_choice_runs_and_prices_its_slots(capsys: pytest.CaptureFixture[str], slots: int) -> None:
    """SGD 0, momentum 1, Adam 2: each is accepted and prices (2 + slots) x the trainable parameters' bytes (and
    Adam its step count, one float per trainable Parameter: the Linear's weight and bias)."""
    out = _profile_json(capsys, "--batch", "2", "--reps", "1", "--optimizer-slots", str(slots))
    assert out["optimizer_slots"] == slots
    assert out["fixed_bytes"][1] == (2 + slots) * F32 * MLP_LINEAR1 + (2 * F32 if slots == 2 else 0)


@pytest.mark.parametrize("value", ["3", "-1"])
def test_an_optimizer_slot_count_outside_the_choices_is_refused_naming_them(capsys: pytest.CaptureFixture[str],
                                                                            value: str) -> None:
    """Refused by argparse (exit 2), in one line that names the choices a user can give."""
    with pytest.raises(SystemExit) as e:
        main(["profile", "--model", "mlp", "--no-cache", "--optimizer-slots", value])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"splitfed profile: error: argument --optimizer-slots: invalid choice: {value} "
                   "(choose from 0, 1, 2) (see splitfed profile --help)\n")


# ---------------------------------------------------------------- profile: what it prints

def test_profile_json_is_one_key_a_line_indented_by_one_space(capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON's layout (the cache's format): an object with each key on a line of its own, one space in."""
    assert main(["profile", "--model", "mlp", "--no-cache", "--json", "--batch", "2", "--reps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["{", ' "model": "mlp",', ' "batch": 2,']
    assert lines[-1] == "}"


def test_profile_table_on_the_cpu_says_this_host_trains_at(capsys: pytest.CaptureFixture[str]) -> None:
    """On the CPU (the default ``--torch-device``) the rate is this host's, not "this host's <device>"."""
    assert main(["profile", "--model", "mlp", "--no-cache", "--batch", "2", "--reps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mlp: 5 blocks, batch 2, input 0.3 kB/sample, times: median of 1 run(s)"
    assert re.fullmatch(r"per sample: 0\.0 MFLOP forward, 0\.1 backward; 0\.07 MB of parameters; "
                        r"this host trains at [0-9.e+]+ GFLOP/s", lines[-1]), lines[-1]


# ---------------------------------------------------------------- render

HEADER = ("  # block                         fwd MFLOP  bwd MFLOP  params kB   out kB   act kB   fixed kB   "
          "fwd ms   bwd ms")


def _toy(**kw: object) -> ModelProfile:
    """Two blocks whose every column is a round number: per sample 2.5 MFLOP forward, 5 backward, 0.35 MB."""
    return ModelProfile("toy", 4, ("conv", "head"), 3072.0, (2e6, 5e5), (4e6, 1e6), (1e5, 2.5e5), (4000.0, 40.0),
                        (8000.0, 500.0), (3e5, 7.5e5), **kw)  # type: ignore[arg-type]


def test_render_of_a_timed_profile() -> None:
    """The reference: times in ms per batch, how many runs they are the median of, and the rate (work
    (2.5 + 5) MFLOP x 4 samples over 8 ms = 3.75 GFLOP/s) where it was measured."""
    prof = _toy(fwd_s=(0.002, 0.001), bwd_s=(0.004, 0.001), reps=3)
    assert render(prof, "this host's cuda:0").splitlines() == [
        "toy: 2 blocks, batch 4, input 3.1 kB/sample, times: median of 3 run(s)",
        HEADER,
        "  0 conv                               2.00       4.00      100.0      4.0      8.0      300.0     2.00     4.00",
        "  1 head                               0.50       1.00      250.0      0.0      0.5      750.0     1.00     1.00",
        "per sample: 2.5 MFLOP forward, 5.0 backward; 0.35 MB of parameters; this host's cuda:0 trains at 3.75 GFLOP/s",
    ]


def test_render_of_an_untimed_profile_prints_dashes_and_no_rate() -> None:
    """No times (a synthetic profile, or one whose ``reps`` came without them): '-' in the time columns, no
    "times: median of" in the title even with ``reps`` set, and no "trains at" (there is no rate)."""
    prof = _toy(reps=3)
    assert prof.host_flops() is None
    assert render(prof).splitlines() == [
        "toy: 2 blocks, batch 4, input 3.1 kB/sample",
        HEADER,
        "  0 conv                               2.00       4.00      100.0      4.0      8.0      300.0        -        -",
        "  1 head                               0.50       1.00      250.0      0.0      0.5      750.0        -        -",
        "per sample: 2.5 MFLOP forward, 5.0 backward; 0.35 MB of parameters",
    ]


@pytest.mark.parametrize("times", [{"fwd_s": (0.002, 0.001)}, {"bwd_s": (0.004, 0.001)}])
def test_render_of_a_half_timed_profile_prints_dashes(times: dict) -> None:
    """Times of one direction only (a hand-made or older profile: nothing requires both): the rows print '-'
    rather than failing on the missing direction."""
    rows = render(_toy(**times)).splitlines()[2:4]
    assert [r[-17:] for r in rows] == ["       -        -"] * 2


# ---------------------------------------------------------------- blocks

def test_blocks_json_gives_each_blocks_output_shape_and_the_cut_after_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Block i's output shape is what the cut after it carries, and that cut is i + 1 (blocks < i + 1 on the
    earlier tier)."""
    assert main(["blocks", "--model", "mlp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["input_shape"] == [64]
    assert [(b["index"], b["output_shape"], b["cut_after"]) for b in out["blocks"]] == [
        (0, [64], 1), (1, [128], 2), (2, [128], 3), (3, [64], 4), (4, [10], 5)]


def test_blocks_table_has_no_trainable_column_when_everything_trains(capsys: pytest.CaptureFixture[str]) -> None:
    """The ``trainable`` column is there only when some block has a frozen parameter: in a model where every
    parameter trains it would repeat ``params``."""
    assert main(["blocks", "--model", "mlp"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "mlp: 5 blocks, input [64]; cut k puts blocks < k on the earlier tier",
        "block  name                         output                 params",
        "    0  Flatten                      [64]                        0",
        "    1  Linear+ReLU[1]               [128]                   8,320",  # alike names keyed by their child
        "    2  Dropout                      [128]                       0",
        "    3  Linear+ReLU[3]               [64]                    8,256",
        "    4  Linear                       [10]                      650",
    ]
