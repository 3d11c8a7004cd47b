"""``splitfed profile``, ``optimize``, ``blocks`` and ``verify`` as a script uses them.

Before: ``--help`` named none of the ``--json`` keys a script reads (profile, blocks and verify said only
"JSON"; optimize "makespan_s, clients, ..."), a device that could not hold ``--static``'s (or
``--all-on-server``'s) cuts was refused without naming the flag, and ``verify --tiers 1`` or a one-cut
``--u-shape`` vector were refused as "a chain needs at least 2 tiers" with no flag named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitfed.cli import main

TINY_DEVICE_FLEET = """
name = "tiny"
samples = 64
[edge]
profile = "edge-server"
[cloud]
profile = "cloud-gpu"
[[device]]
name = "mote"
profile = "phone-mid"
memory_mb = 0.001
"""


@pytest.fixture(autouse=True)
def _profile_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles measured here go to a test folder, not the user's cache."""
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path_factory.getbasetemp() / "profiles"))


def _help_words(capsys: pytest.CaptureFixture[str], command: str) -> set[str]:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    return set(re.findall(r"[a-z_]+", capsys.readouterr().out))


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _keys(obj: object) -> set[str]:
    """Every key of ``obj``'s objects, however deep (the keys of dicts that are a key's value, e.g.
    ``shared_s``'s server names, are data: only the objects in lists are walked into)."""
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj))
    if isinstance(obj, dict):
        return set(obj) | set().union(*(_keys(v) for v in obj.values() if isinstance(v, list)))
    return set()


@pytest.mark.parametrize("argv", [
    ["optimize", "--model", "mlp", "--fleet", "small", "--json"],
    ["blocks", "--model", "mlp", "--json"],
    ["verify", "--model", "mlp", "--cuts", "2,3", "--steps", "1", "--json"],
])
def test_every_json_key_is_named_in_help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """A script reads the keys ``--help`` promises: each key the command prints (and each key of its
    per-client or per-block objects) is there."""
    out = _json(capsys, argv)
    missing = _keys(out) - _help_words(capsys, argv[0])
    assert not missing, f"{argv[0]} --help does not name --json's keys {sorted(missing)}"


def test_profile_help_names_the_json_keys_a_script_reads(capsys: pytest.CaptureFixture[str]) -> None:
    """The profile's JSON is also its cache format (dozens of keys, most the cost model's own): ``--help``
    names the ones a user reads, and each is in the output."""
    readable = {"model", "batch", "names", "fwd_flops", "bwd_flops", "param_bytes", "out_bytes", "fwd_s", "bwd_s",
                "version"}
    out = _json(capsys, ["profile", "--model", "mlp", "--batch", "2", "--reps", "1", "--json"])
    assert readable <= set(out)
    assert readable <= _help_words(capsys, "profile")


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """``argv`` refused as input: exit 2, nothing on stdout (``--json`` stays parseable: empty), one line on
    stderr, which is returned."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("policy, flag", [(["--static", "0,0"], "--static"),
                                          (["--all-on-server"], "--all-on-server")])
def test_cuts_a_device_cannot_hold_are_refused_naming_the_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                               policy: list[str], flag: str) -> None:
    fleet = tmp_path / "tiny.toml"
    fleet.write_text(TINY_DEVICE_FLEET)
    err = _refused(capsys, ["optimize", "--model", "mlp", "--fleet", str(fleet), *policy, "--json"])
    assert err.startswith(f"splitfed optimize: error: {flag}: ") and "'mote'" in err  # before: no flag named


@given(cuts=st.lists(st.integers(-3, 8), min_size=1, max_size=3))
def test_any_refused_static_vector_names_the_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  cuts: list[int]) -> None:
    """Whatever is wrong with a ``--static`` vector (count, order, range, or a device it does not fit), the
    refusal is one line that names ``--static``; a vector that fits prints its JSON."""
    fleet = tmp_path / "tiny.toml"
    fleet.write_text(TINY_DEVICE_FLEET)
    argv = ["optimize", "--model", "mlp", "--fleet", str(fleet), f"--static={','.join(map(str, cuts))}", "--json"]
    code = main(argv)
    out, err = capsys.readouterr()
    if code == 0:
        assert json.loads(out)["clients"][0]["cuts"] == cuts
    else:
        assert code == 2 and out == "" and err.startswith("splitfed optimize: error: --static: "), err


@pytest.mark.parametrize("extra, flags", [(["--cuts", "2,3", "--tiers", "1"], ["--tiers 1"]),
                                         (["--cuts", "2", "--u-shape"], ["--cuts 2", "--u-shape"])])
def test_verify_names_the_flag_that_made_a_one_tier_chain(capsys: pytest.CaptureFixture[str], extra: list[str],
                                                          flags: list[str]) -> None:
    err = _refused(capsys, ["verify", "--model", "mlp", *extra, "--json"])
    assert all(f in err for f in flags), err  # before: "a chain needs at least 2 tiers, got 1"


def test_exhaustive_above_its_limit_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped small fleet is already above ``--exhaustive``'s limit: the refusal names the flag and the
    limit, and prints no JSON."""
    err = _refused(capsys, ["optimize", "--model", "mlp", "--fleet", "small", "--exhaustive", "--json"])
    assert err.startswith("splitfed optimize: error: --exhaustive: ") and "limit 2,000,000" in err, err


def _script(shell: str) -> tuple[int, str]:
    """The installed ``splitfed`` run by a shell line (its redirections); exit code and stderr."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("splitfed")
    p = subprocess.run(["bash", "-c", shell.format(splitfed=exe)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_output_to_a_full_disk_is_one_line_and_exit_1():
    code, err = _script("{splitfed} blocks --model mlp > /dev/full")
    assert code == 1 and "Traceback" not in err, err
    assert err.strip() == "splitfed blocks: error: [Errno 28] No space left on device", err


def test_a_command_started_with_stdout_closed_ends_without_a_traceback():
    code, err = _script("{splitfed} blocks --model mlp >&-")
    assert code == 0 and err == "", err
