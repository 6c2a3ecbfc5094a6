#!/usr/bin/python3
"""The denied client, run inside a host's namespace: one attack, one line of result.

    attacker.py tcp rst|fin|open ADDR PORT DATA [HOLD]
        connect, send DATA and a newline, then reset (SO_LINGER 0), half-close
        (FIN), or keep the connection open; holds it HOLD seconds (default 0)
    attacker.py halfopen ADDR PORT DATA RELEASE HOLD
        a handshake whose final ACK (and the data after it) is held back by a
        firewall rule in this namespace until the file RELEASE exists
    attacker.py flood ADDR TCPPORT UDPPORT STOP TAG
        datagrams and connections (each carrying TAG-n) every 10 ms until the
        file STOP exists; prints how many
    attacker.py stream ADDR PORT RATE SECONDS TAG
        RATE connections a second for SECONDS, each sending TAG-n and closing
        without waiting (an allowed client arriving while the wrapper starts);
        prints "sent N"
    attacker.py udpflood ADDR PORT COUNT TAG
        COUNT datagrams as fast as they go; prints how many were sent
    attacker.py raw IP_VERSION SRC DST udp|syn PORT DATA [EXT,...] [SPORT]
        one crafted packet with scapy (craft.py): a UDP datagram, a TCP SYN, or a
        knock (a SYN not waited on), from a SRC that may be forged, with IPv6
        extension headers (hbh, dest, frag, ah) or IPv4 options (ipopt); for a
        SYN, prints "synack", "rst" or "none"
    attacker.py raws
        the same, for each line of standard input (raw's arguments, EXTS "-" for
        none): every packet sent in one go, each SYN's answer awaited at once
        (2 s in all rather than each); one result a line, in their order

Prints "sent" (or the SYN's answer) when done; every wait is bounded.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time


def tcp(mode: str, address: str, port: int, data: str, hold: float) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect((address, port))
    sock.sendall(data.encode() + b"\n")
    if mode == "rst":
        time.sleep(0.2)  # let the data reach the server's queue first
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        return "sent"
    if mode == "fin":
        sock.shutdown(socket.SHUT_WR)
    print("connected", flush=True)
    time.sleep(hold)
    sock.close()
    return "sent"


def nft(*rule: str) -> None:
    subprocess.run(["nft", *rule], check=True, capture_output=True)


def halfopen(address: str, port: int, data: str, release: str, hold: float) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    nft("add", "table", "inet", "alfhold")
    nft("add chain inet alfhold out { type filter hook output priority 0 ; }")
    nft(
        "add",
        "rule",
        "inet",
        "alfhold",
        "out",
        "tcp",
        "dport",
        str(port),
        "tcp",
        "flags",
        "&",
        "syn",
        "==",
        "0",
        "drop",
    )
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect((address, port))  # SYN out, SYN-ACK in; our ACK is dropped here
        sock.sendall(data.encode() + b"\n")
        print("connected", flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        nft("delete", "table", "inet", "alfhold")
    # Retransmissions of the ACK and the data now reach the listener's filter.
    time.sleep(hold)
    sock.close()
    return "sent"


def raw(
    version: str, src: str, dst: str, kind: str, port: int, data: str, exts: list[str], sport: int
) -> str:
    return raws([[version, src, dst, kind, str(port), data, ",".join(exts), str(sport)]])


def raws(lines: list[list[str]]) -> str:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    from helpers.craft import packet  # noqa: PLC0415
    from scapy.all import TCP, AsyncSniffer, conf, fragment, fragment6, send  # noqa: PLC0415

    conf.verb = 0
    pkts, syns, answers = [], {}, {}
    for n, (version, src, dst, kind, port, data, exts, sport) in enumerate(lines):
        ext = tuple(e for e in exts.split(",") if e and e != "-")
        pkt = packet(version, src, dst, kind, int(port), data, ext, int(sport))
        if kind == "udpfrag":
            pkts.append(fragment6(pkt, 1280) if version == "6" else fragment(pkt, 1200))
            answers[n] = f"sent {len(pkts[-1])}"
        else:
            pkts.append([pkt])
        if kind == "syn":
            syns[(int(port), int(sport))] = n
    routes = {(conf.route6 if line[0] == "6" else conf.route).route(line[2])[0] for line in lines}

    def seen(p: object) -> None:
        key = (p[TCP].sport, p[TCP].dport)  # type: ignore[index]
        answers.setdefault(syns[key], "synack" if p[TCP].flags & 0x12 == 0x12 else "rst")  # type: ignore[index]

    sniffers = (
        [
            AsyncSniffer(
                iface=iface,
                lfilter=lambda p: TCP in p and (p[TCP].sport, p[TCP].dport) in syns,
                prn=seen,
                timeout=10,
            )
            for iface in sorted(routes)
        ]
        if syns
        else []
    )
    for sniffer in sniffers:
        sniffer.start()
    time.sleep(0.1)
    for pieces in pkts:
        send(pieces)
        time.sleep(0.01)  # in order: the next might leave from another CPU's queue
    wanted = len(syns) + sum(line[3] == "udpfrag" for line in lines)
    deadline = time.monotonic() + 2
    while len(answers) < wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    for sniffer in sniffers:
        if sniffer.running:
            sniffer.stop()
    return "\n".join(
        answers.get(n, "none") if line[3] in ("syn", "udpfrag") else "sent"
        for n, line in enumerate(lines)
    )


def flood(address: str, tcp_port: int, udp_port: int, stop: str, tag: str) -> str:
    """UDP datagrams and TCP connections, every 10 ms, until the file stop exists
    (at most 60 s): whatever a socket accepts before its filter, this puts there."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    udp = socket.socket(family, socket.SOCK_DGRAM)
    sent = 0
    deadline = time.monotonic() + 60
    print("flooding", flush=True)
    while not os.path.exists(stop) and time.monotonic() < deadline:
        message = f"{tag}-{sent}\n".encode()
        try:
            udp.sendto(message, (address, udp_port))
        except OSError:
            pass
        with socket.socket(family, socket.SOCK_STREAM) as tcp:
            tcp.setblocking(False)
            tcp.connect_ex((address, tcp_port))
            time.sleep(0.01)
            try:
                tcp.send(message)
            except OSError:
                pass
        sent += 1
    return f"sent {sent}"


def udpflood(address: str, port: int, count: int, tag: str) -> str:
    """COUNT datagrams as fast as they go (at most 60 s); prints how many were sent."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sent = 0
    deadline = time.monotonic() + 60
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        for i in range(count):
            if i % 1000 == 0 and time.monotonic() > deadline:
                break
            try:
                udp.sendto(f"{tag}-{i}\n".encode(), (address, port))
                sent += 1
            except OSError:
                time.sleep(0.001)  # a full queue: let it drain
    return f"sent {sent}"


def stream(address: str, port: int, rate: float, seconds: float, tag: str) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sent, begin = 0, time.monotonic()
    while time.monotonic() - begin < seconds:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect((address, port))
                sock.sendall(f"{tag}-{sent}\n".encode())
        except OSError:
            pass  # a SYN the filter's empty slot dropped: the next one comes anyway
        sent += 1
        time.sleep(max(0.0, begin + sent / rate - time.monotonic()))
    return f"sent {sent}"


def main() -> str:
    args = sys.argv[1:]
    if args[0] == "tcp":
        hold = float(args[5]) if len(args) > 5 else 0.0
        return tcp(args[1], args[2], int(args[3]), args[4], hold)
    if args[0] == "halfopen":
        return halfopen(args[1], int(args[2]), args[3], args[4], float(args[5]))
    if args[0] == "stream":
        return stream(args[1], int(args[2]), float(args[3]), float(args[4]), args[5])
    if args[0] == "udpflood":
        return udpflood(args[1], int(args[2]), int(args[3]), args[4])
    if args[0] == "flood":
        return flood(args[1], int(args[2]), int(args[3]), args[4], args[5])
    if args[0] == "raw":
        exts = [e for e in (args[7].split(",") if len(args) > 7 else []) if e]
        sport = int(args[8]) if len(args) > 8 else 40000
        return raw(args[1], args[2], args[3], args[4], int(args[5]), args[6], exts, sport)
    if args[0] == "raws":
        return raws([line.split() for line in sys.stdin.read().splitlines() if line.strip()])
    raise SystemExit(f"attacker.py: unknown attack {args[0]!r}")


if __name__ == "__main__":
    print(main(), flush=True)
