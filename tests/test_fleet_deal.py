"""A run's clients are dealt from the fleet's devices, not drawn from its classes with replacement.

Before: ``Fleet.sample(n)`` drew ``n`` device classes at random, weighted by count, with replacement, so
``splitfed simulate --fleet iot --clients 10`` (the main job) trained 3 mcu-ble, 3 pi-sat, 2 pi-home and 2
phone-mid, and no ``mcu-eth``, of a file listing 3, 2, 2, 2 and 1, while ``splitfed optimize --fleet iot`` priced
the file as listed. Now as many clients as the fleet lists are exactly its devices, fewer a subset of them (no
device twice), more each device ``n // size`` times and a subset for the rest; the seed picks only that subset.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitfed.flower.config import RunSettings
from splitfed.profile.fleet import (
    DEALT,
    Fleet,
    deal,
    dealt_digest,
    fleet_digest,
    load_fleet,
    parse_fleet,
)
from splitfed.sim.clock import fleet_for
from splitfed.sim.runner import draw_note

EDGE = "[edge]\nflops = 1e12\nmemory_mb = 4096\n"


def _fleet(counts: list[int]) -> Fleet:
    """A fleet of ``len(counts)`` entries ``d0``, ``d1``... with those counts, each a different speed."""
    entries = "".join(f'[[device]]\nname = "d{i}"\nflops = {1e8 * (i + 1):g}\nmemory_mb = 512\nup_mbps = 10\n'
                      f"down_mbps = 10\nrtt_ms = 20\ncount = {c}\n" for i, c in enumerate(counts))
    return parse_fleet(EDGE + entries, "f.toml")


@given(size=st.integers(1, 40), n=st.integers(1, 200), seed=st.integers(0, 2**32 - 1))
def test_deal_gives_each_device_its_share_and_the_seed_only_the_rest(size: int, n: int, seed: int) -> None:
    times = deal(size, n, seed)
    whole, part = divmod(n, size)
    assert len(times) == size and sum(times) == n
    assert sorted(set(times)) == sorted({whole} | ({whole + 1} if part else set()))
    assert times.count(whole + 1) == part
    assert times == deal(size, n, seed)  # the seed decides it


@given(counts=st.lists(st.integers(1, 4), min_size=1, max_size=6), n=st.integers(1, 60),
       seed=st.integers(0, 1000))
def test_a_sample_is_the_fleets_devices_dealt_out_in_its_order(counts: list[int], n: int, seed: int) -> None:
    fleet = _fleet(counts)
    size = len(fleet.clients)
    drawn = fleet.sample(n, seed=seed)
    assert len(drawn.clients) == n and len({c.name for c in drawn.clients}) == n
    per_kind = Counter(c.kind for c in drawn.clients)
    whole, part = divmod(n, size)
    for kind, count in zip((f"d{i}" for i in range(len(counts))), counts, strict=True):
        # each of an entry's `count` devices gets whole or whole + 1 clients
        assert whole * count <= per_kind.get(kind, 0) <= (whole + 1) * count if part else per_kind[kind] == whole * count
    assert dict(drawn.kinds) == {k: v for k, v in per_kind.items() if v}
    order = [c.kind for c in drawn.clients]
    assert order == sorted(order, key=lambda k: int(k[1:]))  # in the fleet file's order
    for c in drawn.clients:  # a client is its entry's device under another name
        entry = fleet.client(f"{c.kind}-0") if counts[int(c.kind[1:])] > 1 else fleet.client(c.kind)
        assert (c.device, c.link, c.samples, c.drift) == (entry.device, entry.link, entry.samples, entry.drift)
    if n == size:
        assert per_kind == Counter(c.kind for c in fleet.clients)
        assert drawn.clients == fleet.sample(n, seed=seed + 1).clients  # the seed changes nothing then


def test_the_main_jobs_ten_clients_are_the_iot_fleet_as_listed() -> None:
    settings = RunSettings(clients=10, fleet="iot", seed=0)
    drawn = fleet_for(settings)
    listed = load_fleet("iot")
    assert Counter(c.kind for c in drawn.clients) == Counter(c.kind for c in listed.clients)
    assert dict(drawn.kinds) == {"mcu-ble": 3, "mcu-eth": 2, "pi-sat": 2, "pi-home": 2, "phone-mid": 1}
    assert [c.name for c in drawn.clients][:4] == ["mcu-ble-0", "mcu-ble-1", "mcu-ble-2", "mcu-eth-0"]
    assert draw_note(settings) == ("clients: the 10 devices of fleet 'iot': 3 mcu-ble, 2 mcu-eth, 2 pi-sat, "
                                   "2 pi-home, 1 phone-mid")


@pytest.mark.parametrize(("n", "said"), [
    (4, "clients: 4 of the 10 devices of fleet 'iot', drawn by seed 3: "),
    (20, "clients: 20 from fleet 'iot': each of its 10 devices twice: 6 mcu-ble, 4 mcu-eth, 4 pi-sat, 4 pi-home, "
         "2 phone-mid"),
    (11, "clients: 11 from fleet 'iot': each of its 10 devices once, and 1 more drawn by seed 3: "),
    (35, "clients: 35 from fleet 'iot': each of its 10 devices 3 times, and 5 more drawn by seed 3: "),
])
def test_the_draw_line_says_how_the_clients_were_dealt(n: int, said: str) -> None:
    settings = RunSettings(clients=n, fleet="iot", seed=3)
    note = draw_note(settings)
    assert note.startswith(said)
    shown = Counter({kind: int(k) for k, kind in (part.split(" ", 1) for part in note.rsplit(": ", 1)[1].split(", "))})
    assert shown == Counter(c.kind for c in fleet_for(settings).clients)


def test_a_fleet_of_one_device_is_said_in_the_singular(tmp_path: Path) -> None:
    fleet = tmp_path / "one.toml"
    fleet.write_text('[edge]\nprofile = "edge-server"\n[[device]]\nname = "pi"\nprofile = "rpi4"\n')
    assert draw_note(RunSettings(clients=1, fleet=str(fleet))) == f"clients: the device of fleet '{fleet}': 1 pi"
    assert draw_note(RunSettings(clients=3, fleet=str(fleet))) == \
        f"clients: 3 from fleet '{fleet}': its one device 3 times: 3 pi"


def test_fewer_clients_than_devices_never_repeat_one_and_the_seed_picks_which() -> None:
    fleet = load_fleet("reference")
    picks = {tuple(c.name for c in fleet.sample(7, seed=s).clients) for s in range(20)}
    assert len(picks) > 1
    for s in range(20):
        per_kind = Counter(c.kind for c in fleet.sample(7, seed=s).clients)
        assert all(per_kind[k] <= fleet.kinds[k] for k in per_kind)


# ---------------------------------------------------------------- a resume keeps to the devices it was dealt


def _resume_settings(tmp_path: Path, rounds: int, resume: bool) -> RunSettings:
    return RunSettings(fleet="iot", clients=3, seed=0, rounds=rounds, cuts="static:1,3", batch_size=64,
                       tiers=3, out=str(tmp_path / "run"), resume=resume, node_wait_s=5.0)


def test_a_run_keeps_its_dealt_clients_in_its_checkpoint_and_resumes_on_them(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    import clients.app
    import server.app
    from splitfed.flower import checkpoint
    from tests.flower_fixtures import FakeGrid, inprocess_tiers

    first = _resume_settings(tmp_path, 1, resume=False)
    with inprocess_tiers(monkeypatch, 2):
        server.app.run(FakeGrid(clients.app.app, 3), first, progress=lambda line: None)
    kept = checkpoint.load(first.out).fleet
    assert kept == dealt_digest(fleet_for(first)) and kept.startswith(DEALT)
    assert kept[len(DEALT):] != fleet_digest("iot")  # the clients as dealt, not the file
    lines: list[str] = []
    with inprocess_tiers(monkeypatch, 2):
        server.app.run(FakeGrid(clients.app.app, 3), _resume_settings(tmp_path, 2, resume=True),
                       progress=lines.append)
    assert checkpoint.load(first.out).round == 2, lines


def test_a_checkpoint_of_the_old_draw_is_refused_before_anything_starts(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint from before the deal kept the fleet file's digest: with the file unchanged, the clients this
    splitfed deals may be other devices than its rounds were simulated and cut on. Refused, saying why and what to do; a changed file is still said
    as before."""
    import torch

    import splitfed.sim.runner
    from splitfed.cli import main
    from splitfed.flower import checkpoint

    monkeypatch.setattr(splitfed.sim.runner, "simulate", lambda *a, **k: pytest.fail("started"))
    settings = _resume_settings(tmp_path, 1, resume=False)
    checkpoint.save(settings.out, checkpoint.Checkpoint(1, {"w": torch.ones(2)}, settings.to_dict(),
                                                        fleet=fleet_digest("iot")))
    assert main(["simulate", "--resume", settings.out, "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert ("cannot resume: this splitfed deals the run's 3 client(s) out of fleet 'iot' otherwise than the one "
            "that wrote the checkpoint (each listed device in turn, no longer drawn with replacement)") in err, err
    assert err.rstrip().endswith("start the run over with --overwrite"), err
    checkpoint.save(settings.out, checkpoint.Checkpoint(1, {"w": torch.ones(2)}, settings.to_dict(),
                                                        fleet="0" * 64))  # an old checkpoint of another file
    assert main(["simulate", "--resume", settings.out, "--rounds", "3"]) == 2
    assert "cannot resume: the devices of fleet 'iot' changed since the checkpoint" in capsys.readouterr().err
