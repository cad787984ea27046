"""Which Host headers the daemon answers: a guard against DNS rebinding.

A page on evil.example whose name is re-pointed at 127.0.0.1 reaches the daemon with
`Host: evil.example`; answering it would hand the page our API. Browsers send the name they
resolved, so refusing names we do not know stops that. An IP literal cannot be rebound (the page
would then be that address's own origin), so any IP address is accepted.
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import socket

LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


def host_name(header: str) -> str:
    """'Example.com:8080' -> 'example.com'; '[::1]:11435' -> '::1'."""
    header = header.strip().lower().rstrip(".")
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(header: str | None, bound: str, allowed: list[str]) -> bool:
    """True for no Host header (not a browser), loopback names, IP literals, the bound name, `allowed` patterns."""
    if not header:
        return True
    name = host_name(header)
    if name in LOOPBACK_NAMES or name.endswith(".localhost") or name in (bound.lower(), _this_machine()):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed)


@functools.cache
def _this_machine() -> str:
    """This machine's own name (as Ollama accepts it): for a daemon bound to 0.0.0.0 on a LAN."""
    return socket.gethostname().lower()
