"""What a tier says about itself (the ``Describe`` RPC), and the checks of a chain before round 1.

A chain is set up by hand across machines: ``splitfed tier --next`` on each
tier, ``tier-addresses`` at the coordinator. When those disagree (the edge
forwards to another cloud, a tier misses ``--next``, the addresses are in the
wrong order), or a tier runs another splitfed version, or cannot build the
run's model, every client used to fail in round 1 with a message about its own
step. :func:`check_chain` finds each of these from the tiers' descriptions
and names the tier, its address and the fix, before anything is loaded.
Tiers are told apart by ``instance`` (random per process), not by address: the
coordinator and the edge may reach the cloud under different names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import splitfed
from splitfed.errors import ConfigError
from splitfed.transport.pb import pb

PROTOCOL = 5
"""The wire protocol's version: raise it whenever tier.proto changes what an older peer would misread.

2: a binding secret on every Load, Step, Fetch and Release (an older peer would drop it and be refused).
3: a Load may carry a base replica instead of its state (an older tier would drop it and load the replica's
weights unchanged), Reduce sums the clients' trained segments on the tier (an older one has no such call), and a
Fetch may name a range of the segment's blocks (an older tier would send the whole segment).
4: a Reduce reply holds the clients' sample-weighted mean per key (float32 for weights of 32 bits or fewer,
float64 for the rest), not its float64 sum: the coordinator multiplies it by the weight it knows is behind each
key (a protocol 3 coordinator would take a mean for a sum, and refuse its float32).
5: top-k keeps ceil(F x n) values for the decimal F its fraction reads as (``codec.topk_count``), not for the
float product: an older peer sends or expects one value more where they differ (topk:0.07 of 100 values: 8, not
7) and refuses the other's payload."""


@dataclass(frozen=True)
class TierInfo:
    """A tier's answer to ``Describe`` (see ``TierInfo`` in tier.proto)."""

    protocol: int
    version: str
    name: str
    instance: str
    next_address: str = ""
    next_instance: str = ""
    next_error: str = ""
    idle_release_s: float | None = None  # None: never
    max_clients: int = 0
    max_model_bytes: int = 0
    max_sample_bytes: int = 0
    max_tensor_bytes: int = 0
    allowed_models: tuple[str, ...] = ()
    model_error: str = ""
    segments: int = 0
    runs: int = 0
    steps_served: int = 0
    uptime_s: float = 0.0
    threads: int = 0
    compute: str = ""  # "cpu" or "cuda:0 (NVIDIA H200)"; "": a tier older than the field (the CPU)
    next_compress: str = ""  # its codec towards next_address (--compress); "": no next tier, or an older tier
    control_token: bool = False  # the control calls need the coordinator's token (False also: an older tier)

    def to_pb(self) -> pb.TierInfo:
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        fields["idle_release_s"] = self.idle_release_s or 0.0
        fields["allowed_models"] = list(self.allowed_models)
        return pb.TierInfo(**fields)

    @classmethod
    def from_pb(cls, m: pb.TierInfo) -> TierInfo:
        """A peer's description; ValueError naming the field of a value no tier has (a negative count or limit, an
        idle release that is negative or not a number: read as "never", it skipped the round-timeout check)."""
        fields = {k: getattr(m, k) for k in cls.__dataclass_fields__}
        for k in _COUNTS:
            if fields[k] < 0:
                raise ValueError(f"{k} must be >= 0, got {fields[k]}")
        for k in ("idle_release_s", "uptime_s"):
            if not (math.isfinite(fields[k]) and fields[k] >= 0):
                raise ValueError(f"{k} must be a finite number of seconds >= 0"
                                 f"{' (0: never)' if k == 'idle_release_s' else ''}, got {fields[k]}")
        idle = float(m.idle_release_s)
        fields["idle_release_s"] = idle if idle > 0 else None
        fields["allowed_models"] = tuple(m.allowed_models)
        return cls(**fields)

    def to_dict(self) -> dict[str, object]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in ((k, getattr(self, k)) for k in self.__dataclass_fields__)}


_COUNTS = ("max_clients", "max_model_bytes", "max_sample_bytes", "max_tensor_bytes", "segments", "runs", "steps_served",
           "threads")
"""The whole-number fields of a description but its protocol (another protocol is check_chain's to name): counts, and
limits (0: not said, by an older tier)."""


def _codec_name(name: str) -> str:
    """A codec's canonical name (``topk:0.10`` is ``topk:0.1``); a name no codec has, as given."""
    from splitfed.transport.codec import Codec

    try:
        return Codec.parse(name).name
    except ConfigError:
        return name


def this_version() -> str:
    return f"splitfed {splitfed.__version__} (protocol {PROTOCOL})"


def _loops(info: TierInfo, infos: Sequence[TierInfo]) -> bool:
    """Whether forwarding from ``info`` through the tiers of ``infos`` comes back to it (a tier wired to itself, or
    a cycle): only such a chain is a loop, not one whose tiers are listed out of order."""
    by_instance = {i.instance: i for i in infos}
    nxt, seen = info.next_instance, set()
    while nxt and nxt in by_instance and nxt not in seen:
        if nxt == info.instance:
            return True
        seen.add(nxt)
        nxt = by_instance[nxt].next_instance
    return False


def _wired_order(infos: Sequence[TierInfo]) -> list[int] | None:
    """The positions of ``infos`` in the order their ``--next`` wires them, where that is one chain through every
    tier listed (its last may forward to one not listed); None where it is not: a tier twice, a loop, a tier that
    did not reach its next, tiers of two chains."""
    at = {info.instance: j for j, info in enumerate(infos)}
    if len(at) != len(infos):
        return None
    after = [at.get(info.next_instance) if info.next_instance else None for info in infos]
    heads = set(range(len(infos))) - {j for j in after if j is not None}
    if len(heads) != 1:
        return None
    order = [heads.pop()]
    while (j := after[order[-1]]) is not None and len(order) <= len(infos):
        order.append(j)
    return order if sorted(order) == list(range(len(infos))) else None


def check_chain(addresses: Sequence[str], infos: Sequence[TierInfo], *, model: str = "",
                round_timeout_s: float | None = None, compress: str | None = None,
                coordinator_token: bool | None = None, listed: str = "tier-addresses",
                onward: bool = False) -> None:
    """Refuse a chain its coordinator could not train through; every problem found, in one error.

    ``addresses`` are the coordinator's (``tier-addresses``, chain order) and
    ``infos`` what each tier answered. ``model`` names the model the tiers were
    asked about (their ``model_error`` says why they would refuse it);
    ``round_timeout_s`` is checked against each tier's idle release. ``compress`` is the run's codec, one for
    every link or one per link (device -> first tier first): a tier that forwards with another ``--compress``
    than its onward link's is refused (one that does not say, older than ``next_compress``, is not).
    ``coordinator_token`` says whether the coordinator presents a coordinator token (None: not checked): without
    one, a tier whose control calls need it would refuse every Load of round 1.
    ``listed`` names the addresses in messages (a run's ``tier-addresses``, ping's arguments). ``onward``: the
    last tier must reach its own ``--next`` too (ping: the chain goes on past the addresses given; a run's last
    tier computes the loss and forwards nothing).
    """
    if len(addresses) != len(infos):
        raise ValueError(f"{len(addresses)} addresses but {len(infos)} descriptions")
    from splitfed.cost.wire import link_codecs

    given = list(addresses)
    codecs = None if compress is None else link_codecs(compress, len(addresses))
    problems: list[str] = []
    order = _wired_order(infos)
    if order is not None and order != sorted(order):  # the right tiers, listed out of order: no wiring to change
        problems.append("the tiers are listed out of chain order: their --next wires them "
                        + " -> ".join(f"{infos[j].name} at {addresses[j]}" for j in order)
                        + f"; give {listed} in that order")
        addresses, infos = [addresses[j] for j in order], [infos[j] for j in order]  # the rest checked as wired
    seen: dict[str, str] = {}
    for i, (addr, info) in enumerate(zip(addresses, infos, strict=True)):
        at = f"tier {info.name} at {addr}"
        if info.protocol != PROTOCOL:
            problems.append(f"{at} runs splitfed {info.version or '?'} (protocol {info.protocol}), this "
                            f"coordinator {this_version()}: run one splitfed version on every machine")
        if info.instance in seen:
            problems.append(f"{addr} and {seen[info.instance]} reach the same tier process ({info.name}): "
                            f"each position of {listed} needs its own tier")
        seen.setdefault(info.instance, addr)
        earlier = [j for j in range(i + 1) if info.next_instance and infos[j].instance == info.next_instance]
        if earlier and _loops(info, infos):  # forwarding would go round the chain until the deadline
            back = "itself" if earlier[0] == i else f"tier {infos[earlier[0]].name} at {addresses[earlier[0]]}"
            problems.append(f"{at} forwards back to {back} ({info.next_address}): the chain is a loop; give it "
                            "--next the following tier, or none if it ends the chain")
        if coordinator_token is False and info.control_token:
            problems.append(f"{at} takes Load, Fetch, Release and Reduce only with the coordinator's token (it was "
                            "started with --coordinator-token-file): give this run coordinator-token-file (a file "
                            "holding the same token)")
        if model and info.model_error:
            problems.append(f"{at} will not build model {model!r}: {info.model_error}")
        if (round_timeout_s is not None and info.idle_release_s is not None
                and info.idle_release_s < round_timeout_s):
            problems.append(f"{at} releases segments idle for {info.idle_release_s:g} s, less than this run's "
                            f"round-timeout-s {round_timeout_s:g}: a slow round could lose its segments; start the "
                            f"tier with a larger --idle-release-s or lower round-timeout-s")
        unreached = f"{at} cannot reach its next tier {info.next_address}: {info.next_error}"
        if i + 1 < len(infos):
            nxt_addr, nxt = addresses[i + 1], infos[i + 1]
            if not info.next_address:
                problems.append(f"{at} ends the chain (no --next), but {listed} continue to {nxt_addr}: "
                                f"start it with --next {nxt_addr}, or check the order of {listed}")
            elif info.next_error:
                problems.append(unreached)
            elif info.next_instance != nxt.instance:
                problems.append(f"{at} forwards to {info.next_address}, which is not the tier at {nxt_addr} "
                                f"({nxt.name}): start it with --next {nxt_addr}, or list its next tier in "
                                f"{listed}")
            if codecs is not None and info.next_address and info.next_compress:
                want, has = codecs[i + 1], _codec_name(info.next_compress)
                if want != has:
                    link = "every link" if len(set(codecs)) == 1 else f"that link (link {i + 2} of the chain)"
                    problems.append(f"{at} sends to its next tier with --compress {has}, but this run compresses "
                                    f"{link} with {want}: restart it with --compress {want}")
        elif onward and info.next_error:
            problems.append(unreached)
    if problems:
        raise ConfigError("the tier chain " + " -> ".join(given) + " cannot run: " + "; ".join(problems))

