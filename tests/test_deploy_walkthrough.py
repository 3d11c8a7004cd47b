"""Defects found by following README's "Deploy on real devices" literally, as an operator would; each test
failed before its fix: the README's Flower config had a relative root-certificates path (Flower refuses it),
a token the tier does not hold was refused without naming the file or flag to fix, a wrong CA put gRPC's own
log lines (one per retry) on stderr beside splitfed's one line, and server.deploy named itself twice."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from splitfed.errors import SplitfedError
from splitfed.flower.config import RunSettings
from splitfed.sim.tiers import tier_chain
from splitfed.transport.security import TlsConfig
from splitfed.transport.server import serve_tier
from tests.transport_fixtures import _write, make_ca, make_leaf

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _deploy_section() -> str:
    section = re.search(r"## Deploy on real devices\n(.*?)\n## ", README, re.S)
    assert section is not None
    return section.group(1)


def test_the_readme_flwr_config_toml_is_one_flower_accepts() -> None:
    import tomllib

    from flwr.cli.flower_config import parse_superlink_connection

    heredoc = re.search(r"cat > ~/\.flwr/config\.toml <<'TOML'\n(.*?)\nTOML\n", _deploy_section(), re.S)
    assert heredoc is not None
    config = tomllib.loads(heredoc.group(1))
    name = config["superlink"]["default"]
    parse_superlink_connection(config["superlink"][name], name)  # ValueError: what `flwr run` prints and exits 1 on


def test_a_coordinator_token_the_tier_does_not_know_is_refused_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("devices-token\n")
    (tmp_path / "coord-token").write_text("coordinator-token\n")
    with serve_tier("cloud", insecure=True, token="devices-token") as cloud:  # no coordinator token
        s = RunSettings(model="cnn", rounds=1, clients=1, tiers=2, tier_addresses=cloud.address, sim_clock=False,
                        token_file=str(tmp_path / "token"), coordinator_token_file=str(tmp_path / "coord-token"))
        with pytest.raises(SplitfedError) as e:
            with tier_chain(s):
                pass
    assert "coordinator-token-file" in str(e.value), str(e.value)


def test_a_wrong_devices_token_is_refused_naming_the_token_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``splitfed ping``'s ``main``, in this process (a new interpreter only cost seconds of imports; gRPC's own
    log lines, which only a process of its own shows, are the wrong-CA test's)."""
    from splitfed.cli import main

    wrong = tmp_path / "old-token"
    wrong.write_text("rotated-away\n")
    with serve_tier("edge", insecure=True, token="current") as edge:
        code = main(["ping", edge.address, "--token-file", str(wrong), "--count", "1"])
    p = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert p.returncode == 1
    out = p.stdout + p.stderr
    assert "UNAUTHENTICATED" in out
    assert "--token-file" in out or str(wrong) in out, out


def test_a_wrong_ca_is_reported_without_grpc_core_log_lines(tmp_path: Path) -> None:
    ca_key, ca = make_ca("walkthrough CA")
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _, other = make_ca("another CA")
    (tmp_path / "other-ca.pem").write_bytes(other.public_bytes(serialization.Encoding.PEM))
    tier_cert, tier_key = _write(tmp_path / "tier", *make_leaf("tier", ca_key, ca))
    me_cert, me_key = _write(tmp_path / "me", *make_leaf("me", ca_key, ca))
    (tmp_path / "token").write_text("t\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}  # as an operator's shell has it
    with serve_tier("cloud", tls=TlsConfig(tier_cert, tier_key, tmp_path / "ca.pem"), token="t") as cloud:
        p = subprocess.run([sys.executable, "-m", "splitfed.cli", "ping", cloud.address,
                            "--tls-ca", str(tmp_path / "other-ca.pem"), "--tls-cert", str(me_cert),
                            "--tls-key", str(me_key), "--token-file", str(tmp_path / "token"), "--count", "1"],
                           capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in p.stdout + p.stderr
    noise = [line for line in p.stderr.splitlines() if re.search(r"\.cc:\d+\]", line)]
    assert not noise, "\n".join(noise)


def test_deploy_names_itself_once_in_an_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Deploy's ``main``, in this process: the refusal comes before anything starts (a new interpreter only cost
    its imports; ``python -m server.deploy`` runs ``main`` in the real deployment tests)."""
    from server.deploy import main

    code = main(["--out", str(tmp_path / "run"), "--set", "compress=bogus"])
    p = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert p.returncode == 2
    assert p.stderr.strip().startswith("deploy: error: ") and "deploy: error: deploy:" not in p.stderr, p.stderr
