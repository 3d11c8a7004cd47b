"""``splitfed tier``: serve one tier (edge or cloud) of the chain over gRPC until stopped.

Prints ``listening on HOST:PORT`` once it serves (so a parent may ask for port
0); stops on SIGTERM / SIGINT / SIGHUP, and with ``--exit-with-stdin`` when its stdin
closes (how :class:`~splitfed.transport.process.TierProcess` makes sure a tier
never outlives the process that started it).
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from splitfed.commands._args import bounded_int, non_negative_float, positive_int
from splitfed.engine.limits import (
    DEFAULT_LIMITS,
    IDLE_RELEASE_S,
    MOST_MB,
    STREAM_IDLE_S,
    STREAM_MIN_BYTES_S,
    BuildLimits,
    set_limits,
)
from splitfed.errors import ConfigError, Terminated
from splitfed.ports import READY


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tier", help="serve an edge or cloud tier over gRPC",
                       description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("edge", "cloud"), default=None,
                   help="edge forwards to --next; cloud ends the chain (default: edge with --next, else cloud)")
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to serve on (port 0: any)")
    p.add_argument("--next", dest="next_address", metavar="HOST:PORT", help="the next tier of the chain")
    p.add_argument("--name", default=None, help="tier name in messages and logs (default: the role)")
    p.add_argument("--tls-cert", metavar="F", help="PEM certificate chain of this tier")
    p.add_argument("--tls-key", metavar="F", help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", metavar="F", help="PEM CA: require client certificates it signed (mutual TLS), "
                   "and verify the next tier with it")
    p.add_argument("--token-file", metavar="F", help="bearer token every caller must present (and that this "
                   "tier presents to --next); with --coordinator-token-file, the devices' token: steps only")
    p.add_argument("--coordinator-token-file", metavar="F",
                   help="bearer token that alone allows loading, fetching, reducing and releasing segments (the "
                        "coordinator's; another than --token-file). Without it, any caller with --token-file's "
                        "token may, so a device could claim a client's segment before the coordinator loads it")
    p.add_argument("--insecure", action="store_true", help="serve without TLS (explicit choice)")
    p.add_argument("--compress", default="none", help="codec towards --next: none, fp16, int8, topk:F (F >= 0.001)")
    p.add_argument("--deadline", type=float, default=60.0, help="seconds per call to --next")
    p.add_argument("--max-workers", type=positive_int, default=32, help="concurrent calls served")
    p.add_argument("--max-tensor-mb", type=positive_int, default=512,
                   help="largest tensor accepted, MiB (at most what one call's messages carry)")
    p.add_argument("--max-model-mb", type=bounded_int(1, MOST_MB), default=DEFAULT_LIMITS.model_bytes >> 20,
                   help="largest model (parameters) this tier builds, MiB (default: %(default)s)")
    p.add_argument("--max-sample-mb", type=bounded_int(1, MOST_MB), default=DEFAULT_LIMITS.sample_bytes >> 20,
                   help="largest tensor a model may make per sample, MiB (default: %(default)s)")
    p.add_argument("--max-held-mb", type=bounded_int(0, MOST_MB), default=0, metavar="N",
                   help="what the segments of every client and run may hold at once, MiB (weights, gradients "
                        "and optimizer state); a load beyond is refused (default 0: three quarters of the "
                        "memory of --torch-device)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--torch-device", default="cpu", metavar="DEV",
                   help="where this tier computes: cpu, cuda or cuda:N (default: cpu); what crosses the wire "
                        "is the same either way")
    p.add_argument("--idle-release-s", type=non_negative_float, default=IDLE_RELEASE_S, metavar="S",
                   help="release a client's segment nobody has used for S seconds: what a vanished coordinator "
                        "left behind (default %(default).0f; 0: never). Keep it above your longest round")
    p.add_argument("--stream-idle-s", type=non_negative_float, default=STREAM_IDLE_S, metavar="S",
                   help="cancel a stream that stops making progress: a request that sends nothing, or a reply "
                        "nobody reads, for S seconds (each holds a worker thread; default %(default).0f; 0: "
                        "never). Keep it above one message's time on your slowest link")
    p.add_argument("--stream-min-kbps", type=non_negative_float, default=STREAM_MIN_BYTES_S * 8 / 1000,
                   metavar="K", help="and one that moves less than K kbit/s on average, e.g. empty frames "
                   "(default %(default).0f: a fifth of the slowest link of the shipped device profiles; 0: "
                   "any frame is progress)")
    p.add_argument("--status-every-s", type=non_negative_float, default=300.0, metavar="S",
                   help="log what the tier holds and has served every S seconds, when it changed "
                        "(default %(default).0f; 0: never)")
    p.add_argument("--allow-model", action="append", default=[], metavar="MODULE:FACTORY",
                   help="serve this non-zoo model factory too (repeatable)")
    p.add_argument("--no-malloc-tuning", action="store_true",
                   help="let glibc return freed buffers to the OS after each step (see splitfed.transport.memory)")
    p.add_argument("--exit-with-stdin", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # first of all: a Ctrl-C while torch imports (a second or more) was raised inside its C++ import, which
    # aborted the process (SIGABRT, "Fatal Python error") or lost it (the tier went on serving)
    with _stop_on_signals() as (stop, caught):
        return _run(args, stop, caught)


def _run(args: argparse.Namespace, stop: threading.Event, caught: list[int]) -> int:
    from splitfed.transport.address import parse_address
    from splitfed.transport.codec import Codec
    from splitfed.transport.security import TlsConfig, read_tokens
    from splitfed.transport.server import parse_listen

    role = args.role or ("edge" if args.next_address else "cloud")
    if role == "cloud" and args.next_address:
        raise ConfigError("a cloud tier ends the chain: drop --next or use --role edge")
    if role == "edge" and args.next_address is None:
        raise ConfigError("an edge tier forwards to the next tier: give --next HOST:PORT, or drop --role edge "
                          "(a tier without --next ends the chain: a cloud tier; --name names it)")
    parse_listen(args.listen, "--listen address")
    if args.next_address is not None:
        parse_address(args.next_address, "--next address")
    # checked whether or not there is a --next, so that a typo never waits for the day one is added
    try:
        Codec.parse(args.compress)
    except ConfigError as e:
        raise ConfigError(f"--compress: {e}") from None
    if not (math.isfinite(args.deadline) and args.deadline > 0):
        raise ConfigError(f"--deadline must be a positive, finite number of seconds, got {args.deadline}")
    from splitfed.transport.client import MAX_DEADLINE_S, deadline_bound

    if args.deadline > MAX_DEADLINE_S:  # its next hop's calls take it: refused here, not by each call
        raise ConfigError(deadline_bound("--deadline", args.deadline))
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        if args.insecure:
            raise ConfigError("--insecure contradicts --tls-*: choose one")
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("TLS needs --tls-cert and --tls-key (--tls-ca adds mutual TLS)")
        tls = TlsConfig(args.tls_cert, args.tls_key, args.tls_ca)
        tls.check(("--tls-cert", "--tls-key", "--tls-ca"), roles=("server",))  # before serving: gRPC would only fail to bind
    elif not args.insecure:
        raise ConfigError("refusing to serve without TLS: give --tls-cert and --tls-key (and --tls-ca for mutual "
                          "TLS), or --insecure to serve in plaintext on purpose")
    token, coordinator_token = read_tokens(args.token_file, args.coordinator_token_file)
    import torch

    from splitfed.engine import compute

    compute.torch_device(args.torch_device)  # before anything is served: a typo or a missing GPU is one line

    from splitfed.transport import wire
    from splitfed.transport.server import serve_tier

    most = wire.Limits().stream_bytes >> 20
    if args.max_tensor_mb > most:  # above it, a limit no tensor could reach, and past 2**43 every Describe failed
        raise ConfigError(f"--max-tensor-mb must be at most {most} (MiB: what one call's messages carry), got "
                          f"{args.max_tensor_mb}")

    if not args.no_malloc_tuning:
        from splitfed.transport.memory import keep_freed_memory

        keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    if stop.is_set():  # a signal while it started: it stops before it serves, as a signal then would have
        raise KeyboardInterrupt() if caught[-1] == signal.SIGINT else Terminated()
    set_limits(BuildLimits(args.max_model_mb << 20, args.max_sample_mb << 20, args.max_held_mb << 20))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {args.name or role} %(levelname)s %(message)s")
    logging.getLogger("splitfed").setLevel(logging.INFO)  # the tier's status lines; libraries stay at WARNING
    if tls is not None:  # wrong for some peers only: said at start, not refused
        for doubt in tls.doubts(("--tls-cert", "--tls-key", "--tls-ca"), forwards=args.next_address is not None):
            logging.getLogger(__name__).warning("%s", doubt)
    limits = wire.Limits(max_tensor_bytes=args.max_tensor_mb << 20,
                         max_call_bytes=max(1 << 30, 2 * (args.max_tensor_mb << 20)))
    server = serve_tier(args.name or role, args.listen, args.next_address, tls=tls, token=token,
                        coordinator_token=coordinator_token,
                        insecure=args.insecure, max_workers=args.max_workers, limits=limits,
                        next_compress=args.compress, next_deadline_s=args.deadline,
                        allowed_models=args.allow_model, idle_release_s=args.idle_release_s or None,
                        status_every_s=args.status_every_s or None, torch_device=args.torch_device,
                        stream_idle_s=args.stream_idle_s or None,
                        stream_min_bytes_s=args.stream_min_kbps * 1000 / 8)
    if args.exit_with_stdin:
        def stop_at_eof() -> None:
            sys.stdin.buffer.read()
            stop.set()

        threading.Thread(target=stop_at_eof, daemon=True).start()
    print(f"{READY}{server.address} (computing on {compute.describe(server.tier.torch_device)})", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop(grace=2.0)
    logging.getLogger("splitfed").info("stopped (%s)", signal.Signals(caught[-1]).name if caught else "stdin closed")
    return 0


@contextmanager
def _stop_on_signals() -> Iterator[tuple[threading.Event, list[int]]]:
    """An event SIGTERM, SIGINT and SIGHUP set (and the signals caught, in order) instead of raising, while the
    command runs: a tier stops between calls, not inside one. SIGHUP is SIGTERM's kind of stop (the terminal of a
    tier started by hand closed), not a death without its "stopped" line. A signal is left ignored where it is
    (SIGINT in a background job: Ctrl-C is not for it; SIGHUP under nohup); the handlers before are put back after
    (a caller's, in process), and none is set off the main thread (Python allows it only there: a caller's thread
    gets the event alone)."""
    stop = threading.Event()
    caught: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        caught.append(signum)
        stop.set()

    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)} if main else {}
    try:
        for sig, handler in before.items():
            if handler is not signal.SIG_IGN:
                signal.signal(sig, on_signal)
        yield stop, caught
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
