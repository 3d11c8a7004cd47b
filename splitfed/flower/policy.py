"""Assignment policies: who gets which cuts each round.

The ServerApp asks its policy for every sampled client's cuts before a round
and tells it what was measured after. :class:`StaticPolicy` never changes its
mind; the segment optimizer's adaptive and greedy policies (``splitfed.optimizer``)
satisfy the same protocol and plug in through :func:`make_policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from splitfed.errors import ConfigError, nearest

if TYPE_CHECKING:  # not at run time: the CLI parses ``verify --cuts`` here (parse_cuts), torch-free
    from splitfed.flower.config import RunSettings
    from splitfed.profile.devices import LinkProfile
    from splitfed.profile.speed import SpeedMeasure

Cuts = tuple[int, ...]


@dataclass(frozen=True)
class ClientInfo:
    """A registered client as the ServerApp knows it after the query round."""

    client_id: str  # "client<partition id>": stable across runs, unlike Flower's node ids
    node_id: int
    partition_id: int
    profile: str = ""  # device profile / fleet client name ("" when unknown)
    samples: int = 0
    link: LinkProfile | None = None  # its link to the edge as it measured it at registration
    speed: SpeedMeasure | None = None  # how fast it trained the model's first blocks then


@dataclass(frozen=True)
class Measurement:
    """What one client's round cost, as measured on the device and the wire."""

    client_id: str
    cuts: Cuts
    samples: int
    compute_s: float  # device compute (forward + backward + optimizer)
    link_s: float  # waiting on the chain: transfer plus the server tiers' compute
    bytes_up: int
    bytes_down: int
    rtt_s: float | None = None  # the device's round trip to its first tier (None: not measured)
    # a device that holds no block (it computed nothing) timed its training instead, when asked
    speed: SpeedMeasure | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cuts": list(self.cuts)}


@runtime_checkable
class AssignmentPolicy(Protocol):
    """Chooses each sampled client's cuts; learns from measurements between rounds."""

    def assign(self, round: int, clients: Sequence[ClientInfo]) -> dict[str, Cuts]: ...

    def observe(self, round: int, measurements: Sequence[Measurement]) -> dict[str, Any] | None:
        """Learn from round ``round``; what was decided for the next round, for the metrics (None: nothing)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for the checkpoint (a resumed run must choose alike)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


Clock = Callable[[int, Mapping[str, Cuts], Sequence[ClientInfo], Mapping[str, Cuts]], float | None]
"""``clock(round, assignment, clients, previous_assignment) -> simulated makespan (s)``:
the cost model's prediction of a round (moving weights included), used as
``sim_round_s`` in simulation. Deployment has none (``None``: times are measured)."""

Predictor = Callable[[Mapping[str, Cuts], Sequence[ClientInfo]], tuple[float, dict[str, float]] | None]
"""``predict(assignment, clients) -> (makespan s, each client's s)`` in real time, or None where the cost model
cannot price a device: the round of the clients ``assignment`` names (of ``clients``, the round's sample)."""


class StaticPolicy:
    """Fixed cuts: one option for everyone, or options dealt out by partition id.

    Several options make a heterogeneous static assignment: client ``p`` gets
    ``options[p % len(options)]``, the same in every round and every run.
    """

    def __init__(self, options: Sequence[Sequence[int]]) -> None:
        if not options:
            raise ConfigError("a static policy needs at least one cut vector")
        self.options: list[Cuts] = [tuple(int(k) for k in o) for o in options]

    def assign(self, round: int, clients: Sequence[ClientInfo]) -> dict[str, Cuts]:
        return {c.client_id: self.options[c.partition_id % len(self.options)] for c in clients}

    def observe(self, round: int, measurements: Sequence[Measurement]) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"options": [list(o) for o in self.options]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None  # the options come from the settings, which a resumed run keeps


def parse_cuts(text: str, prefix: str = "") -> list[Cuts]:
    """``"2,5"`` or ``"1,3/2,5"`` -> cut vectors: the one syntax of ``--cuts static:...`` and ``splitfed verify
    --cuts`` (integers split by ``,``, vectors split by ``/``). An empty vector (``1,3/``, ``1,3//2,5``) or cut
    (``2,,5``) is something left out: refused, not dropped. ``prefix`` (``static:``) stood before ``text``: the
    messages name the text and give examples as written."""
    shown, what = prefix + text, f"{prefix.removesuffix(':')} cuts".strip()
    like = f"integers like '{prefix}2,5' or '{prefix}1,3/2,5'"
    vectors = [v.strip() for v in text.split("/")]
    if not any(vectors):
        raise ConfigError(f"{what} need at least one cut vector, e.g. '{prefix}2,5', got {shown!r}")
    options = []
    for v in vectors:
        if not v:
            raise ConfigError(f"empty cut vector in {shown!r}: {what} are {like} (one vector per client)")
        if any(not k.strip() for k in v.split(",")):
            raise ConfigError(f"empty cut in {shown!r}: {what} are {like} (one vector per client)")
        try:
            options.append(tuple(int(k) for k in v.split(",")))
        except ValueError:
            raise ConfigError(f"{what} must be {like}, got {shown!r}") from None
    return options


def parse_static(text: str) -> list[Cuts]:
    """``--cuts static:TEXT``'s cut vectors (:func:`parse_cuts`)."""
    return parse_cuts(text, "static:")


PolicyFactory = Callable[[str, "RunSettings"], AssignmentPolicy]
"""``factory(ARG, settings)`` for ``--cuts NAME[:ARG]``; settings name the model, tiers and fleet."""
_FACTORIES: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make ``--cuts NAME[:ARG]`` build ``factory(ARG, settings)`` (the optimizer's seam)."""
    _FACTORIES[name] = factory


def _builtin(name: str) -> PolicyFactory:
    def factory(arg: str, settings: RunSettings) -> AssignmentPolicy:
        from splitfed.flower import adaptive

        if arg:
            raise ConfigError(f"cuts {name} takes no argument, got {name}:{arg}")  # --cuts, or a config's cuts
        return adaptive.AdaptivePolicy(settings) if name == "adaptive" else adaptive.GreedyPolicy(settings)

    return factory


_BUILTINS = {name: _builtin(name) for name in ("adaptive", "greedy")}  # (one a user registers instead may take one)
for _name, _factory in _BUILTINS.items():
    register_policy(_name, _factory)


def policy_name(cuts: str) -> tuple[str, str]:
    """``--cuts NAME[:ARG]`` as (NAME, ARG)."""
    name, _, arg = cuts.strip().partition(":")
    return name, arg


def check_policy(settings: RunSettings) -> None:
    """``--cuts``'s form checked without building a registered policy (which profiles the model): static cut
    vectors are parsed, any other name must be registered."""
    name, arg = policy_name(settings.cuts)
    if name not in _FACTORIES:
        make_policy(settings)  # static (parsed, no I/O), or refused as unknown
    elif arg and _FACTORIES[name] is _BUILTINS.get(name):  # before: "adaptive:0.1" passed here, refused only
        raise ConfigError(f"{name} takes no argument, got {name}:{arg}")  # once the run was set up


def make_policy(settings: RunSettings) -> AssignmentPolicy:
    """``static:K1,K2[/K1,K2...]`` or a registered name (``adaptive``, ``greedy``)."""
    spec = settings.cuts
    name, arg = policy_name(spec)
    if name == "static":
        options = parse_static(arg)
        for cuts in options:
            # it counts the blocks before the first cut (raw inputs never leave the device); U-shape cuts that
            # enter no server (all equal) keep the whole model there, checked against its size once profiled
            if cuts[0] < settings.min_device_blocks and not (settings.u_shape and cuts[0] == cuts[-1]):
                raise ConfigError(f"static cuts {','.join(map(str, cuts))} keep {cuts[0]} leading block(s) on the "
                                  f"device; min-device-blocks is {settings.min_device_blocks}: give a first cut "
                                  f"of at least {settings.min_device_blocks}")
        return StaticPolicy(options)
    if name in _FACTORIES:
        return _FACTORIES[name](arg, settings)
    raise ConfigError(f"unknown cut policy {spec!r}{_meant(spec)}: use "
                      f"{' | '.join(['static:K1,K2', *sorted(_FACTORIES)])}")


def _meant(spec: str) -> str:
    """`` (did you mean 'adaptive'?)`` for a misspelt policy word (``adaptiv``, ``statc:2,5``: its argument kept),
    or ``static:2,5`` for a bare cut vector (``verify --cuts`` takes one); "" when nothing is close."""
    name, _, arg = spec.strip().partition(":")
    near = nearest(name, ["static", *_FACTORIES])
    if near is not None:
        fixed = f"{near}:{arg or 'K1,K2'}" if near == "static" or arg else near  # static needs its vectors
        return f" (did you mean {fixed!r}?)"
    try:
        parse_cuts(spec.strip())
    except ConfigError:
        return ""
    return f" (did you mean {'static:' + spec.strip()!r}?)"
