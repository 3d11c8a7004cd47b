"""What a fleet file and ``splitfed optimize`` print, as a user reads it: a fleet string printed as it is (the fleet's
name in optimize's header) may not hold a terminal escape; a count of one client says "1 client";
greedy's refusal reads as English; an [edge] without the link to its [cloud] is told which link is missing and why;
a mistyped profile gets the nearest known one, as a mistyped key does."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitfed.cli import main
from splitfed.errors import ConfigError
from splitfed.profile import PROFILES, parse_fleet
from splitfed.tomlio import value

EDGE = "[edge]\nprofile = 'edge-server'\n"
DEV = "[[device]]\nname = 'pi'\nprofile = 'rpi4'\n"
KNOWN = ", ".join(PROFILES)


def _refused(text: str) -> str:
    with pytest.raises(ConfigError) as e:
        parse_fleet(text, "f.toml")
    return str(e.value)


# ---------------------------------------------------------------- fleet strings printed as they are


@pytest.mark.parametrize("name", ["\x1b[31mRED\x1b[0m", "lab\u200b", "lab\x00", "lab\nx", "lab\xa0x"],
                         ids=["escape", "zero-width-space", "nul", "newline", "no-break-space"])
def test_a_fleet_name_that_cannot_be_printed_as_it_is_is_refused(name: str) -> None:
    """optimize's header printed ``name`` raw: ``\\x1b[31mRED\\x1b[0m`` turned the user's terminal red, as a device's
    name did before it was refused; the fleet's name is refused the same way, spaces allowed (it is not a client)."""
    assert _refused(f"name = {value(name)}\n" + EDGE + DEV) == (
        f"f.toml: top level: 'name' must be a non-empty string without control characters, got {name!r}")


def test_a_description_is_any_text() -> None:
    """The description is never printed: a multi-line one (a TOML triple-quoted string) loads as written."""
    assert parse_fleet('description = """two\nlines"""\n' + EDGE + DEV, "f.toml").description == "two\nlines"


def test_an_empty_or_non_string_fleet_name_is_refused() -> None:
    assert _refused("name = ''\n" + EDGE + DEV) == (
        "f.toml: top level: 'name' must be a non-empty string without control characters, got ''")
    assert _refused("name = 5\n" + EDGE + DEV) == (
        "f.toml: top level: 'name' must be a non-empty string without control characters, got 5")


def test_a_fleet_name_and_description_of_words_in_any_script_load() -> None:
    fleet = parse_fleet("name = 'my lab 手机'\ndescription = 'two words, café'\n" + EDGE + DEV, "f.toml")
    assert (fleet.name, fleet.description) == ("my lab 手机", "two words, café")
    assert parse_fleet("description = ''\n" + EDGE + DEV, "f.toml").description == ""


# ---------------------------------------------------------------- [edge]'s link to [cloud]


def test_an_edge_without_its_link_to_the_cloud_is_told_which_link() -> None:
    """The edge's up_mbps is its link to the cloud, needed because there is a [cloud] (under 2 tiers too): before,
    "[edge]: missing 'up_mbps'" read as the devices' link to the edge."""
    text = "[edge]\nflops = 1e12\nmemory_mb = 1024\n[cloud]\nprofile = 'cloud-gpu'\n" + DEV
    assert _refused(text) == ("f.toml: [edge]: missing 'up_mbps' (its link to [cloud]: give it, or a 'profile' "
                              "that has it, or drop [cloud])")
    fleet = parse_fleet(text.replace("[cloud]\nprofile = 'cloud-gpu'\n", ""), "f.toml")  # no [cloud]: no link
    assert (fleet.cloud, fleet.edge_link) == (None, None)


def test_a_device_without_its_link_is_told_as_before() -> None:
    assert _refused(EDGE + "[[device]]\nname = 'd'\nflops = 1e9\nmemory_mb = 10\n") == (
        "f.toml: [[device]] #1 ('d'): missing 'up_mbps' (give it, or a 'profile' that has it)")


# ---------------------------------------------------------------- a mistyped profile


@pytest.mark.parametrize(("typed", "meant"), [("rpi-4", "rpi4"), ("RPi4", "rpi4"), ("edge_server", "edge-server")])
def test_a_mistyped_profile_gets_the_nearest_known_one(typed: str, meant: str) -> None:
    assert _refused(EDGE + f"[[device]]\nname = 'pi'\nprofile = {typed!r}\n") == (
        f"f.toml: [[device]] #1 ('pi'): 'profile' {typed!r} is unknown (did you mean {meant!r}? known: {KNOWN})")


def test_a_profile_like_none_known_names_them_all() -> None:
    assert _refused(EDGE.replace("edge-server", "mainframe") + DEV) == (
        f"f.toml: [edge]: 'profile' 'mainframe' is unknown (known: {KNOWN})")


# ---------------------------------------------------------------- optimize's words


@pytest.fixture()
def one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fleet of one Pi (0.15 MiB, short of the whole mlp) on an edge of 0.01 MiB: no cut fits."""
    monkeypatch.setenv("SPLITFED_PROFILE_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "one.toml"
    p.write_text("name = 'one'\n[edge]\nprofile = 'edge-server'\nmemory_mb = 0.01\n"
                 "[[device]]\nname = 'pi'\nprofile = 'rpi4'\nmemory_mb = 0.15\n")
    return p


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(["optimize", "--model", "mlp", "--tiers", "2", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_greedy_s_refusal_reads_as_english(one: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _error(capsys, ["--fleet", str(one), "--greedy"]) == (
        "splitfed optimize: error: greedy: no cuts of client 'pi' that its device holds fit the server tiers "
        "(edge 0.01 MiB) even with the servers to itself\n")


def test_one_client_that_does_not_fit_is_one_client(one: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _error(capsys, ["--fleet", str(one)]) == (
        "splitfed optimize: error: no assignment fits: the server tiers (edge 0.01 MiB) cannot hold the segments "
        "of the 1 client of mlp at batch 32, whatever the cuts; edge needs at least 0.157 MiB for the 1 client's "
        "least share, has 0.01 MiB\n")


def test_the_header_counts_one_client_in_the_singular(one: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one.write_text(one.read_text().replace("memory_mb = 0.01\n", "").replace("memory_mb = 0.15\n", ""))
    assert main(["optimize", "--model", "mlp", "--tiers", "2", "--fleet", str(one), "--static", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "mlp (5 blocks) on fleet one (1 client), 2 tiers, batch 32"


# ---------------------------------------------------------------- two drifts of one field in one round


@pytest.mark.parametrize(("first", "second"), [("up_mbps = 1", "up_mbps = 2"), ("up_scale = 0.5", "up_scale = 0.5"),
                                               ("up_mbps = 1", "up_scale = 0.1"), ("flops = 1e9\nrtt_ms = 5",
                                                                                    "rtt_scale = 2\nflops_scale = 3")])
def test_two_drifts_of_one_field_in_one_round_are_refused(first: str, second: str) -> None:
    """Before, the later set won and scales compounded, without a word: which the user meant is not ours to guess.
    The field named is the first of them in name order."""
    text = (EDGE + DEV + f"[[device.drift]]\nround = 5\n{first}\n[[device.drift]]\nround = 3\nup_scale = 2\n"
            f"[[device.drift]]\nround = 5\n{second}\n")
    field = "flops" if "flops" in first else "up_mbps"
    assert _refused(text) == (f"f.toml: [[device]] #1 ('pi') drift #3: changes {field!r} in round 5, as drift #1 "
                              "does: give one drift per field and round")


def test_drifts_of_other_fields_or_rounds_load() -> None:
    """One round may change several fields in several entries, and one field may change in several rounds."""
    fleet = parse_fleet(EDGE + DEV + "[[device.drift]]\nround = 5\nup_mbps = 1\n[[device.drift]]\nround = 5\n"
                        "down_scale = 0.5\n[[device.drift]]\nround = 6\nup_mbps = 2\n", "f.toml")
    pi = fleet.clients[0]
    assert pi.at_round(5).link.up == pytest.approx(1e6 / 8) and pi.at_round(6).link.up == pytest.approx(2e6 / 8)
    assert pi.at_round(5).link.down == pytest.approx(pi.link.down * 0.5)
