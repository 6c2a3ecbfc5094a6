"""Ethernet frames made up for BPF_PROG_TEST_RUN: IPv4 and IPv6, a TCP SYN or a UDP
datagram, with valid checksums."""

from __future__ import annotations


def _checksum(header: bytes) -> int:
    total = sum(int.from_bytes(header[i : i + 2], "big") for i in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ip_frame(family: int, source: int, destination: int, protocol: int, l4: bytes) -> bytes:
    """An Ethernet frame carrying ``l4`` over IPv4 or IPv6 between integer addresses."""
    if family == 4:
        header = bytearray(
            b"\x45\0"
            + (20 + len(l4)).to_bytes(2, "big")
            + b"\0\0\0\0\x40"
            + bytes([protocol])
            + b"\0\0"
            + source.to_bytes(4, "big")
            + destination.to_bytes(4, "big")
        )
        header[10:12] = _checksum(bytes(header)).to_bytes(2, "big")
        ethertype, l3 = b"\x08\x00", bytes(header)
    else:
        l3 = (
            b"\x60\0\0\0"
            + len(l4).to_bytes(2, "big")
            + bytes([protocol, 64])
            + source.to_bytes(16, "big")
            + destination.to_bytes(16, "big")
        )
        ethertype = b"\x86\xdd"
    return b"\x02\0\0\0\0\x01" + b"\x02\0\0\0\0\x02" + ethertype + l3 + l4


def udp_frame(
    family: int,
    source: int,
    payload: bytes = b"x",
    sport: int = 40000,
    destination: int | None = None,
    dport: int = 53,
) -> bytes:
    """An Ethernet frame carrying UDP from ``source`` (an integer address)."""
    if destination is None:
        destination = 0xC0000201 if family == 4 else (0x20010DB8 << 96) | 1
    udp = (
        sport.to_bytes(2, "big")
        + dport.to_bytes(2, "big")
        + (8 + len(payload)).to_bytes(2, "big")
        + b"\0\0"
        + payload
    )
    return ip_frame(family, source, destination, 17, udp)


def tcp_syn_frame(family: int, source: int, sport: int, destination: int, dport: int) -> bytes:
    """An Ethernet frame carrying a TCP SYN: what a new connection's first packet looks like."""
    tcp = (
        sport.to_bytes(2, "big")
        + dport.to_bytes(2, "big")
        + bytes(8)
        + b"\x50\x02\xff\xff"
        + bytes(4)
    )
    return ip_frame(family, source, destination, 6, tcp)
