"""Crafted packets, built the same way for the wire (attacker.py) and for a test run.

    packet(version, src, dst, kind, port, data, exts, sport)

kind is "udp" (a datagram carrying DATA and a newline), "udpfrag" (the same,
3 kB longer, to be sent fragmented), or "syn" or "knock" (a TCP SYN);
exts adds IPv6 extension headers ("hbh", "dest", "frag": an atomic fragment
header, "ah") or IPv4 options ("ipopt": record route).
"""

from __future__ import annotations

from typing import Any


def packet(
    version: str,
    src: str,
    dst: str,
    kind: str,
    port: int,
    data: str = "",
    exts: tuple[str, ...] = (),
    sport: int = 40000,
) -> Any:
    from scapy.all import (  # noqa: PLC0415
        IP,
        TCP,
        UDP,
        IPOption_RR,
        IPv6,
        IPv6ExtHdrDestOpt,
        IPv6ExtHdrFragment,
        IPv6ExtHdrHopByHop,
    )
    from scapy.layers.ipsec import AH  # noqa: PLC0415

    if version == "6":
        pkt = IPv6(src=src, dst=dst)
        for ext in exts:
            pkt /= {
                "hbh": IPv6ExtHdrHopByHop,
                "dest": IPv6ExtHdrDestOpt,
                "frag": lambda: IPv6ExtHdrFragment(offset=0, m=0, id=0x1234),
                "ah": lambda: AH(spi=1, seq=1, icv=b"\0" * 12),
            }[ext]()
    else:
        pkt = IP(src=src, dst=dst, options=[IPOption_RR()] if "ipopt" in exts else [])
    if kind == "udp":
        return pkt / UDP(sport=sport, dport=port) / (data.encode() + b"\n")
    if kind == "udpfrag":  # a datagram too big for one packet, to be sent in fragments
        if version == "6":
            pkt /= IPv6ExtHdrFragment()
        payload = data.encode() + b" " + b"x" * 3000 + b"\n"
        return pkt / UDP(sport=sport, dport=port) / payload
    return pkt / TCP(sport=sport, dport=port, flags="S", seq=1000)


def frame(pkt: Any) -> bytes:
    """The packet as an Ethernet frame: what BPF_PROG_TEST_RUN takes."""
    from scapy.all import Ether  # noqa: PLC0415

    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / pkt)
