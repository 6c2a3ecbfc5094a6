"""Single-packet authorization: the datagram, its key, and the client side.

One UDP datagram of 56 bytes, sent to the service's SPA socket, opens the address
it names for the service (filters/spa.c checks it; alfwrapper.policy(5), SPA DATAGRAMS,
has the format and test vectors):

    offset size
     0     4    "ALFK"
     4     1    version: 2 (1: the same without a key id, nonce 16 bytes)
     5     1    family of the address to open: 4 or 6; 0 names none (the sender's
                 is opened, where the policy allows it: knock-spa-sender)
     6     2    the SPA socket's port, as the datagram is sent to it, big-endian
     8     8    when it was sent: ns since the Unix epoch (UTC), big-endian
    16     4    key id, big-endian: which key the tag is under
    20    12    nonce: random, never used twice
    32    16    the address to open, network order (IPv4: 4 bytes, then zeros)
    48     8    tag: SipHash-2-4 of bytes 0 to 47, under the key, little-endian

The key: the first 16 bytes of HMAC-SHA256(secret, "alfwrapper-spa"), of a secret
file (the knock-secret all clients share, or a client's own knock-spa-key); its id,
the first 4 bytes of HMAC-SHA256(secret, "alfwrapper-spa-id"), so a client needs
nothing but its file.  SipHash comes from python3-siphashc (the C of its authors'
reference); the kernel's is filters/siphash.h.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

from alfwrapper.errors import EX_CONFIG, EX_DATAERR, EX_OSERR, EX_USAGE, AlfError
from alfwrapper.record import Record

MAGIC = b"ALFK"
VERSION = 2  # what clients send: with a key id
SHARED = 1  # the first version, without one: under the knock-secret alone
MAGIC_WORDS = {v: int.from_bytes(MAGIC + bytes([v]), "little") for v in (SHARED, VERSION)}
BODY = struct.Struct(">4sBBHQ16s16s")  # what the tag covers (the key id and nonce: 16s)
DATAGRAM = struct.Struct(">48s8s")  # the body, then the tag's 8 bytes (little-endian)
NONCE = 12  # version 2's (version 1's: 16)
_KEY_LABEL = b"alfwrapper-spa"
_ID_LABEL = b"alfwrapper-spa-id"
SENDER = 0  # the family byte of a datagram that names no address
MOST_KEYS = 1024  # a socket's keys, the shared secret's included


def key_of(secret: bytes) -> bytes:
    """The 128-bit SipHash key of a knock secret."""
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()[:16]


def key_id(secret: bytes) -> int:
    """The id a datagram keyed with this secret carries (version 2)."""
    return int.from_bytes(hmac.new(secret, _ID_LABEL, hashlib.sha256).digest()[:4], "big")


def keys(shared: bytes, own: Sequence[bytes]) -> dict[int, bytes]:
    """The SipHash key of each key id a socket takes: the shared knock-secret's (if
    any) and each client's own; two secrets of one id (the same key given twice, or,
    one chance in 2**32 a pair, two alike in id) are an error."""
    found: dict[int, bytes] = {}
    for secret in ([shared] if shared else []) + list(own):
        ident = key_id(secret)
        if ident in found:
            raise AlfError(
                "knock-spa-key",
                f"two keys have the id {ident:08x}: the same "
                "secret given twice, or two alike in id",
                "make a new key for one of them (head -c 32 /dev/urandom | base64)",
                EX_CONFIG,
            )
        found[ident] = key_of(secret)
    if len(found) > MOST_KEYS:
        raise AlfError(
            "knock-spa-key",
            f"{len(found)} keys, more than {MOST_KEYS}",
            "give each service its own keys",
            EX_CONFIG,
        )
    return found


def siphash24(key: bytes, message: bytes) -> bytes:
    """SipHash-2-4's 8-byte tag (python3-siphashc)."""
    import siphashc  # noqa: PLC0415  (a knocking client's and start's alone)

    return int(siphashc.siphash(key, message)).to_bytes(8, "little")


class Datagram(Record):
    """One SPA datagram's fields."""

    port: int
    sent_ns: int
    nonce: bytes  # NONCE bytes (version 1: 16)
    address: str | None  # None: the sender's (family 0)
    key_id: int = 0  # version 2's
    version: int = VERSION

    def body(self) -> bytes:
        if self.address is None:
            family, raw = SENDER, bytes(16)
        else:
            ip = ipaddress.ip_address(self.address)
            family, raw = ip.version, ip.packed.ljust(16, b"\0")
        size = 16 if self.version == SHARED else NONCE
        if len(self.nonce) != size:
            raise ValueError(
                f"a version {self.version} nonce is {size} bytes, not {len(self.nonce)}"
            )
        ident = b"" if self.version == SHARED else self.key_id.to_bytes(4, "big")
        middle = ident + self.nonce
        return BODY.pack(MAGIC, self.version, family, self.port, self.sent_ns, middle, raw)

    def sealed(self, key: bytes) -> bytes:
        body = self.body()
        return DATAGRAM.pack(body, siphash24(key, body))


def datagram(secret: bytes, port: int, address: str | None, now_ns: int | None = None) -> bytes:
    """A fresh datagram opening ``address`` (None: the sender's) for the service whose
    SPA socket is on ``port``, under the secret's key and with its id."""
    sent = time.time_ns() if now_ns is None else now_ns
    fields = Datagram(port, sent, os.urandom(NONCE), address, key_id(secret))
    return fields.sealed(key_of(secret))


def read(raw: bytes, keys: dict[int, bytes], shared: int | None = None) -> Datagram | None:
    """The fields of a datagram whose format and tag are sound under its key among
    ``keys`` (by id; version 1: the key of id ``shared``, None if there is no shared
    secret); None otherwise (the kernel's first checks, for tests and `explain`)."""
    if len(raw) != DATAGRAM.size:
        return None
    body, tag = DATAGRAM.unpack(raw)
    magic, version, family, port, sent, middle, addr = BODY.unpack(body)
    if magic != MAGIC or version not in (SHARED, VERSION):
        return None
    ident = shared if version == SHARED else int.from_bytes(middle[:4], "big")
    key = keys.get(ident) if ident is not None else None
    if key is None or not hmac.compare_digest(siphash24(key, body), tag):
        return None
    if family == SENDER:
        address = None
    elif family == 4:
        address = str(ipaddress.IPv4Address(addr[:4]))
    elif family == 6:
        address = str(ipaddress.IPv6Address(addr))
    else:
        return None
    if version == SHARED:
        return Datagram(port, sent, middle, address, 0, version)
    return Datagram(port, sent, middle[4:], address, ident or 0, version)


def local_address(host: str, port: int) -> str:
    """The address this host sends from towards host:port (no packet is sent): the one
    to open where no NAT is in between."""
    family, kind, _, _, target = _resolve(host, port)
    with socket.socket(family, kind) as probe:
        try:
            probe.connect(target)
        except OSError as err:
            raise AlfError(
                f"knock {host}", err.strerror or str(err), "is there a route to it?", EX_OSERR
            ) from None
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
            raise AlfError(
                f"sending the SPA datagram to {host} port {spa_port}",
                err.strerror or str(err),
                "is there a route to it?",
                EX_OSERR,
            ) from None


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
