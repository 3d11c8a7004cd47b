"""Tier addresses as users write them: ``HOST:PORT``, checked once, before anything connects or listens."""

from __future__ import annotations

import ipaddress
import re
import socket
import threading

from splitfed.errors import ConfigError

_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?")


def parse_address(address: str, what: str = "address", *, listen: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` as ``(HOST, PORT)``, HOST as written (``[::1]`` keeps its brackets), or a ConfigError.

    HOST is a DNS name, an IPv4 address or a bracketed IPv6 address; PORT is 1..65535 (0..65535 with
    ``listen``: 0 asks for any free port). The one parser of every address a user gives a tier or a
    client (``--listen``, ``--next``, ``ping``, ``tier-addresses``), so that a typo is refused as such
    rather than wrapped around (port 99999), defaulted (no port: 443) or taken for a tier that is down.
    """
    lo = 0 if listen else 1
    hint = _address_problem(address, lo)
    if hint is not None:
        raise ConfigError(f"bad {what} {address!r}: want HOST:PORT with a port in {lo}..65535"
                          + (f" ({hint})" if hint else ""))
    host, _, port = address.rpartition(":")
    return host, int(port)


def unresolvable(address: str, timeout_s: float = 5.0) -> str | None:
    """``"cannot resolve host 'H' (why)"`` when the HOST of ``address`` (a good HOST:PORT) names no machine, else None.

    An IP address is not looked up; a name costs one ``getaddrinfo`` (what the connection would do anyway), and a
    lookup still unanswered after ``timeout_s`` gives no verdict (None): the connection then says what it finds.
    Names under ``.invalid`` never resolve (RFC 2606).
    """
    host, port = parse_address(address)
    name = host_name(host)
    if is_ip(name):
        return None
    found = look_up(name, port, timeout_s)
    return f"cannot resolve host {name!r} ({found})" if isinstance(found, str) else None


def host_name(host: str) -> str:
    """HOST without the brackets of an IPv6 address."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def look_up(name: str, port: int, timeout_s: float) -> list[str] | str | None:
    """The IP addresses ``name`` resolves to, in the resolver's order, each once; or why it does not resolve;
    or None when the resolver has not answered within ``timeout_s`` (``getaddrinfo`` has no timeout)."""
    answer: list[list[str] | str] = []

    def ask() -> None:
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
            answer.append(list(dict.fromkeys(str(info[4][0]) for info in infos)))
        except socket.gaierror as e:
            answer.append(str(e.strerror or e))
        except (OSError, UnicodeError) as e:
            answer.append(str(e))

    t = threading.Thread(target=ask, name=f"resolve {name}", daemon=True)
    t.start()
    t.join(timeout_s)
    return answer[0] if answer else None


def _address_problem(address: str, lo: int) -> str | None:
    """Why ``address`` is no HOST:PORT ("" when nothing more specific can be said), or None if it is one."""
    if not isinstance(address, str) or not address:
        return "it is empty"
    if "://" in address or address.split(":", 1)[0].lower() in ("dns", "unix", "unix-abstract", "ipv4", "ipv6",
                                                                 "vsock"):
        return "no scheme: give the bare HOST:PORT"
    host, sep, port = address.rpartition(":")
    if not sep or not port:
        return "the port is missing"
    if not (port.isascii() and port.isdigit()) or len(port) > 5:
        return f"port {port!r} is not a number" if not port.lstrip("-").isdigit() else ""
    if not lo <= int(port) <= 65535:
        return ""
    if not host:
        return "the host is missing"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is no IPv6 address"
        return None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"host {host!r} is no host name"
        return f"bracket an IPv6 host: [{host}]:{port}"
    name = host[:-1] if host.endswith(".") else host  # a fully qualified name's last dot is no part of its length
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) and len(label) <= 63 for label in labels):
        return f"host {host!r} is no host name"
    if len(labels) == 4 and all(label.isdigit() for label in labels):  # dotted quad: 4 bytes
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host} is no IPv4 address"
    return None
