"""The server tiers of a run: connect to given addresses, or start edge and cloud processes.

Started tiers listen on 127.0.0.1, all started at once (the ports of all but the edge
chosen before they start, so the edge can be pointed at its next tier); they are stopped when the ``with``
block ends, whichever way it ends (return, error, Ctrl-C). Each started tier
that forwards gets the run's codec for the link to its next tier (its
``--compress``; ``compress`` names one codec for every link or one per link), so
that each link carries what the in-process backend and the cost model price;
tiers given by address are checked for it (:func:`check_tiers`).

Started tiers also get a coordinator token (``--coordinator-token-file``: the
run's ``coordinator-token-file``, or one made for the run in a private
temporary file, removed when the block ends): only the run's coordinator may
load, fetch, release and sum their segments, whatever token its devices hold. The
control clients of :func:`tier_chain` present it (or, for tiers given by
address without ``coordinator-token-file``, ``token-file``).
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from splitfed.engine.limits import IDLE_RELEASE_S
from splitfed.engine.link import TierControl
from splitfed.errors import ConfigError, TierError
from splitfed.flower.config import RunSettings
from splitfed.flower.transport import connect

if TYPE_CHECKING:
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.describe import TierInfo


DESCRIBE_S = 30.0  # the most a tier may take to describe itself (it may build the run's model to size it)
INSTANCE_DESCRIBE_S = 10.0  # the most a tier may take to say its instance at a round's start (no model to build)


def tier_names(server_tiers: int) -> list[str]:
    """Chain order: ``edge``, ``tier2`` ... , ``cloud`` (a single server tier is the edge)."""
    if server_tiers == 1:
        return ["edge"]
    return ["edge", *[f"tier{i}" for i in range(2, server_tiers)], "cloud"]


@dataclass
class TierChain:
    addresses: list[str]  # chain order, edge first
    controls: list[TierControl] = field(default_factory=list)  # one control client per tier
    pids: list[int] = field(default_factory=list)  # processes started here (empty: external tiers)
    infos: list[TierInfo] = field(default_factory=list)  # what each tier said of itself (the chain check)
    coordinator_token_file: str = ""  # the token the control clients present ("": the run's token-file)


@contextmanager
def start_tiers(settings: RunSettings) -> Iterator[TierChain]:
    """Start ``settings.tiers - 1`` tier processes on 127.0.0.1 (or use ``tier-addresses``)."""
    if settings.addresses:
        yield TierChain(list(settings.addresses), coordinator_token_file=settings.coordinator_token_file)
        return
    from splitfed.engine.compute import torch_device
    from splitfed.models.zoo import ZOO
    from splitfed.transport.process import local_chain
    from splitfed.transport.security import TlsConfig

    torch_device(settings.tier_torch_device, "tier-torch-device")  # this machine has it: one line, none started

    tls = (TlsConfig(cert=settings.tls_cert, key=settings.tls_key, ca=settings.tls_ca or None)
           if settings.tls_cert else None)
    # a segment idles at most one round (load to fetch): never let the tiers release one mid-round
    idle = max(IDLE_RELEASE_S, 2 * settings.round_timeout_s)
    allow = () if settings.model in ZOO else (settings.model,)  # the run's own module:factory model
    with ExitStack() as stack:
        coordinator = settings.coordinator_token_file
        if not coordinator:  # one of the run's own: no device (token-file holder) loads, fetches or releases
            fd, coordinator = tempfile.mkstemp(prefix="splitfed-coordinator-token-")
            stack.callback(Path(coordinator).unlink, missing_ok=True)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
        names = tier_names(settings.tiers - 1)  # tier i sends to tier i + 1 over link i + 1 (link 0: the device's)
        procs = stack.enter_context(local_chain(
            names, settings.codecs[1:], tls=tls, client_tls=tls, token_file=settings.token_file or None,
            insecure=tls is None, coordinator_token_file=coordinator, allow_models=allow,
            extra_args=["--idle-release-s", f"{idle:g}", "--torch-device", settings.tier_torch_device]))
        chain = TierChain([p.address for p in procs], pids=[p.pid for p in procs],
                          coordinator_token_file=coordinator)
        yield chain


@contextmanager
def tier_chain(settings: RunSettings) -> Iterator[TierChain]:
    """The run's tiers (started if need be) with a control client connected to each, checked as a chain
    (:func:`~splitfed.transport.describe.check_chain`) before anything is loaded."""
    with start_tiers(settings) as chain, ExitStack() as stack:
        clients = []
        for addr in chain.addresses:
            c = connect(addr, tls_ca=settings.tls_ca, tls_cert=settings.tls_cert, tls_key=settings.tls_key,
                        token_file=chain.coordinator_token_file or settings.token_file,
                        deadline_s=settings.round_timeout_s)
            stack.callback(c.close)
            clients.append(c)
        chain.infos.extend(check_tiers(settings, chain.addresses, clients,
                                       coordinator_token=bool(chain.coordinator_token_file)))
        chain.controls.extend(clients)
        yield chain


def check_restarted(settings: RunSettings, chain: TierChain, clients: list[GrpcTierClient]) -> str:
    """The edge's instance now (a shallow Describe of each tier, asked at each round's start).

    A tier whose instance is not the one last checked was restarted, perhaps with other flags (``--compress``,
    ``--idle-release-s``, ``--next``, another splitfed): the chain is checked again as before round 1
    (:func:`check_tiers`, ``chain.infos`` then its answers), and ConfigError names the restarted tier when it
    cannot run. Only the edge's silence raises (as before); another tier's is left to the round's loads."""
    now = [_instance_now(c, info.instance, edge=i == 0)
           for i, (c, info) in enumerate(zip(clients, chain.infos, strict=True))]
    new = [f"tier {info.name} at {addr} restarted (instance {info.instance}, now {inst})"
           for addr, info, inst in zip(chain.addresses, chain.infos, now, strict=True) if inst != info.instance]
    if not new:
        return now[0]
    try:
        infos = check_tiers(settings, chain.addresses, clients, coordinator_token=bool(chain.coordinator_token_file))
    except ConfigError as e:
        raise ConfigError(f"{', '.join(new)} since the chain was checked, and {e}") from None
    chain.infos[:] = infos
    return infos[0].instance


def _instance_now(client: GrpcTierClient, last: str, *, edge: bool) -> str:
    """A tier's instance (shallow Describe); a tier behind the edge that does not answer: ``last``."""
    try:
        return client.describe(deadline_s=INSTANCE_DESCRIBE_S, shallow=True).instance
    except TierError:
        if edge:
            raise
        return last


def check_tiers(settings: RunSettings, addresses: list[str], clients: list[GrpcTierClient], *,
                coordinator_token: bool | None = None) -> list[TierInfo]:
    """Ask every tier what it is, and refuse a chain this run could not train through (one error, all reasons),
    among them a tier whose codec towards its next tier (its ``--compress``) is not the run's for that link, and
    (``coordinator_token``: whether the control clients hold one) a tier that needs the coordinator's token."""
    from splitfed.transport.describe import check_chain

    spec = settings.spec
    infos = [c.describe(spec, deadline_s=DESCRIBE_S) for c in clients]
    check_chain(addresses, infos, model=spec.name, round_timeout_s=settings.round_timeout_s,
                compress=settings.compress, coordinator_token=coordinator_token)
    return infos
