"""Behaviour that a mutation run found unpinned in two small transport modules.

:mod:`splitfed.transport.memory`: what :func:`keep_freed_memory` does to glibc's malloc, seen through glibc's own
counters (``mallinfo2``) in a fresh process each time (the settings are process-wide): a large allocation comes
from the heap instead of a fresh ``mmap``, a freed one stays mapped (up to the 1 GiB trim threshold), the 32 MiB
ceiling on the mmap threshold, the return value, and the exact ``mallopt`` calls (parameter numbers and values).

:mod:`splitfed.transport.chain`: :func:`close_chain` closes each tier that can be closed and passes over one
that cannot (an in-process tier).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from splitfed.engine.rounds import Chain
from splitfed.transport import memory

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20

_linux_glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "mallinfo2")
    except OSError:
        return False


# In a fresh process: `info()` reads glibc's counters, `grab(n)` mallocs n bytes and returns what moved.
_PRELUDE = textwrap.dedent("""
    import ctypes, ctypes.util, json, sys
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def info():
        m = libc.mallinfo2()
        return {n: getattr(m, n) for n, _ in MallInfo2._fields_}
    def grab(n):
        before = info()
        p = libc.malloc(n)
        assert p, n
        after = info()
        libc.free(p)
        freed = info()
        return {"mmapped": after["hblks"] - before["hblks"], "heap_grew": after["arena"] - before["arena"],
                "heap_after_free": freed["arena"] - before["arena"], "kept": freed["keepcost"]}
    out = {}
""")


def _run(body: str) -> dict[str, Any]:
    """Run ``body`` after the prelude in a fresh interpreter (this checkout's splitfed) and return its ``out``."""
    if not _has_mallinfo2():
        pytest.skip("this libc has no mallinfo2 (glibc >= 2.33) to observe malloc with")
    script = _PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the real effect on glibc's malloc


@_linux_glibc
def test_untuned_a_large_allocation_is_mmapped_and_given_back() -> None:
    """The baseline that the tuning changes: glibc serves 64 MiB with a fresh mmap."""
    out = _run('out["big"] = grab(64 << 20)')
    assert out["big"]["mmapped"] == 1


@_linux_glibc
def test_tuned_large_allocations_come_from_the_heap_and_stay_mapped_up_to_1_gib() -> None:
    """After keep_freed_memory(): no mmap even for 64 MiB (M_MMAP_MAX 0), the heap grows by about what was asked
    (no 1 GiB top pad from a wrong parameter number), and freeing does not trim it back while the free top stays
    under the 1 GiB trim threshold (768 MiB stays); beyond it (1.5 GiB) the heap is trimmed."""
    out = _run("""
        from splitfed.transport.memory import keep_freed_memory
        out["ok"] = keep_freed_memory()
        out["big"] = grab(64 << 20)
        out["huge"] = grab(768 << 20)
        out["past_trim"] = grab(1536 << 20)
    """)
    assert out["ok"] is True
    big, huge, past = out["big"], out["huge"], out["past_trim"]
    assert big["mmapped"] == 0
    # The heap's free top may already hold a few KiB of the 64 MiB (CI once saw it grow by 64 MiB - 20 KiB).
    assert 63 * MIB <= big["heap_grew"] < 128 * MIB
    assert big["heap_after_free"] == big["heap_grew"]  # not trimmed
    assert big["kept"] >= 64 * MIB
    assert huge["mmapped"] == 0 and huge["heap_after_free"] == huge["heap_grew"] >= 700 * MIB
    assert past["mmapped"] == 0 and past["heap_grew"] >= 700 * MIB
    assert past["heap_after_free"] < 0  # the free top exceeded 1 GiB: trimmed below where it was before
    assert past["kept"] < 64 * MIB


@_linux_glibc
def test_with_mmap_allowed_the_threshold_is_32_mib() -> None:
    """heap_only=False: an allocation just under 32 MiB comes from the heap, one just over it is mmapped (this
    glibc takes any threshold mallopt is given, so 33 or 64 MiB would be set as asked)."""
    out = _run("""
        from splitfed.transport.memory import keep_freed_memory
        out["ok"] = keep_freed_memory(heap_only=False)
        out["under"] = grab((32 << 20) - (1 << 19))
        out["small"] = grab(16 << 20)
        out["over"] = grab((32 << 20) + (1 << 19))
        out["big"] = grab(64 << 20)
    """)
    assert out["ok"] is True
    assert out["under"]["mmapped"] == 0 and out["under"]["heap_after_free"] == out["under"]["heap_grew"] > 0
    assert out["small"]["mmapped"] == 0
    assert out["over"]["mmapped"] == 1
    assert out["big"]["mmapped"] == 1


@_linux_glibc
def test_elsewhere_than_linux_nothing_is_tuned() -> None:
    """On another platform the call says False and leaves malloc as it was (64 MiB still mmapped)."""
    out = _run("""
        sys.platform = "darwin"
        from splitfed.transport.memory import keep_freed_memory
        out["ok"] = keep_freed_memory()
        out["big"] = grab(64 << 20)
    """)
    assert out["ok"] is False
    assert out["big"]["mmapped"] == 1


# ---------------------------------------------------------------- the exact mallopt calls (a stand-in libc)


class _FakeLibc:
    def __init__(self, answers: dict[int, int]) -> None:
        self.calls: list[tuple[int, int]] = []

        def mallopt(param: int, value: int) -> int:  # a function, so the module can set its argtypes
            self.calls.append((param, value))
            return answers.get(param, 1)

        self.mallopt = mallopt


def _fake(monkeypatch: pytest.MonkeyPatch, answers: dict[int, int] | None = None,
          found: str | None = "libc.so.6") -> tuple[_FakeLibc, list[str | None]]:
    libc = _FakeLibc(answers or {})
    opened: list[str | None] = []

    def cdll(name: str | None) -> _FakeLibc:
        opened.append(name)
        return libc

    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", cdll)
    monkeypatch.setattr(memory.ctypes.util, "find_library", lambda name: found)
    return libc, opened


def test_the_mallopt_calls_are_glibcs_parameter_numbers_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """M_MMAP_THRESHOLD (-3) at 32 MiB, M_TRIM_THRESHOLD (-1) at 1 GiB, M_MMAP_MAX (-4) at 0; heap_only=False
    leaves M_MMAP_MAX alone, and a larger threshold asked for is capped at glibc's 32 MiB ceiling."""
    assert memory.MAX_MMAP_THRESHOLD == 32 * MIB
    libc, _ = _fake(monkeypatch)
    assert memory.keep_freed_memory() is True
    assert libc.calls == [(-3, 32 * MIB), (-1, 1 << 30), (-4, 0)]
    libc.calls.clear()
    assert memory.keep_freed_memory(mmap_threshold=1 << 30, trim_threshold=5, heap_only=False) is True
    assert libc.calls == [(-3, 32 * MIB), (-1, 5)]


@pytest.mark.parametrize("refused", [-3, -1, -4])
def test_any_refused_setting_makes_it_say_false(monkeypatch: pytest.MonkeyPatch, refused: int) -> None:
    """mallopt returns 0 for a value it refuses: one refusal among the three calls is enough for False."""
    libc, _ = _fake(monkeypatch, {refused: 0})
    assert memory.keep_freed_memory() is False
    assert len(libc.calls) == 3


def test_the_libc_found_is_the_one_opened_else_libc_so_6(monkeypatch: pytest.MonkeyPatch) -> None:
    """find_library's answer is used; only when it finds nothing is the name libc.so.6 tried."""
    _, opened = _fake(monkeypatch, found="libc-found.so")
    memory.keep_freed_memory()
    _, opened_none = _fake(monkeypatch, found=None)
    memory.keep_freed_memory()
    assert opened == ["libc-found.so"]
    assert opened_none == ["libc.so.6"]


@pytest.mark.parametrize("error", [OSError("no libc"), AttributeError("no mallopt")])
def test_no_glibc_means_false(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """No libc to open, or one without mallopt (musl): False, no error."""
    def cdll(name: str | None) -> Any:
        raise error

    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", cdll)
    assert memory.keep_freed_memory() is False


# ---------------------------------------------------------------- close_chain


class _Closable:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_close_chain_closes_each_tier_that_has_close_and_passes_over_the_rest() -> None:
    """Tiers with a close are closed once each; a tier without one (in-process) is left alone, not an error."""
    a, b = _Closable(), _Closable()
    chain = Chain([a, object(), b], a)  # type: ignore[list-item]
    from splitfed.transport.chain import close_chain

    close_chain(chain)
    assert (a.closed, b.closed) == (1, 1)


def test_close_chain_closes_a_real_grpc_chain() -> None:
    """After close_chain a gRPC chain's channel is closed: a call on it is refused at once."""
    from splitfed.transport.chain import close_chain, grpc_chain
    from splitfed.transport.server import serve_tier

    with serve_tier("cloud", insecure=True, max_workers=4) as srv:
        chain = grpc_chain([srv.address])
        client = chain.tiers[0]
        client.describe()  # type: ignore[attr-defined]
        close_chain(chain)
        with pytest.raises(ValueError, match="closed channel"):
            client.describe()  # type: ignore[attr-defined]
