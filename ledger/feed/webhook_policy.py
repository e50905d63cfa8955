"""Where a webhook may deliver: the URL policy, checked when a webhook is added or changed
and again, on the addresses its host resolves to then, before every delivery (a name
that resolved to a public address at registration may resolve to a private one later:
DNS rebinding). A delivery connects to the address that was checked, never to a second
lookup of the name.

- `https` only, unless the operator allows plain `http` for this webhook;
- no credentials in the URL (they would be shown by every read);
- the host's addresses must all be public: loopback, link-local, private (RFC 1918,
  `fc00::/7`), shared, reserved, multicast, unspecified and cloud-metadata addresses
  (`169.254.169.254`, `fd00:ec2::254`, the name `metadata.google.internal`) are refused,
  unless the operator allows that host by name (`allow_host`, which must be the URL's
  host: allowing one host never opens another).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from ledger.core.errors import InvalidInput

MAX_URL = 2000
MAX_HOST = 253

# names and addresses of cloud instance-metadata services: what a request forged by the
# server would read credentials from
METADATA_HOSTS = frozenset(
    {"metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal"}
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200")
)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class UrlPolicy:
    """The operator's exceptions to the default policy, for one webhook."""

    allow_http: bool = False
    allow_host: str | None = None  # a host name (or address) allowed to be non-public


def check_url(url: Any, policy: UrlPolicy) -> SplitResult:
    """The URL's parts, or InvalidInput naming what the policy refuses (no lookup)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise InvalidInput(f"the webhook URL must be 1-{MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise InvalidInput(f"the webhook URL is not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"the webhook URL must be https:// with a host, not {url!r}")
    if parts.scheme == "http" and not policy.allow_http:
        raise InvalidInput(
            "the webhook URL must be https://; plain http:// only when the operator allows "
            "it for this webhook (allow_http, --allow-http)"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidInput(
            "the webhook URL must carry no user name or password: every read shows the URL; "
            "the receiver checks the signature instead"
        )
    if port == 0:
        raise InvalidInput("the webhook URL's port must be 1-65535")
    if policy.allow_host is not None and policy.allow_host != host_of(parts):
        raise InvalidInput(
            f"allow_host {policy.allow_host!r} must be the URL's own host {host_of(parts)!r}: "
            "allowing a host opens that host only"
        )
    return parts


def host_of(parts: SplitResult) -> str:
    """The URL's host as compared with `allow_host`: lower case, no trailing dot."""
    return (parts.hostname or "").rstrip(".").lower()


def check_allow_host(value: Any) -> str | None:
    """`allow_host` as given: None, or a host name or address."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_HOST:
        raise InvalidInput(f"allow_host must be a host name of 1-{MAX_HOST} characters")
    host = value.strip().strip("[]").rstrip(".").lower()
    if any(c.isspace() or c in "/?#@" for c in host):
        raise InvalidInput(f"allow_host must be a host name or address, not {value!r}")
    return host


def refusal(address: Address) -> str | None:
    """Why the policy refuses an address by default (None: a public address)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    for what, test in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
    ):
        if test:
            return f"a {what} address"
    if not address.is_global:
        return "not a public address"
    return None


def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to now (a literal address: itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise InvalidInput(f"the webhook host {host!r} does not resolve: {e}") from None
    addresses: list[Address] = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise InvalidInput(f"the webhook host {host!r} resolves to no address")
    return addresses


def check_target(url: str, policy: UrlPolicy) -> Address:
    """The address to deliver `url` to, after checking the URL and every address its host
    resolves to now; InvalidInput naming the address and why it is refused."""
    parts = check_url(url, policy)
    host = host_of(parts)
    allowed = policy.allow_host is not None and policy.allow_host == host
    if host in METADATA_HOSTS and not allowed:
        raise InvalidInput(f"the webhook host {host!r} is a cloud metadata service")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = resolve(parts.hostname or host, port)
    if not allowed:
        for address in addresses:
            why = refusal(address)
            if why is not None:
                raise InvalidInput(
                    f"the webhook host {host!r} resolves to {address}, {why}: refused unless "
                    f"the operator allows this host (allow_host={host!r}, --allow-host {host})"
                )
    return addresses[0]
