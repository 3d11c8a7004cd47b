"""gRPC transport vs in-process and vs bare gRPC, measured side by side in one run.

(a) split training steps/s, gRPC loopback (the edge tier in its own process)
    vs in-process: vgg11, batch 64, cut after the 2nd pool (block 4), device |
    edge, one torch thread everywhere; steps/s is 1 / the median step time.
    Target: ratio >= 0.9.
(b) the Step RPC's effective MB/s (activation up + gradient down) for 1, 8 and
    32 MB activations, vs a bare gRPC bytes echo of the same size to the same
    server process: unary (one message each way) and streamed (the same chunks,
    reply after the whole request, as a step must). The tier answers with the
    activation as its gradient after the tier's checks of it (dtype, shape,
    finite values), so (b) measures transport only: framing, codec, validation,
    gRPC. Also a sweep of (chunk, unary) sizes, in rotating order, for every
    size (``--sizes-mb``: default 1,8,32). MB/s: 2**20 bytes a second, from the
    median call (``_best``: the fastest).
    Target: >= 0.9.
    Beside them, the ceiling: an echo that makes only the copies a tensor RPC
    cannot avoid in gRPC Python (which sends only ``bytes``): the request's bytes
    made from the tensor on each call, a fresh reply on the server (the gradient
    is other memory than the activation), and, when streamed, reassembly into one
    buffer on each end. ``copy_ceiling`` is that echo over the bare one;
    ``ratio_vs_copy_echo`` is the step RPC over that echo (framing, checks, Python).
(c) payload and wire bytes of one vgg11 step (activation + labels up, gradient
    down) with each codec.

Rounds alternate between the compared sides so that machine noise hits both ((a):
in ABBA order, so that a drift within a round does not always fall on one side).
Writes benchmarks/results/transport.json, with the run's flags and context.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING

from splitfed.cli import Parser, script
from splitfed.commands._args import batch_size, int_list, json_out, positive_int
from splitfed.jsonio import write_json

# torch and grpc are imported by the functions that measure, once the flags are read: a bad flag is refused at
# once
if TYPE_CHECKING:
    import torch

MB = 1 << 20
SIZES_MB = (1, 8, 32)
# (chunk_bytes, unary_bytes): the alternatives the default (wire.Limits) was chosen from
ALTERNATIVES = ((4 << 20, 16 << 20), (1 << 20, 16 << 20), (1 << 20, 1 << 20), (4 << 20, 4 << 20), (16 << 20, 16 << 20))
CODECS = ("none", "fp16", "int8", "topk:0.1", "topk:0.01")


# ---------------------------------------------------------------- the server side of (b) and (c)


class EchoTier:
    """A stand-in tier that checks the activation as a tier does, then answers with it as the gradient."""

    name = "echo"

    def step(self, key, activation, labels):  # type: ignore[no-untyped-def]
        from splitfed.engine.checks import check_tensor
        from splitfed.engine.types import StepReply

        check_tensor(activation, tuple(activation.shape[1:]), activation.dtype, "activation", activation.shape[0])
        return StepReply(activation, 0.0, 0)


def serve() -> None:
    """Child process: echo tiers (one per chunk size) and a bare bytes echo; prints their addresses."""
    import grpc
    import torch

    from splitfed.transport import wire
    from splitfed.transport.memory import keep_freed_memory
    from splitfed.transport.server import serve_tier

    if "--no-malloc-tuning" not in sys.argv:
        keep_freed_memory()

    torch.set_num_threads(1)
    tiers = {f"{c}/{u}": serve_tier("echo", insecure=True, tier=EchoTier(), max_workers=4,
                                    limits=wire.Limits(chunk_bytes=c, unary_bytes=u)) for c, u in _sweep()}
    big = 2 * max(SIZES_MB) * MB
    opts = [("grpc.max_send_message_length", big), ("grpc.max_receive_message_length", big), ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(4), options=opts)

    def stream(it, ctx):  # type: ignore[no-untyped-def]
        chunks = list(it)  # the whole request first, as a step must
        yield from chunks

    def copy_stream(it, ctx):  # type: ignore[no-untyped-def]
        whole = b"".join(list(it))  # reassembled into one buffer (one copy), as a tensor must be
        view, chunk = memoryview(whole), wire.Limits().chunk_bytes  # the tiers' default chunks
        for i in range(0, len(view), chunk):
            yield view[i:i + chunk].tobytes()  # one copy per chunk out

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
        # the copies a tensor RPC cannot avoid: the reply made from other memory (the gradient)
        "CopyUnary": grpc.unary_unary_rpc_method_handler(lambda req, ctx: memoryview(req).tobytes()),
        "CopyStream": grpc.stream_stream_rpc_method_handler(copy_stream),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"tiers": {k: s.address for k, s in tiers.items()}, "echo": f"127.0.0.1:{port}"}),
          flush=True)
    sys.stdin.read()  # until the parent closes our stdin


# ---------------------------------------------------------------- helpers


def _sweep() -> list[tuple[int, int]]:
    """The default (chunk, unary) pair first, then the alternatives that are not it."""
    from splitfed.transport import wire

    d = (wire.Limits().chunk_bytes, wire.Limits().unary_bytes)
    return [d, *(p for p in ALTERNATIVES if p != d)]


def timed(fn, reps: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _chunks_of(t: torch.Tensor, chunk: int):  # type: ignore[no-untyped-def]
    mv = t.numpy().data.cast("B")
    for i in range(0, len(mv), chunk):
        yield mv[i:i + chunk].tobytes()


def _reassembled(replies) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(list(replies))  # one copy into a buffer of the exact size


def bench_a(args: argparse.Namespace) -> dict:
    import torch

    from splitfed.engine.device import Device
    from splitfed.engine.rounds import (
        Chain,
        RoundConfig,
        initial_state,
        inprocess_chain,
        tier_loads,
    )
    from splitfed.engine.types import OptimConfig
    from splitfed.models.zoo import resolve_spec
    from splitfed.transport.chain import close_chain, grpc_chain
    from splitfed.transport.process import TierProcess

    spec = resolve_spec("vgg11")
    cuts = (4,)
    state = initial_state(spec, 0)
    optim = OptimConfig(lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, *spec.input_shape, generator=g)
    y = torch.randint(0, spec.num_classes, (args.batch,), generator=g)
    cfg = RoundConfig("bench", 0, spec, optim=optim)

    def device(chain: Chain, cid: str) -> Device:
        for tier, load in zip(chain.tiers, tier_loads(cfg, cid, cuts, state), strict=True):
            tier.load(load)
        return Device(spec, chain.link, run_id="bench", client_id=cid, round=0, cuts=cuts, state=state, optim=optim)

    extra = ["--no-malloc-tuning"] if args.no_malloc_tuning else []
    with TierProcess.start("edge", insecure=True, threads=1, extra_args=extra) as edge:
        remote = grpc_chain([edge.address])
        local = inprocess_chain(1)
        devs = {"inproc": device(local, "a"), "grpc": device(remote, "a")}
        for d in devs.values():
            d.train_step(x, y)  # warm up
        times: dict[str, list[float]] = {k: [] for k in devs}
        for rep in range(args.reps):
            for k, d in (reversed(devs.items()) if rep % 2 else devs.items()):  # ABBA: drift hits both
                times[k] += timed(lambda d=d: d.train_step(x, y), args.steps)
        bytes_up, bytes_down = remote.bytes
        close_chain(remote)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": "vgg11", "batch": args.batch, "cuts": list(cuts), "threads": torch.get_num_threads(),
        "activation_bytes": int(devs["grpc"].head(x).numel() * 4),
        "steps_per_s": {k: 1 / v for k, v in med.items()},
        "step_s": times,
        "ratio_grpc_over_inproc": med["inproc"] / med["grpc"],
        "grpc_link_bytes_per_step": (bytes_up + bytes_down) / (1 + args.reps * args.steps),
    }


def bench_bc(args: argparse.Namespace) -> tuple[list[dict], list[dict], list[dict]]:
    import grpc
    import torch

    from splitfed.engine.types import StepKey
    from splitfed.transport import codec as tc
    from splitfed.transport import wire
    from splitfed.transport.client import GrpcTierClient
    from splitfed.transport.pb import pb

    child = subprocess.Popen([sys.executable, __file__, "--serve", *(["--no-malloc-tuning"] if args.no_malloc_tuning else [])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        big = 2 * max(args.sizes_mb) * MB
        ch = grpc.insecure_channel(info["echo"], options=[("grpc.max_send_message_length", big),
                                                          ("grpc.max_receive_message_length", big)])
        unary, stream = ch.unary_unary("/bench.Echo/Unary"), ch.stream_stream("/bench.Echo/Stream")
        copy_unary, copy_stream = ch.unary_unary("/bench.Echo/CopyUnary"), ch.stream_stream("/bench.Echo/CopyStream")
        clients = {k: GrpcTierClient(a, deadline_s=120, limits=wire.Limits(
            chunk_bytes=int(k.split("/")[0]), unary_bytes=int(k.split("/")[1]))) for k, a in info["tiers"].items()}
        lim = wire.Limits()
        default = f"{lim.chunk_bytes}/{lim.unary_bytes}"
        y = torch.arange(8) % 10
        seq = [0]

        def step(client: GrpcTierClient, act: torch.Tensor) -> None:
            seq[0] += 1
            r = client.step(StepKey("bench", "c", 0, seq[0]), act, y)
            assert r.grad is not None and r.grad.shape == act.shape

        b = []
        for size in args.sizes_mb:
            act = torch.randn(8, size * MB // 32)
            payload = act.numpy().tobytes()
            chunks = [payload[i:i + lim.chunk_bytes] for i in range(0, len(payload), lim.chunk_bytes)]
            sides = {
                "step_rpc": lambda act=act: step(clients[default], act),
                "echo_unary": lambda p=payload: unary(p, timeout=120),
                "echo_stream": lambda c=chunks: list(stream(iter(c), timeout=120)),
                # bytes made from the tensor on each call, a fresh reply on the server, and (streamed)
                # reassembly on both ends: a step's unavoidable copies, with no framing or checks
                "copy_unary": lambda a=act: copy_unary(a.numpy().tobytes(), timeout=120),
                "copy_stream": lambda a=act: _reassembled(copy_stream(_chunks_of(a, lim.chunk_bytes), timeout=120)),
            }
            for f in sides.values():
                f()  # warm up
            t: dict[str, list[float]] = {k: [] for k in sides}
            for _ in range(args.reps_b):  # one call per side in turn: noise hits all sides alike
                for k, f in sides.items():
                    t[k] += timed(f, 1)
            med = {k: 2 * size / statistics.median(v) for k, v in t.items()}
            best = {k: 2 * size / min(v) for k, v in t.items()}
            b.append({"activation_mb": size, "mb_per_s": med, "mb_per_s_best": best,
                      "ratio_vs_best_echo": med["step_rpc"] / max(med["echo_unary"], med["echo_stream"]),
                      "ratio_vs_best_echo_best_runs": best["step_rpc"] / max(best["echo_unary"], best["echo_stream"]),
                      "ratio_vs_echo_unary": med["step_rpc"] / med["echo_unary"],
                      "ratio_vs_echo_stream": med["step_rpc"] / med["echo_stream"],
                      "copy_ceiling": max(med["copy_unary"], med["copy_stream"])
                      / max(med["echo_unary"], med["echo_stream"]),
                      "ratio_vs_copy_echo": med["step_rpc"] / max(med["copy_unary"], med["copy_stream"])})
        sweep = []
        for size in args.sizes_mb:  # the chunk size: every size with every chunk, interleaved
            act = torch.randn(8, size * MB // 32)
            t = {c: [] for c in clients}
            for c in clients:
                step(clients[c], act)
            order = list(clients)
            for rep in range(max(3, args.reps_b // 2)):
                for c in order[rep % len(order):] + order[:rep % len(order)]:  # rotated: no one always goes first
                    t[c] += timed(lambda client=clients[c], act=act: step(client, act), 1)
            for c in clients:
                chunk, unary = map(int, c.split("/"))
                sweep.append({"chunk_bytes": chunk, "unary_bytes": unary, "activation_mb": size,
                              "mb_per_s": 2 * size / statistics.median(t[c])})

        # (c) one vgg11 step's tensors (batch 64, cut 4) with each codec
        g = torch.Generator().manual_seed(0)
        vgg_act = torch.relu(torch.randn(64, 128, 8, 8, generator=g))
        labels = torch.randint(0, 10, (64,), generator=g)
        c_rows = []
        for name in CODECS:
            with GrpcTierClient(info["tiers"][default], compress=name) as client:
                seq[0] += 1
                client.step(StepKey("bench", "c", 0, seq[0]), vgg_act, labels)
                head = pb.StepHeader(run_id="bench", client_id="c", seq=seq[0], phase=pb.PHASE_STEP,
                                     reply_codec=wire.codec_pb(tc.Codec.parse(name)))
                up = wire.frames(head, [("", tc.encode(vgg_act, name)), ("", tc.encode(labels))], lim.unary_bytes)
                down = wire.frames(pb.StepResult(has_tensor=True), [("", tc.encode(vgg_act, name))], lim.unary_bytes)
                rt, _ = tc.roundtrip(vgg_act, name)
                c_rows.append({
                    "codec": name, "payload_up": client.bytes_up, "payload_down": client.bytes_down,
                    "messages_up": sum(map(len, up)), "messages_down": sum(map(len, down)),
                    "ratio_to_none": (client.bytes_up + client.bytes_down) / (2 * vgg_act.numel() * 4 + 64 * 8),
                    "max_abs_error": float((rt - vgg_act).abs().max()),
                })
        for client in clients.values():
            client.close()
        ch.close()
        return b, sweep, c_rows
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(10)


PROG = "benchmarks/transport.py"


def _sizes(text: str) -> tuple[int, ...]:
    """``--sizes-mb``: positive whole MB, each once."""
    sizes = int_list(text)
    if any(s <= 0 for s in sizes) or len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"expected distinct positive sizes in MB, e.g. 1,8,32; got {text!r}")
    return sizes


def main() -> int:
    if "--serve" in sys.argv:
        serve()
        return 0
    ap = Parser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=batch_size, default=64)
    ap.add_argument("--reps", type=positive_int, default=5, help="(a): alternating rounds")
    ap.add_argument("--steps", type=positive_int, default=2, help="(a): steps per round and side")
    ap.add_argument("--reps-b", type=positive_int, default=15, help="(b): calls per side, one side after the other")
    ap.add_argument("--sizes-mb", type=_sizes, default=SIZES_MB,
                    help="(b) and its chunk sweep: activation sizes in MB, comma-separated (default 1,8,32)")
    ap.add_argument("--skip-a", action="store_true", help="only (b) and (c) (no vgg11 training)")
    ap.add_argument("--no-malloc-tuning", action="store_true",
                    help="leave glibc's malloc as it is in every process (see splitfed.transport.memory)")
    ap.add_argument("--out", type=json_out("transport.json"),
                    default=str(Path(__file__).parent / "results" / "transport.json"))
    args = ap.parse_args()
    return script(PROG, lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    import grpc
    import torch

    torch.set_num_threads(1)
    if not args.no_malloc_tuning:
        from splitfed.transport.memory import keep_freed_memory

        keep_freed_memory()
    result: dict = {"torch_threads": torch.get_num_threads(), "grpc": grpc.__version__,
                    "malloc_tuning": not args.no_malloc_tuning, "host": platform.node(),
                    "python": platform.python_version(), "torch_version": torch.__version__, "args": vars(args)}
    if not args.skip_a:  # first: (b)'s 32 MB messages leave this process's heap unlike a training process's
        result["a_training"] = bench_a(args)
    b, sweep, c = bench_bc(args)
    result["b_step_rpc_vs_echo"] = b
    result["b_chunk_sweep"] = sweep
    result["c_bytes_per_codec"] = c
    if "a_training" in result:
        a = result["a_training"]
        print(f"(a) vgg11 b{a['batch']} cut 4: {a['steps_per_s']['grpc']:.3f} steps/s over gRPC, "
              f"{a['steps_per_s']['inproc']:.3f} in-process: ratio {a['ratio_grpc_over_inproc']:.3f} (target >= 0.9)")
    for row in b:
        m = row["mb_per_s"]
        print(f"(b) {row['activation_mb']:>2} MB: step RPC {m['step_rpc']:.0f} MB/s, echo unary {m['echo_unary']:.0f}, "
              f"echo stream {m['echo_stream']:.0f}: ratio vs best echo {row['ratio_vs_best_echo']:.3f} "
              f"(best runs {row['ratio_vs_best_echo_best_runs']:.3f}; target >= 0.9)")
        print(f"       an echo with only a step's unavoidable copies reaches {row['copy_ceiling']:.3f} of the bare "
              f"echo (the ceiling); the step RPC reaches {row['ratio_vs_copy_echo']:.3f} of that echo")
    for size in args.sizes_mb:
        rows = [r for r in sweep if r["activation_mb"] == size]
        print(f"    sweep {size:>2} MB, chunk/unary MiB: " + ", ".join(
            f"{r['chunk_bytes'] >> 20}/{r['unary_bytes'] >> 20} {r['mb_per_s']:.0f} MB/s" for r in rows))
    for row in c:
        print(f"(c) {row['codec']:<9} up {row['payload_up']:>8} B  down {row['payload_down']:>8} B  "
              f"wire {row['messages_up'] + row['messages_down']:>8} B  x{row['ratio_to_none']:.3f}  "
              f"max error {row['max_abs_error']:.3g}")
    write_json(args.out, result, indent=1)  # after the results are shown: a failed write keeps them
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
