"""Addresses and CIDR prefixes, parsed and printed by the standard library's ipaddress.

Pure Python.  parse_prefix raises ``ValueError`` with a message fit for a user;
callers add where the text came from.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any, NamedTuple

from alfwrapper.errors import excerpt

FAMILY_BITS = {4: 32, 6: 128}
# Addresses and networks are parsed and printed by the standard library's ipaddress.
_ADDRESS: dict[int, Any] = {4: ipaddress.IPv4Address, 6: ipaddress.IPv6Address}
_NETWORK: dict[int, Any] = {4: ipaddress.IPv4Network, 6: ipaddress.IPv6Network}


def address_text(family: int, value: int) -> str:
    """An address (4 or 6, as an integer) as text."""
    return str(_ADDRESS[family](value))


class Prefix(NamedTuple):
    """One CIDR: ``value`` is the network address as an integer, host bits zero.

    A NamedTuple rather than a frozen dataclass: a million of them are made
    at start-up, and a tuple is several times cheaper to build.
    """

    family: int
    value: int
    length: int

    def __str__(self) -> str:
        return f"{address_text(self.family, self.value)}/{self.length}"


def parse_prefix(text: str) -> Prefix:
    """Parse ``ADDR`` or ``ADDR/LEN`` (IPv4 or IPv6) into a Prefix.

    Host bits must be zero: ``192.0.2.5/24`` is refused rather than silently
    widened or narrowed.  IPv4-mapped IPv6 prefixes (``::ffff:192.0.2.0/120``)
    become IPv4 prefixes, because that is how the filter sees such packets.
    """
    text = text.strip()
    if not text:
        raise ValueError("empty address")
    addr, sep, length_text = text.partition("/")
    family = 6 if ":" in addr else 4
    width = FAMILY_BITS[family]
    # ipaddress also takes a netmask after the slash, and IPv6 scope ids (fe80::1%eth0),
    # which no packet carries: both are refused here.
    if sep and not (length_text.isdigit() and length_text.isascii()):
        raise ValueError(f"{excerpt(text)} has a bad prefix length {excerpt(length_text)}")
    if sep and int(length_text) > width:
        length = int(length_text)
        raise ValueError(f"{excerpt(text)}: prefix length {length} is longer than {width}")
    if "%" in addr:
        raise ValueError(f"{excerpt(text)} is not an IPv4 or IPv6 address or CIDR")
    try:
        network = _NETWORK[family](text)
    except ValueError as err:
        if "has host bits set" in str(err):
            wide = _NETWORK[family](text, strict=False)
            raise ValueError(f"{excerpt(text)} has host bits set (did you mean {wide}?)") from None
        raise ValueError(f"{excerpt(text)} is not an IPv4 or IPv6 address or CIDR") from None
    value, length = int(network.network_address), network.prefixlen
    if family == 6 and length >= 96 and (value >> 32) == 0xFFFF:
        return Prefix(4, value & 0xFFFFFFFF, length - 96)
    return Prefix(family, value, length)


def parse_cidrs(texts: Sequence[str]) -> list[Prefix]:
    """CIDRs a command line gave (allow, deny, set add): the first bad one is an error."""
    from alfwrapper.errors import EX_USAGE, AlfError  # noqa: PLC0415

    out = []
    for text in texts:
        try:
            out.append(parse_prefix(text))
        except ValueError as err:
            raise AlfError(
                "CIDR", str(err), "give a CIDR such as 198.51.100.7 or 2001:db8::/48", EX_USAGE
            ) from None
    return out
