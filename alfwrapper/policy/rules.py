"""Parse what the user asked for (listen addresses, CIDRs, rule files) into frozen data.

Pure Python: no kernel, no sockets opened.  The parsers of one value
(parse_prefix, parse_listen, parse_ports, ...) raise ``ValueError`` with a
message fit for a user, and callers add where the input came from; the readers
of files and standard input (read_input, read_text_input) raise ``AlfError``,
which names the file.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from alfwrapper.errors import EX_DATAERR, EX_NOINPUT, EX_USAGE, AlfError, excerpt

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


@dataclass(frozen=True)
class SubnetRules:
    """Source-subnet rules: deny wins; with no allow rules everything not denied passes.

    Given any sequence of prefixes, each list is kept as a PrefixList (numpy columns).
    """

    allow: Sequence[Prefix] = ()
    deny: Sequence[Prefix] = ()

    def __post_init__(self) -> None:
        from alfwrapper.policy.prefix_list import PrefixList  # noqa: PLC0415 (it imports this module)

        object.__setattr__(self, "allow", PrefixList.of(self.allow))
        object.__setattr__(self, "deny", PrefixList.of(self.deny))


@dataclass(frozen=True)
class ListenSpec:
    """A socket the wrapper creates: ``kind`` is "stream" (TCP) or "datagram" (UDP)."""

    kind: str
    host: str
    port: int
    name: str = "unknown"

    @property
    def family(self) -> int:
        return 6 if ":" in self.host else 4

    def __str__(self) -> str:
        host = f"[{self.host}]" if self.family == 6 else self.host
        proto = "tcp" if self.kind == "stream" else "udp"
        return f"{proto} {host}:{self.port}"


@dataclass(frozen=True)
class KnockRules:
    """Port knocking: a static sequence of source ports, or one derived from a secret."""

    ports: tuple[int, ...] = ()
    secret: bytes = b""
    steps: int = 3  # length of secret-derived sequences
    timeout: float = 5.0  # seconds allowed between two knocks
    open_for: float = 30.0  # seconds a completed knock admits new connections
    window: int = 30  # seconds each secret-derived sequence is valid for
    sources: int = 131072  # knock states kept, least recently used evicted


@dataclass(frozen=True)
class MapSetting:
    """``--set MAP KEY VALUE``: one entry to put in a custom filter's map."""

    map: str
    key: str
    value: str


@dataclass(frozen=True)
class CustomFilter:
    """``--filter FILE.c``: a developer's filter, with its map settings."""

    path: str
    sets: tuple[MapSetting, ...] = ()
    # Its text, when it was read elsewhere: the loader compiles what the user's
    # wrapper read, never a path it was given (program.checked_source).
    source: str = ""


@dataclass(frozen=True)
class SocketRules:
    """Everything that applies to one socket; a packet must pass every part.

    ``sources`` says where the subnet rules were written (policy.RuleSource),
    for `explain`; it takes no part in comparisons, so sockets with the same
    rules share a program wherever the rules came from.
    """

    subnets: SubnetRules = field(default_factory=SubnetRules)
    interfaces: tuple[str, ...] = ()
    knock: KnockRules | None = None
    custom: CustomFilter | None = None
    log_rate: int = 0  # --log-drops: dropped packets logged per second, 0 for none
    sources: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    @property
    def empty(self) -> bool:
        return not (
            self.subnets.allow or self.subnets.deny or self.interfaces or self.knock or self.custom
        )


def parse_ports(text: str) -> tuple[int, ...]:
    """``P,P,P``: a knock sequence of ports 1..65535, at most 8 long."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and p.isascii() and 0 < int(p) < 65536 for p in parts):
        raise ValueError(f"{excerpt(text)} is not a list of ports 1-65535 such as 7000,8000,9000")
    if not 1 <= len(parts) <= 8:
        raise ValueError(f"{excerpt(text)} has {len(parts)} ports; give 1 to 8")
    return tuple(int(p) for p in parts)


SOCKET_NAME_RULE = "up to 255 printable ASCII characters without ':' (as FileDescriptorName=)"


def valid_socket_name(name: str) -> bool:
    """A socket's name as systemd allows it in FileDescriptorName= (fdname_is_valid):
    the one rule for --name, a policy's [socket.NAME] and its listen names."""
    return 0 < len(name) <= 255 and name.isascii() and name.isprintable() and ":" not in name


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


# How much of a file the user names is read, at most, and for how long.  A
# 1,000,000-line rule file of IPv6 addresses written out in full
# (2001:0db8:0000:...:0001/128) is 44 MB.
RULE_FILE_LIMIT = 64 << 20
SECRET_LIMIT = 4096
FILTER_LIMIT = 1 << 20
READ_SECONDS = 30.0
_CHUNK = 1 << 20


def read_input(path: str, what: str, limit: int) -> bytes:
    """A regular file the user named, at most ``limit`` bytes, read within READ_SECONDS.

    Missing, unreadable, not a regular file (a FIFO, a device, a directory),
    too large or too slow is an error, never empty or partial input.
    """
    where = f"{what} {excerpt(path, 200, quote=False)}"
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not hang; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise AlfError(where, "no such file", "check the path", EX_NOINPUT) from None
    except OSError as err:
        raise AlfError(
            where,
            err.strerror or str(err),
            "check the path and its permissions",
            EX_NOINPUT,
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise AlfError(
                where,
                f"is not a regular file (it is a {_file_kind(info.st_mode)})",
                "give a file, not a FIFO, device or directory",
                EX_NOINPUT,
            )
        too_big = AlfError(
            where,
            f"is larger than {limit} bytes",
            "split it, or check that it is the file you meant",
            EX_DATAERR,
        )
        if info.st_size > limit:
            raise too_big
        deadline = time.monotonic() + READ_SECONDS
        chunks = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError as err:
                raise AlfError(
                    where, err.strerror or str(err), "check the file", EX_NOINPUT
                ) from None
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise too_big
            if time.monotonic() > deadline:
                raise AlfError(
                    where,
                    f"reading took longer than {READ_SECONDS:.0f} s",
                    "put it on a local file system",
                    EX_NOINPUT,
                )
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISSOCK, "socket"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def read_text_input(path: str, what: str, hint: str, limit: int) -> str:
    """read_input, decoded as UTF-8; anything else is bad data."""
    try:
        return read_input(path, what, limit).decode("utf-8")
    except UnicodeDecodeError as err:
        raise AlfError(
            f"{what} {excerpt(path, 200, quote=False)}",
            f"not UTF-8 text ({err.reason} at byte {err.start})",
            hint,
            EX_DATAERR,
        ) from None


def parse_listen(kind: str, text: str) -> ListenSpec:
    """Parse ``[ADDR]:PORT``, ``ADDR:PORT``, ``:PORT`` or ``PORT``.

    A missing address means ``::``, dual-stack, so IPv4 clients reach it too.
    """
    option = "--listen" if kind == "stream" else "--listen-datagram"
    host, port_text = "::", text
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise AlfError(
                option, f"{excerpt(text)} is not [ADDR]:PORT", "write e.g. [::]:8080", EX_USAGE
            )
        host, port_text = text[1:close], text[close + 2 :]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise AlfError(
                option,
                f"{excerpt(text)}: put an IPv6 address in brackets",
                "write e.g. [2001:db8::1]:8080",
                EX_USAGE,
            )
        host = host or "::"
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        raise AlfError(
            option, f"{excerpt(text)} has no valid port", "ports are 1 to 65535", EX_USAGE
        )
    try:
        if "%" in host:  # an IPv6 scope id: bind to an interface with --interface instead
            raise ValueError(host)
        ipaddress.ip_address(host)
    except ValueError:
        raise AlfError(
            option,
            f"{excerpt(host)} is not an IP address",
            "give a numeric IPv4 or IPv6 address; host names are not resolved",
            EX_USAGE,
        ) from None
    return ListenSpec(kind=kind, host=host, port=int(port_text))
