"""The allow-list entries of `execution.network`: what the spec accepts (the egress proxy,
mass_jobs/sandbox/egress.py, enforces them)."""

from __future__ import annotations

import ipaddress
import re

HOST_RULE = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]*[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:[0-9]{1,5})?$")


def split_entry(entry: str) -> tuple[str, int | None]:
    """(host, port or None) of an entry: `host`, `host:port`, `*.domain`, an address, `[v6]:port`."""
    text = entry.strip().lower()
    if text.startswith("[") and "]:" in text:
        host, port = text[1:].split("]:")
        return host, int(port)
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, int(port) if port.isdigit() else -1
    return text.strip("[]"), None


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def host_rule_error(entry: str) -> str | None:
    """Why `entry` is not an allow-list entry, or None."""
    host, port = split_entry(entry)
    if port is not None and not 0 < port < 65536:
        return f"{entry!r} names a port outside 1-65535"
    if is_address(host) or HOST_RULE.match(host):
        return None
    return f"{entry!r} is not a host name, '*.domain', an address or any of them with ':port'"
