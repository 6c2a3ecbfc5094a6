#!/usr/bin/env python3
"""A stand-alone single-packet authorization client for alfwrapper (--knock-spa),
written from alfwrapper.policy(5), SPA DATAGRAMS, with nothing but Python's
standard library: a model for a client in another language.

    spa_knock.py HOST SPA_PORT SECRET_FILE ADDRESS|sender

SECRET_FILE is the service's knock-secret, or better the client's own knock-spa-key.
"""

import hashlib
import hmac
import ipaddress
import os
import socket
import struct
import sys
import time

M64 = (1 << 64) - 1


def rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & M64


def siphash24(key: bytes, msg: bytes) -> bytes:
    """SipHash-2-4 (Aumasson and Bernstein, 2012) of msg, a multiple of 8 bytes long."""
    k0, k1 = struct.unpack("<QQ", key)
    v = [
        k0 ^ 0x736F6D6570736575,
        k1 ^ 0x646F72616E646F6D,
        k0 ^ 0x6C7967656E657261,
        k1 ^ 0x7465646279746573,
    ]

    def rounds(n: int) -> None:
        for _ in range(n):
            v[0] = (v[0] + v[1]) & M64
            v[1] = rotl(v[1], 13) ^ v[0]
            v[0] = rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & M64
            v[3] = rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & M64
            v[3] = rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & M64
            v[1] = rotl(v[1], 17) ^ v[2]
            v[2] = rotl(v[2], 32)

    words = list(struct.unpack(f"<{len(msg) // 8}Q", msg)) + [len(msg) % 256 << 56]
    for m in words:
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    v[2] ^= 0xFF
    rounds(4)
    return struct.pack("<Q", v[0] ^ v[1] ^ v[2] ^ v[3])


def datagram(secret: bytes, spa_port: int, address: str, sent_ns: int, nonce: bytes) -> bytes:
    """Version 2: the key's id, then a 12-byte nonce."""
    key = hmac.new(secret, b"alfwrapper-spa", hashlib.sha256).digest()[:16]
    key_id = hmac.new(secret, b"alfwrapper-spa-id", hashlib.sha256).digest()[:4]
    if address == "sender":
        family, raw = 0, bytes(16)
    else:
        ip = ipaddress.ip_address(address)
        family, raw = ip.version, ip.packed.ljust(16, b"\0")
    body = b"ALFK" + struct.pack(">BBHQ", 2, family, spa_port, sent_ns) + key_id + nonce + raw
    return body + siphash24(key, body)


def main() -> int:
    host, port, secret_file, address = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    with open(secret_file, "rb") as f:
        secret = f.read().strip()  # as alfwrapper reads it: surrounding whitespace dropped
    packet = datagram(secret, port, address, time.time_ns(), os.urandom(12))
    family, kind, _, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as sock:
        sock.sendto(packet, target)
    print(f"sent {len(packet)} bytes to {host} udp port {port}, opening {address}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
