"""Single-packet authorization: the datagram, its key, and the client side.

One UDP datagram of 56 bytes, sent to the service's SPA socket, opens the address
it names for the service (knocking.c checks it; alfwrapper.policy(5), SPA DATAGRAMS,
has the format and test vectors):

    offset size
     0     4    "ALFK"
     4     1    version: 1
     5     1    family of the address to open: 4 or 6; 0 names none (the sender's
                 is opened, where the policy allows it: knock-spa-sender)
     6     2    the SPA socket's port, as the datagram is sent to it, big-endian
     8     8    when it was sent: ns since the Unix epoch (UTC), big-endian
    16    16    nonce: random, never used twice
    32    16    the address to open, network order (IPv4: 4 bytes, then zeros)
    48     8    tag: SipHash-2-4 of bytes 0 to 47, under the key, little-endian

The key: the first 16 bytes of HMAC-SHA256(secret, "alfwrapper-spa"), of the same
secret file port knocking reads.  SipHash comes from python3-siphashc (the C of
its authors' reference); the kernel's is filters/siphash.h.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
import struct
import time
from typing import Any

from alfwrapper.errors import EX_DATAERR, EX_OSERR, EX_USAGE, AlfError
from alfwrapper.record import Record

MAGIC = b"ALFK"
VERSION = 1
MAGIC_WORD = int.from_bytes(MAGIC + bytes([VERSION]), "little")  # knocking.c's first 5 bytes
BODY = struct.Struct(">4sBBHQ16s16s")  # what the tag covers
DATAGRAM = struct.Struct(">48s8s")  # the body, then the tag's 8 bytes (little-endian)
_KEY_LABEL = b"alfwrapper-spa"
SENDER = 0  # the family byte of a datagram that names no address


def key_of(secret: bytes) -> bytes:
    """The 128-bit SipHash key of a knock secret."""
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()[:16]


def key_words(secret: bytes) -> tuple[int, int]:
    """The key as SipHash's two little-endian words (knock_config's spa_k0, spa_k1)."""
    key = key_of(secret)
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")


def siphash24(key: bytes, message: bytes) -> bytes:
    """SipHash-2-4's 8-byte tag (python3-siphashc)."""
    import siphashc  # noqa: PLC0415  (a knocking client's and start's alone)

    return int(siphashc.siphash(key, message)).to_bytes(8, "little")


class Datagram(Record):
    """One SPA datagram's fields."""

    port: int
    sent_ns: int
    nonce: bytes
    address: str | None  # None: the sender's (family 0)
    version: int = VERSION

    def body(self) -> bytes:
        if self.address is None:
            family, raw = SENDER, bytes(16)
        else:
            ip = ipaddress.ip_address(self.address)
            family, raw = ip.version, ip.packed.ljust(16, b"\0")
        return BODY.pack(MAGIC, self.version, family, self.port, self.sent_ns, self.nonce, raw)

    def sealed(self, key: bytes) -> bytes:
        body = self.body()
        return DATAGRAM.pack(body, siphash24(key, body))


def datagram(secret: bytes, port: int, address: str | None, now_ns: int | None = None) -> bytes:
    """A fresh datagram opening ``address`` (None: the sender's) for the service whose
    SPA socket is on ``port``."""
    sent = time.time_ns() if now_ns is None else now_ns
    return Datagram(port, sent, os.urandom(16), address).sealed(key_of(secret))


def read(raw: bytes, key: bytes) -> Datagram | None:
    """The fields of a datagram whose format and tag are sound under ``key``; None
    otherwise (the kernel's first checks, for tests and `explain`)."""
    if len(raw) != DATAGRAM.size:
        return None
    body, tag = DATAGRAM.unpack(raw)
    magic, version, family, port, sent, nonce, addr = BODY.unpack(body)
    if magic != MAGIC or version != VERSION or not hmac.compare_digest(siphash24(key, body), tag):
        return None
    if family == SENDER:
        address = None
    elif family == 4:
        address = str(ipaddress.IPv4Address(addr[:4]))
    elif family == 6:
        address = str(ipaddress.IPv6Address(addr))
    else:
        return None
    return Datagram(port, sent, nonce, address, version)


def local_address(host: str, port: int) -> str:
    """The address this host sends from towards host:port (no packet is sent): the one
    to open where no NAT is in between."""
    family, kind, _, _, target = _resolve(host, port)
    with socket.socket(family, kind) as probe:
        try:
            probe.connect(target)
        except OSError as err:
            raise AlfError(f"knock {host}", err.strerror or str(err),
                           "is there a route to it?", EX_OSERR) from None  # fmt: skip
        return str(probe.getsockname()[0]).split("%")[0]


def _resolve(host: str, port: int) -> tuple[Any, ...]:
    try:
        return tuple(socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0])
    except socket.gaierror as err:
        raise AlfError(
            f"knock {host}", str(err.strerror), "give a reachable host name or address", EX_USAGE
        ) from None


def send(host: str, spa_port: int, raw: bytes) -> None:
    """The datagram, once, to host's SPA socket."""
    family, kind, _, _, target = _resolve(host, spa_port)
    with socket.socket(family, kind) as sock:
        try:
            sock.sendto(raw, target)
        except OSError as err:
            raise AlfError(f"sending the SPA datagram to {host} port {spa_port}",
                           err.strerror or str(err), "is there a route to it?",
                           EX_OSERR) from None  # fmt: skip


def answers(host: str, port: int, seconds: float) -> bool:
    """Whether the service accepts a TCP connection within ``seconds``."""
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return True
    except OSError:
        return False


def check_address(text: str) -> str | None:
    """--address: an IP address, or "sender" (None)."""
    if text == "sender":
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise AlfError(
            "--address",
            f"{text!r} is not an IP address",
            "give your public address, or `sender` where the service allows it",
            EX_DATAERR,
        ) from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        raise AlfError(
            "--address",
            f"{text} is an IPv4-mapped address",
            f"give it as IPv4: {ip.ipv4_mapped}",
            EX_DATAERR,
        )
    return str(ip)
