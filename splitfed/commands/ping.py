"""``splitfed ping ADDRESS...``: reach tier servers, print what each is, and check them as a chain.

For each address: the tier's name, splitfed version and protocol, the tier it
forwards to and whether it reached it, what it holds, its idle release, and the
round-trip time of a bare call from here (the median of ``--count``) and, with
``--bandwidth``, the link's speed each way: measured from a device, the
``rtt_ms``, ``up_mbps`` and ``down_mbps`` of its fleet-file entry, which
``--fleet-entry NAME`` prints whole. Several
addresses are checked in chain order (edge first) exactly as a run checks its
``tier-addresses`` before round 1, and ``--model`` asks each tier whether it
would build that model (with ``--model-kwargs``, as the other commands take them). Exit 0: every tier answered (and the chain holds),
1: one did not (a host name that does not resolve is said as such) or the chain
is broken (so is one whose last tier given cannot reach its own --next), 2: bad arguments.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from splitfed.commands._args import (
    add_model_kwargs,
    model_spec,
    positive_int,
    shape,
    zoo_name_checked,
)
from splitfed.jsonio import dumps

if TYPE_CHECKING:
    import torch

    from splitfed.models.zoo import ModelSpec

SPEED_PASSES = 7  # --fleet-entry: measurements of the training rate, the fastest kept (see training_rate)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ping", help="reach tier servers, show what each is, check them as a chain",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("addresses", nargs="+", metavar="HOST:PORT", help="tier addresses, in chain order (edge first)")
    p.add_argument("--tls-ca", default="", metavar="F", help="PEM CA that signed the tiers' certificates")
    p.add_argument("--tls-cert", default="", metavar="F", help="PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key", default="", metavar="F", help="PEM key of --tls-cert")
    p.add_argument("--token-file", default="", metavar="F", help="bearer token the tiers require")
    p.add_argument("--model", default=None, help="also ask whether each tier would build this model")
    p.add_argument("--input-shape", type=shape, default=None, help="the model's input shape without batch")
    p.add_argument("--num-classes", type=positive_int, default=None)
    add_model_kwargs(p)
    p.add_argument("--round-timeout-s", type=float, default=None, metavar="S",
                   help="also check each tier keeps idle segments longer than a round of S seconds")
    p.add_argument("--compress", metavar="CODEC", default=None,
                   help="also check every forwarding tier sends with the codec a run would use for its onward "
                        "link (a run's compress, none by default): none | fp16 | int8 | topk:F (F >= 0.001) for every link, or "
                        "one per link, device's first (none,int8)")
    p.add_argument("--count", type=positive_int, default=5, help="round trips timed per tier (default 5)")
    p.add_argument("--bandwidth", action="store_true",
                   help="also measure each link's bandwidth up and down (Probe calls of up to 4 MiB)")
    p.add_argument("--fleet-entry", metavar="NAME",
                   help="with one address (the edge), print this host as a fleet file's [[device]] entry: its "
                        "training rate on --model (default cnn), timed here as a node of a run times itself (a "
                        f"batch of 32 on one thread, the fastest of {SPEED_PASSES} passes), its memory, and the "
                        "measured link")
    p.add_argument("--torch-device", default="cpu", metavar="DEV",
                   help="with --fleet-entry: time the training on cpu | cuda | cuda:N, as a node whose "
                        "torch-device it is computes (a Jetson's GPU); its memory is then that device's")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds to wait for each tier")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    zoo_name_checked(args.model)
    from splitfed.errors import ConfigError, TierError
    from splitfed.flower.transport import connect
    from splitfed.transport.address import parse_address, unresolvable
    from splitfed.transport.describe import TierInfo, check_chain
    from splitfed.transport.probe import measure_link
    from splitfed.transport.security import TlsConfig

    for flag, v in (("--timeout", args.timeout), ("--round-timeout-s", args.round_timeout_s)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{flag} must be a positive, finite number of seconds, got {v}")
    from splitfed.transport.client import MAX_DEADLINE_S, deadline_bound

    if args.timeout > MAX_DEADLINE_S:  # each call's deadline
        raise ConfigError(deadline_bound("--timeout", args.timeout))
    if args.compress is not None:
        from splitfed.cost.wire import link_codecs

        # before any tier is asked: the codecs themselves (each as many links as it names), then their number,
        # whose refusal alone says why ping needs every address: it counts the links from the addresses given
        link_codecs(args.compress, len(args.compress.split(",")), what="--compress")
        link_codecs(args.compress, len(args.addresses), what="--compress (a codec per link needs every address of "
                                                             "the chain)")
    for addr in args.addresses:  # every address before any is tried: a typo is no tier that is down
        parse_address(addr)
    if args.tls_ca or args.tls_cert or args.tls_key:
        if bool(args.tls_cert) != bool(args.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        TlsConfig(args.tls_cert or None, args.tls_key or None, args.tls_ca or None).check(
            ("--tls-cert", "--tls-key", "--tls-ca"), roles=("client",))
    if args.fleet_entry is not None and len(args.addresses) != 1:
        raise ConfigError("--fleet-entry measures this host's link to its edge: give exactly one address")
    if args.fleet_entry is not None and (not args.fleet_entry or any(c.isspace() for c in args.fleet_entry)):
        raise ConfigError(f"--fleet-entry: a device name must be non-empty, without spaces, got {args.fleet_entry!r}")
    if args.fleet_entry is not None:
        from splitfed.engine.compute import torch_device

        torch_device(args.torch_device)  # a GPU this host lacks is refused before any tier is asked
    elif args.torch_device != "cpu":
        raise ConfigError("--torch-device says where --fleet-entry times training: give it with --fleet-entry")
    shaping = [f for f, v in (("--input-shape", args.input_shape), ("--num-classes", args.num_classes),
                              ("--model-kwargs", args.model_kwargs)) if v is not None]
    if shaping and not args.model and args.fleet_entry is None:  # before: ignored, and the ping said nothing of it
        raise ConfigError(f"{', '.join(shaping)} shape{'s' if len(shaping) == 1 else ''} the model of --model (or "
                          "the one --fleet-entry times): give --model NAME, or leave "
                          f"{'it' if len(shaping) == 1 else 'them'} out")
    spec = model_spec(args) if args.model else None
    if spec is None and args.fleet_entry is not None:  # it times cnn then: --model-kwargs refused before any tier
        model_spec(args, "cnn")
    rows: list[dict[str, Any]] = []
    infos: list[TierInfo] = []
    for addr in args.addresses:
        unknown = unresolvable(addr, args.timeout)  # before: retried for seconds, then "no answer"
        if unknown:
            rows.append({"address": addr, "error": unknown, "resolved": False})
            continue
        client = connect(addr, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                         token_file=args.token_file, deadline_s=args.timeout)
        try:
            info = client.describe(spec)
            link = measure_link(client, args.count, args.timeout, bandwidth=args.bandwidth or bool(args.fleet_entry))
        except TierError as e:
            rows.append({"address": addr, "error": f"{e.code}: {e}"})
            continue
        finally:
            client.close()
        infos.append(info)
        rows.append({"address": addr, "rtt_ms": link.rtt_ms, "up_mbps": link.up_mbps, "down_mbps": link.down_mbps,
                     **info.to_dict()})
    problems = ""
    if len(infos) == len(args.addresses):
        try:
            # the last tier's own --next too: pinging an edge alone checks what it forwards to
            check_chain(args.addresses, infos, model=spec.name if spec else "", round_timeout_s=args.round_timeout_s,
                        compress=args.compress, listed="the addresses", onward=True)
        except ConfigError as e:
            problems = str(e)
    ok = len(infos) == len(args.addresses) and not problems
    if ok and args.fleet_entry is not None:
        print(_fleet_entry(args.fleet_entry, rows[0], args), end="")
        return 0
    if args.json:
        print(dumps({"ok": ok, "tiers": rows, "problems": problems}, indent=2))
    else:
        for row in rows:
            print(_describe(row))
        if problems:
            print(problems, file=sys.stderr)
        elif ok and len(rows) > 1:
            print("chain: " + " -> ".join(str(r["name"]) for r in rows) + " ok")
    return 0 if ok else 1


def _fleet_entry(name: str, row: dict[str, Any], args: argparse.Namespace) -> str:
    """This host as a ``[[device]]``: its training rate on the model, its memory, its link to ``row``."""
    from splitfed.engine.compute import describe, free_memory, torch_device
    from splitfed.profile.devices import DeviceProfile
    from splitfed.profile.fleet import device_entry
    from splitfed.units import MIB

    spec = model_spec(args, args.model or "cnn")
    where = torch_device(args.torch_device)
    gpu = where.type == "cuda"
    # what training can use, as the named profiles count it (a 4 GB Pi 4: ~2 GiB), not all of it: what is free
    # now, before the timing below allocates any (before: the RAM in all, twice a Pi's share)
    free, total = free_memory(where)
    flops = training_rate(spec, where=where)
    device = DeviceProfile(flops, free / MIB, row["up_mbps"], row["down_mbps"], row["rtt_ms"])
    to = f"to {row['name']} at {row['address']}"
    return device_entry(name, device, {
        "flops": (f"trains {spec.name} at this rate on {describe(where)}, as a node with that torch-device times "
                  "itself" if gpu else f"trains {spec.name} at this rate here (one thread, as a node times itself)"),
        "memory_mb": (f"free on {describe(where)} when measured, of {total / MIB:,.0f} MiB in all" if gpu
                      else f"this host's memory available when measured, of {total / MIB:,.0f} MiB in all"),
        "up_mbps": f"measured {to}", "down_mbps": f"measured {to}", "rtt_ms": f"measured {to}"})


def training_rate(spec: ModelSpec, batch: int = 32, passes: int = SPEED_PASSES,
                  where: torch.device | None = None) -> float:
    """This host's training FLOP/s on ``spec``, measured as a node of a run measures itself at registration:
    :func:`splitfed.profile.speed.measure_speed` on a batch, on one thread as a virtual client computes, turned
    into FLOP/s with the cost model's FLOPs (:func:`~splitfed.profile.speed.measured_flops`, as the coordinator
    does). Measured ``passes`` times, the fastest kept: a busy host stalls some passes (none runs faster than
    the device can), and a rate too low by a stall would make the optimizer plan for a device that much
    slower. Of the measurements that timed the most blocks: a stall while blocks are added stops the adding
    early, and a measurement of fewer blocks (the first conv without its pooling) is not the same rate.
    Torch's thread count is given back as it was. ``where``: the torch device a node computes on (cpu)."""
    import torch

    from splitfed.errors import ConfigError
    from splitfed.profile.profiler import default_cache_dir, profile_model
    from splitfed.profile.speed import measure_speed, measured_flops

    x = spec.example_input(batch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measures = [measure_speed(spec, x, where, reps=1) for _ in range(passes)]
    finally:
        torch.set_num_threads(threads)
    profile = profile_model(spec, batch, reps=1, cache_dir=default_cache_dir())  # its FLOP counts only: no times used
    most = max(m.blocks for m in measures)
    rates = [r for r in (measured_flops(profile, m) for m in measures if m.blocks == most) if r is not None]
    if not rates:
        raise ConfigError(f"model {spec.name}: no training rate measured on this host (its profile counts no "
                          "FLOPs in the blocks timed), so the fleet entry would lack flops: pick another --model")
    return max(rates)


def _describe(row: dict[str, Any]) -> str:
    if "error" in row:
        if row.get("resolved") is False:
            return f"{row['address']}: {row['error']}: check the name, or give the tier's IP address"
        return f"{row['address']}: no answer: {row['error']}"
    idle = row["idle_release_s"]
    speed = (f", up {row['up_mbps']:.4g} Mbit/s, down {row['down_mbps']:.4g} Mbit/s"
             if row.get("up_mbps") is not None else "")
    lines = [f"{row['name']} at {row['address']}: splitfed {row['version']} (protocol {row['protocol']}), "
             f"round trip {row['rtt_ms']:.2f} ms{speed}"]
    if row["next_address"]:
        reached = (f"not reached: {row['next_error']}" if row["next_error"]
                   else f"reached (instance {row['next_instance']})")
        codec = f", compressing with {row['next_compress']}" if row.get("next_compress") else ""
        lines.append(f"  forwards to {row['next_address']}{codec}: {reached}")
    else:
        lines.append("  ends the chain (computes the loss)")
    lines.append(f"  holds {row['segments']} segment(s) of {row['runs']} run(s); {row['steps_served']} step(s) "
                 f"served; up {row['uptime_s']:.0f} s; computes on {row.get('compute') or 'cpu'} with {row['threads']} "
                 "thread(s); releases idle segments after "
                 + (f"{idle:g} s" if idle else "never"))
    if row.get("control_token"):
        lines.append("  takes Load, Fetch, Release and Reduce only with the coordinator's token "
                     "(--coordinator-token-file)")
    if row["model_error"]:
        lines.append(f"  will not build the model: {row['model_error']}")
    return "\n".join(lines)
