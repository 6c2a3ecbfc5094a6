#!/usr/bin/python3
"""Send replays of one sound SPA datagram, then datagrams of the right form with random
tags, to a UDP port: what an attacker with a captured datagram, or without the key, can
send.

    spa_flood.py HOST PORT FORGED DATAGRAM_HEX REPLAYS [SOUND_FILE]

SOUND_FILE: sound datagrams, one a line in hexadecimal, each sent once before the rest
(what a holder of a key can send), paced so that a veth's backlog does not drop them.
Each forgery has the magic, version, family 4 and the port right, and the rest random,
so that the filter computes its tag before it refuses it.  Bounded by the counts and by
120 seconds; prints "sent FORGED REPLAYS"."""

import os
import socket
import struct
import sys
import time


def main() -> None:
    host, port, forged, replayed, replays = sys.argv[1:6]
    port_n, forged_n, replays_n = int(port), int(forged), int(replays)
    head = b"ALFK" + struct.pack(">BBH", 1, 4, port_n)
    target = (host, port_n)
    deadline = time.monotonic() + 120
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
    if len(sys.argv) > 6:
        with open(sys.argv[6]) as f:
            sound = [bytes.fromhex(line) for line in f.read(1 << 24).split()]
        for i, raw in enumerate(sound):
            s.sendto(raw, target)
            if i % 256 == 255:
                time.sleep(0.001)
        print(f"sound {len(sound)}")
    # The replays first, while the datagram is within its window (a stale one is
    # refused before the replay table is asked), then the forgeries.
    raw = bytes.fromhex(replayed)
    again = 0
    while again < replays_n and time.monotonic() < deadline:
        s.sendto(raw, target)
        again += 1
    sent = 0
    chunk = 4096
    while sent < forged_n and time.monotonic() < deadline:
        noise = os.urandom(48 * chunk)
        for i in range(min(chunk, forged_n - sent)):
            try:
                s.sendto(head + noise[48 * i : 48 * i + 48], target)
            except BlockingIOError:
                pass
            sent += 1
    print(f"sent {sent} {again}")


if __name__ == "__main__":
    main()
