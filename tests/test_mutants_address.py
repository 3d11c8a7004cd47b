"""Behaviour of tier addresses that a mutation run found unpinned: the exact reason a bad address is refused
with (empty, a scheme, a missing port), the brackets of an IPv6 literal that is never looked up as a name, what
a failed lookup says, and the resolver thread that a hung lookup leaves behind."""

from __future__ import annotations

import socket
import threading

import pytest

from splitfed.errors import ConfigError
from splitfed.transport import address as address_mod
from splitfed.transport.address import host_name, is_ip, look_up, parse_address, unresolvable

WANT = "want HOST:PORT with a port in 1..65535"


# ---------------------------------------------------------------- the reason a bad address is refused with


@pytest.mark.parametrize(("bad", "why"), [
    ("", "it is empty"),
    ("dns:host:80", "no scheme: give the bare HOST:PORT"),
    ("DNS:host:80", "no scheme: give the bare HOST:PORT"),
    ("unix:sock:80", "no scheme: give the bare HOST:PORT"),
    ("http://host:80", "no scheme: give the bare HOST:PORT"),
    ("host:", "the port is missing"),
    ("localhost", "the port is missing"),
])
def test_a_bad_address_is_refused_with_its_own_reason(bad: str, why: str) -> None:
    """Each refusal says what is wrong: an empty address is not "a missing port", a gRPC scheme such as
    ``dns:`` is not "no host name", and ``host:`` or a bare name lack a port rather than a number."""
    with pytest.raises(ConfigError) as e:
        parse_address(bad)
    assert str(e.value) == f"bad address {bad!r}: {WANT} ({why})"


# ---------------------------------------------------------------- IPv6 brackets


@pytest.mark.parametrize(("host", "name"), [
    ("[::1]", "::1"), ("[::]", "::"), ("[1::]", "1::"), ("[2001:db8::12]", "2001:db8::12"),
    ("edge.local", "edge.local"), ("127.0.0.1", "127.0.0.1"), ("[abc", "[abc"), ("abc]", "abc]"),
])
def test_host_name_drops_exactly_the_brackets_of_an_ipv6_host(host: str, name: str) -> None:
    """Only a host both opened and closed by a bracket loses them, and only those two characters."""
    assert host_name(host) == name


@pytest.mark.parametrize("addr", ["[::1]:7000", "[::]:7000", "[1::]:7000", "[2001:db8::12]:443", "127.0.0.1:80"])
def test_an_ip_literal_is_never_looked_up(monkeypatch: pytest.MonkeyPatch, addr: str) -> None:
    """A bracketed IPv6 literal is an address, not a name: no lookup (which would say "cannot resolve")."""
    def never(*a: object, **k: object) -> None:
        raise AssertionError(f"looked up {a!r}")

    monkeypatch.setattr(address_mod, "look_up", never)
    assert unresolvable(addr) is None


def test_is_ip_answers_a_bool() -> None:
    """``is_ip`` is declared ``-> bool``: a name gives False itself, not some other falsy value."""
    assert is_ip("edge.local") is False and is_ip("::1") is True and is_ip("10.0.0.1") is True


# ---------------------------------------------------------------- what a failed lookup says


@pytest.mark.parametrize(("err", "why"), [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "Name or service not known"),
    (socket.gaierror("resolver exploded"), "resolver exploded"),
])
def test_a_failed_lookup_says_the_resolvers_words(monkeypatch: pytest.MonkeyPatch, err: socket.gaierror,
                                                 why: str) -> None:
    """The reason is the resolver's message (``strerror``), without its ``[Errno -2]`` prefix; an error without
    one says itself."""
    def fail(*a: object, **k: object) -> None:
        raise err

    monkeypatch.setattr(address_mod.socket, "getaddrinfo", fail)
    assert unresolvable("nosuchhost.invalid:7000") == f"cannot resolve host 'nosuchhost.invalid' ({why})"


def test_a_hung_lookup_leaves_a_daemon_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """``getaddrinfo`` has no timeout: the thread left asking must be a daemon, or a hung resolver keeps the
    process from exiting after the lookup has given up."""
    release = threading.Event()

    def hang(*a: object, **k: object) -> list[object]:
        release.wait(30)
        return []

    monkeypatch.setattr(address_mod.socket, "getaddrinfo", hang)
    try:
        assert look_up("hung.example", 80, 0.01) is None
        left = [t for t in threading.enumerate() if t.name == "resolve hung.example"]
        assert left and all(t.daemon for t in left)
    finally:
        release.set()
    for t in left:
        t.join(5)
