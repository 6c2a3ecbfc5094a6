#!/usr/bin/python3
"""One client of the boot tier, from a chosen source address on the host side of the
guest's link.  Prints one line and exits 0:

  answered TEXT   the service answered (its first line)
  timeout         no answer: a dropped SYN, or a datagram never answered
  closed BYTES    connected, then closed; BYTES (repr) is all that came before
  refused         the connection was refused (RST to the SYN)

  client.py tcp SRC DST PORT SECONDS [SEND]     sends SEND (default "hello\\n")
  client.py banner SRC DST PORT SECONDS         waits for the server to talk first
  client.py bytes SRC DST PORT SECONDS HEX      sends HEX's bytes; answered = what came
  client.py udp SRC DST PORT SECONDS [SEND]
  client.py tftp SRC DST SECONDS FILE           a read request; answered = DATA
  client.py git SRC DST PATH SECONDS            git:// upload-pack ref advertisement
  client.py dns SRC DST SECONDS NAME            an A query to port 53; answered A ADDRESS
  client.py hammer SRC DST PORT tcp|udp TAG COUNT [SECONDS]
                    COUNT clients, 8 at a time, each sending TAG-i and waiting
                    SECONDS (default 1) for its echo: prints "answered N of COUNT"
  client.py long SRC DST PORT FLAGFILE
                    one connection: "before", then (once FLAGFILE exists) "after",
                    each echoed: prints "answered before after" or what failed
  client.py talker SRC DST PORT     talks first (an SSH banner, then junk), then reads
                    until the server closes: prints "closed BYTES"
  client.py flood SRC DST PORT RATE SECONDS
                    RATE connection attempts a second (a SYN each, from a new port),
                    each given 1 s: prints "connected N of COUNT"
"""

from __future__ import annotations

import collections
import errno
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def stream(
    src: str, dst: str, port: int, seconds: float, send: bytes | None, line: bool = True
) -> str:
    """A TCP exchange: answered with the first line (or, if not ``line``, the first
    bytes) the server sends."""
    s = socket.socket(family(dst), socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(min(seconds, 10.0))  # the handshake: a dropped SYN times out here
    try:
        s.connect((dst, port))
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    s.settimeout(seconds)  # a socket-activated service compiles its filter first
    got = b""
    try:
        if send:
            s.sendall(send)
        while b"\n" not in got and not (got and not line):
            chunk = s.recv(4096)
            if not chunk:
                return f"closed {got!r}"
            got += chunk
    except TimeoutError:
        return f"timeout (connected, {got!r})"
    except ConnectionResetError:
        return f"closed {got!r}"
    return "answered " + got.decode(errors="replace").splitlines()[0][:120]


def datagram(src: str, dst: str, port: int, seconds: float, payload: bytes) -> tuple[str, bytes]:
    s = socket.socket(family(dst), socket.SOCK_DGRAM)
    s.bind((src, 0))
    s.settimeout(seconds)
    s.sendto(payload, (dst, port))
    try:
        data, _ = s.recvfrom(2048)
    except TimeoutError:
        return "timeout", b""
    except ConnectionRefusedError:
        return "refused", b""
    return "answered", data


def hammer(src: str, dst: str, port: int, proto: str, tag: str, count: int, seconds: float) -> str:
    def one(i: int) -> bool:
        if proto == "tcp":
            return stream(src, dst, port, seconds, f"{tag}-{i}\n".encode()).startswith("answered")
        return datagram(src, dst, port, seconds, f"{tag}-{i}".encode())[0] == "answered"

    with ThreadPoolExecutor(8) as pool:
        served = sum(pool.map(one, range(count)))
    return f"answered {served} of {count}"


def long_lived(src: str, dst: str, port: int, flag: str) -> str:
    s = socket.create_connection((dst, port), timeout=60, source_address=(src, 0))
    got = []
    for word in ("before", "after"):
        if word == "after":
            deadline = time.monotonic() + 120
            while not os.path.exists(flag):
                if time.monotonic() > deadline:
                    return f"no {flag}"
                time.sleep(0.1)
        s.sendall(f"{word}\n".encode())
        line = b""
        while not line.endswith(b"\n"):
            chunk = s.recv(100)
            if not chunk:
                return f"closed after {got}"
            line += chunk
        got.append(line.decode().split()[-1])
    return "answered " + " ".join(got)


def talker(src: str, dst: str, port: int) -> str:
    s = socket.create_connection((dst, port), timeout=30, source_address=(src, 0))
    s.sendall(b"SSH-2.0-evil\r\n" + b"A" * 4000)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except OSError:
        pass
    return f"closed {got[:60]!r}"


def flood(src: str, dst: str, port: int, rate: float, seconds: float) -> str:
    """Non-blocking connects at ``rate`` a second, each given 1 s: then it counts as
    connected if it is, and is closed.  Each socket is looked at once, when its second
    is up, so that the flood's own CPU stays small (it runs on the machine whose CPU
    benchmarks/gallery.py measures; an attacker's would not).  At most rate + 1
    sockets are open at once."""
    begin, sent, connected = time.monotonic(), 0, 0
    total = int(rate * seconds)
    pending: collections.deque[tuple[float, socket.socket]] = collections.deque()
    while True:
        now = time.monotonic()
        for _ in range(min(int((now - begin) * rate), total) - sent):
            s = socket.socket(family(dst), socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            s.bind((src, 0))
            s.connect_ex((dst, port))
            pending.append((now, s))
            sent += 1
        while pending and now - pending[0][0] > 1.0:  # oldest first: in order of sending
            _, s = pending.popleft()
            error = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            # Connected, or connected and then reset (a SYN refused is ECONNREFUSED).
            connected += (error == 0 and _connected(s)) or error == errno.ECONNRESET
            s.close()
        if sent >= total and not pending:
            return f"connected {connected} of {sent}"
        time.sleep(0.005)


def _connected(s: socket.socket) -> bool:
    try:
        s.getpeername()
        return True
    except OSError:
        return False


def main(argv: list[str]) -> str:  # noqa: C901
    kind, src, dst = argv[0], argv[1], argv[2]
    if kind == "tcp":
        send = (argv[5] if len(argv) > 5 else "hello") + "\n"
        return stream(src, dst, int(argv[3]), float(argv[4]), send.encode())
    if kind == "banner":
        return stream(src, dst, int(argv[3]), float(argv[4]), None)
    if kind == "bytes":
        return stream(src, dst, int(argv[3]), float(argv[4]), bytes.fromhex(argv[5]), line=False)
    if kind == "udp":
        send = argv[5] if len(argv) > 5 else "hello"
        word, data = datagram(src, dst, int(argv[3]), float(argv[4]), send.encode())
        return f"{word} {data.decode(errors='replace').strip()}" if data else word
    if kind == "tftp":
        request = b"\x00\x01" + argv[4].encode() + b"\x00octet\x00"
        word, data = datagram(src, dst, 69, float(argv[3]), request)
        if word == "answered" and data[:2] == b"\x00\x03":
            return "answered DATA " + data[4:].decode(errors="replace").strip()
        return word if not data else f"wrong answer {data[:40]!r}"
    if kind == "dns":  # an A query for NAME: answered A ADDRESS
        name = argv[4]
        query = bytes.fromhex("4a4b01000001000000000000")
        query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
        word, data = datagram(src, dst, 53, float(argv[3]), query + bytes.fromhex("00010001"))
        if word == "answered" and data[:2] == b"\x4a\x4b" and len(data) >= 4 + len(query):
            return "answered A " + ".".join(str(b) for b in data[-4:])
        return word if not data else f"wrong answer {data[:40]!r}"
    if kind == "git":
        path = argv[3]
        line = f"git-upload-pack {path}\0host={dst}\0".encode()
        request = f"{len(line) + 4:04x}".encode() + line
        return stream(src, dst, 9418, float(argv[4]), request, line=False)
    if kind == "hammer":
        seconds = float(argv[7]) if len(argv) > 7 else 1.0
        return hammer(src, dst, int(argv[3]), argv[4], argv[5], int(argv[6]), seconds)
    if kind == "long":
        return long_lived(src, dst, int(argv[3]), argv[4])
    if kind == "talker":
        return talker(src, dst, int(argv[3]))
    if kind == "flood":
        return flood(src, dst, int(argv[3]), float(argv[4]), float(argv[5]))
    raise SystemExit(f"client.py: unknown kind {kind}")


if __name__ == "__main__":
    print(main(sys.argv[1:]))
