"""Boundaries of a tier address that a mutation run found unpinned: the longest port written (5 digits), which
refusals say "not a number", the highest port (65535), a host that needs both brackets to be an IPv6 literal,
the trailing dot of a fully qualified name, the longest host (253 characters) and label (63), and the dotted
quad that is the only digits-only host checked as an IPv4 address."""

from __future__ import annotations

import pytest

from splitfed.errors import ConfigError
from splitfed.transport.address import parse_address

WANT = "want HOST:PORT with a port in 1..65535"

L63 = "a" * 63
H253 = ".".join([L63] * 3) + "." + "b" * 61  # 3 * 63 + 61 + 3 dots: the longest host name
H254 = H253 + "b"


def _why(address: str) -> str:
    """The whole message ``parse_address`` refuses ``address`` with."""
    with pytest.raises(ConfigError) as e:
        parse_address(address)
    return str(e.value)


# ---------------------------------------------------------------- the port


@pytest.mark.parametrize("bad", ["h:065535", "h:000080", "h:123456", "h:-5", "h:99999", "h:65536"])
def test_a_numeric_port_out_of_range_or_too_long_is_refused_without_a_reason(bad: str) -> None:
    """A port of six digits is refused even when its value would fit (``065535``), and a port written in digits
    (or a negative one) is refused with the range alone, not called "not a number"."""
    assert _why(bad) == f"bad address {bad!r}: {WANT}"


@pytest.mark.parametrize(("bad", "port"), [("h:abc", "abc"), ("h:8o", "8o"), ("h:-x", "-x")])
def test_a_port_that_is_no_number_says_so(bad: str, port: str) -> None:
    """Letters in the port are named as such."""
    assert _why(bad) == f"bad address {bad!r}: {WANT} (port {port!r} is not a number)"


@pytest.mark.parametrize(("address", "port"), [("h:65535", 65535), ("h:65534", 65534), ("h:00080", 80),
                                               ("h:1", 1)])
def test_the_highest_port_and_a_five_digit_port_are_taken(address: str, port: int) -> None:
    """65535 is a port (the range is inclusive), and five digits with leading zeros are still a port."""
    assert parse_address(address) == ("h", port)


# ---------------------------------------------------------------- the host


@pytest.mark.parametrize(("bad", "why"), [
    ("[::1:80", "host '[::1' is no host name"),
    ("abc]:80", "host 'abc]' is no host name"),
    ("[ab:80", "host '[ab' is no host name"),
])
def test_an_ipv6_literal_needs_both_brackets(bad: str, why: str) -> None:
    """Only a host opened AND closed by a bracket is read as an IPv6 literal: ``[::1`` is not ``::`` with its
    first and last characters dropped."""
    assert _why(bad) == f"bad address {bad!r}: {WANT} ({why})"


@pytest.mark.parametrize("host", ["edge.local.", "a.b.", "x.", "x." + L63 + "."])
def test_a_fully_qualified_name_with_its_trailing_dot_is_taken(host: str) -> None:
    """Only the one trailing dot is left out of the labels checked."""
    assert parse_address(f"{host}:80") == (host, 80)


@pytest.mark.parametrize("host", ["a.b-.", "a.-b.", "a..b.", "a.b.."])
def test_the_labels_before_a_trailing_dot_are_still_checked(host: str) -> None:
    """The trailing dot drops only itself: a bad label before it is still refused."""
    assert _why(f"{host}:80") == f"bad address '{host}:80': {WANT} (host {host!r} is no host name)"


def test_a_host_of_253_characters_is_taken_and_254_refused() -> None:
    """A DNS name is at most 253 characters written out (255 octets on the wire)."""
    assert len(H253) == 253 and len(H254) == 254
    assert parse_address(f"{H253}:80") == (H253, 80)
    assert _why(f"{H254}:80") == f"bad address '{H254}:80': {WANT} (host {H254!r} is no host name)"


def test_a_label_of_63_characters_is_taken_and_64_refused() -> None:
    """A DNS label is at most 63 characters, wherever it stands in the name."""
    for host in (L63, f"{L63}.x", f"x.{L63}", f"x.{L63}."):
        assert parse_address(f"{host}:80") == (host, 80)
    for host in ("a" * 64, f"{'a' * 64}.x", f"x.{'a' * 64}", f"x.{'a' * 64}."):
        assert _why(f"{host}:80") == f"bad address '{host}:80': {WANT} (host {host!r} is no host name)"


def test_the_longest_name_with_its_trailing_dot_is_taken() -> None:
    """``H253.`` is the same name as ``H253`` (255 octets on the wire), only written fully qualified."""
    assert parse_address(f"{H253}.:80") == (f"{H253}.", 80)


@pytest.mark.parametrize("host", ["a.b.c.d", "1.2.3.x", "999", "1.2.3", "1.2.3.4.5", "999.1.1", "10.0.0.1"])
def test_only_a_dotted_quad_of_digits_is_checked_as_an_ipv4_address(host: str) -> None:
    """Four labels that are not all digits, or digits-only names of another length, are host names."""
    assert parse_address(f"{host}:80") == (host, 80)


@pytest.mark.parametrize("host", ["999.1.1.1", "1.2.3.256", "256.0.0.0"])
def test_a_dotted_quad_that_is_no_ipv4_address_is_refused(host: str) -> None:
    """A dotted quad of digits is an IPv4 address or nothing (never a name looked up)."""
    assert _why(f"{host}:80") == f"bad address '{host}:80': {WANT} ({host} is no IPv4 address)"
