"""Whether an address is this machine: ``localhost`` or a loopback IP (127.0.0.0/8, ::1)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, without a port) is this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine."""
    return is_loopback_host(urlsplit(url).hostname or "")
