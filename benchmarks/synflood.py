"""A SYN flood from a million IPv6 sources at a wrapped listener, against nftables.

The rule set: a million denied /64s, at random in 2001:db8:8000::/33.  The
flood: 2**21 TCP SYNs (fewer with --smoke), each from a different address
inside a denied /64, sent as raw frames on a namespace's loopback to a
listener there.  Meanwhile an allowed client (::1) connects, sends a byte
and waits for the close, in a loop paced at one attempt per 2 ms.  Four variants, each in a network
namespace of its own, the same frames sent to each, rounds interleaved:

- alfwrapper: the listener behind alfwrapper with the million rules;
- early: the listener behind alfwrapper denying a named set of the million
  prefixes, the set enforced early on the namespace's loopback (`alfwrapper set
  early`: XDP, generic mode, the only one loopback has);
- nftables: an unfiltered listener, the rules in an interval set, dropped by
  `ip6 saddr @deny drop` in an input hook;
- floor: the frames dropped on arrival (a netdev ingress hook), to take the
  sender's own cost and the loopback's out.

CPU per dropped SYN is the machine's busy time during the flood (all CPUs,
/proc/stat), less the floor's, over the frames sent.  Bounded: a fixed
number of frames per round, a fixed number of rounds, and timeouts on every
step.  Traffic stays on the namespaces' loopbacks.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PORT = 9201
SET = f"alfflood-{os.getpid()}"  # the early variant's deny set
VARIANTS = ("alfwrapper", "early", "nftables", "floor")
FRAME = 74  # Ethernet 14 + IPv6 40 + TCP 20


def ns_run(ns: str, *argv: str, stdin: str | None = None, timeout: float = 600) -> str:
    return subprocess.run(
        in_ns(ns, argv),
        check=True,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
    ).stdout


def in_ns(ns: str, argv: Any) -> list[str]:
    """argv in the namespace; nsenter, not `ip netns exec`, which mounts a /sys of its
    own without the BPF file system (the early variant's pinned state)."""
    return ["nsenter", f"--net=/run/netns/{ns}", *argv]


WRAPPER = [sys.executable, "-m", "alfwrapper"]


def denied(count: int, seed: int) -> list[int]:
    """count distinct /64 prefixes in 2001:db8:8000::/33, as integers."""
    rng = random.Random(seed)
    found: set[int] = set()
    while len(found) < count:
        found.add((0x20010DB8 << 96) | ((0x80000000 | rng.getrandbits(31)) << 64))
    return sorted(found)


def frames(prefixes: list[int], count: int, seed: int) -> bytes:
    """count SYN frames to [::1]:PORT, each from a random address in a random prefix
    (numpy: the TCP checksums too)."""
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    tops = np.array([p >> 64 for p in prefixes], np.uint64)
    sources = np.empty((count, 2), ">u8")
    sources[:, 0] = tops[rng.integers(0, len(tops), count)]
    sources[:, 1] = rng.integers(0, 2**63, count, dtype=np.uint64) * 2 + 1
    out = np.zeros((count, FRAME), np.uint8)
    out[:, 12:14] = (0x86, 0xDD)
    out[:, 14:22] = (0x60, 0, 0, 0, 0, 20, 6, 64)  # version, length 20, TCP, hop limit
    out[:, 22:38] = sources.view(np.uint8).reshape(count, 16)
    out[:, 53] = 1  # destination ::1
    tcp = np.zeros(20, np.uint8)
    tcp[0:2] = (0xC3, 0x50)  # source port 50000
    tcp[2:4] = (PORT >> 8, PORT & 0xFF)
    tcp[12:16] = (0x50, 0x02, 0xFF, 0xFF)  # header length 5, SYN, window
    out[:, 54:74] = tcp
    # The checksum over the pseudo-header (source, ::1, length 20, next header 6) and
    # the TCP header: the source's words vary, the rest is one constant.
    words = sources.view(">u2").reshape(count, 8).astype(np.int64).sum(axis=1)
    fixed = 1 + 20 + 6 + int(tcp.view(">u2").astype(np.int64).sum())
    total = words + fixed
    for _ in range(3):
        total = (total & 0xFFFF) + (total >> 16)
    check = (~total & 0xFFFF).astype(">u2")
    out[:, 70:72] = check.view(np.uint8).reshape(count, 2)
    return out.tobytes()


def busy_seconds() -> float:
    """All CPUs' non-idle time so far (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))
    return ticks / os.sysconf("SC_CLK_TCK")


SENDER = """
import socket, sys
data = open(sys.argv[1], "rb").read()
with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
    raw.bind(("lo", 0))
    view = memoryview(data)
    for i in range(0, len(data), {frame}):
        raw.send(view[i : i + {frame}])
"""

CLIENT = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[1])
tried = served = 0
try:
    while time.monotonic() < deadline:
        ok = False
        try:
            with socket.create_connection(("::1", {port}), timeout=2) as conn:
                conn.sendall(b"x")
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(2)
                ok = conn.recv(1) == b""
        except OSError:
            pass
        tried, served = tried + 1, served + ok  # an attempt cut short is not counted
        print(tried, served, flush=True)  # the totals so far: a kill loses nothing
        time.sleep(0.002)  # paced, so that its own CPU is small and alike in every variant
except KeyboardInterrupt:
    pass
"""


def setup(spaces: dict[str, str], prefixes: list[int], rules_file: Path) -> list[Any]:
    import ipaddress  # noqa: PLC0415

    elements = ",\n".join(f"{ipaddress.IPv6Address(p)}/64" for p in prefixes)
    for ns in spaces.values():
        subprocess.run(["ip", "netns", "add", ns], check=True)
        ns_run(ns, "ip", "link", "set", "lo", "up")
    ns_run(
        spaces["nftables"],
        "nft",
        "-f",
        "-",
        stdin=(
            "table inet alfflood {\n"
            "  set deny { type ipv6_addr; flags interval;\n"
            f"    elements = {{ {elements} }}\n  }}\n"
            "  chain input { type filter hook input priority 0; policy accept;\n"
            "    ip6 saddr @deny drop\n  }\n}\n"
        ),
    )
    ns_run(
        spaces["floor"],
        "nft",
        "-f",
        "-",
        stdin=(
            "table netdev alfflood {\n"
            "  chain ingress { type filter hook ingress device lo priority 0;\n"
            "    ip6 saddr 2001:db8::/32 drop\n  }\n}\n"
        ),
    )
    procs = []
    subprocess.run([*WRAPPER, "set", "create", SET, str(rules_file)], check=True, cwd=ROOT)
    for variant, ns in spaces.items():
        argv = [*WRAPPER, "--service", f"alfflood-{variant}", "--listen", f"[::1]:{PORT}"]
        if variant == "alfwrapper":
            argv += ["--deny-file", str(rules_file)]
        if variant == "early":
            argv += ["--deny-set", SET]
        argv += ["--", sys.executable, str(HERE / "sink.py")]
        procs.append(
            subprocess.Popen(
                in_ns(ns, argv),
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    for ns in spaces.values():
        deadline = time.monotonic() + 300
        while f":{PORT}" not in ns_run(ns, "ss", "-Hltn"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens in {ns}")
            time.sleep(0.2)
    ns_run(spaces["early"], *WRAPPER, "set", "early", SET, "lo", timeout=300)
    return procs


def one_flood(ns: str, frames_file: Path, count: int) -> dict[str, float]:
    """Send the frames while the allowed client connects in a loop."""
    totals = tempfile.TemporaryFile("w+")  # a file, not a pipe: its writes never block
    client = subprocess.Popen(
        in_ns(ns, [sys.executable, "-c", CLIENT.format(port=PORT), "600"]),
        stdout=totals,
        text=True,
        start_new_session=True,
    )
    time.sleep(0.3)
    before, begin = busy_seconds(), time.monotonic()
    ns_run(ns, sys.executable, "-c", SENDER.format(frame=FRAME), str(frames_file), timeout=600)
    busy, elapsed = busy_seconds() - before, time.monotonic() - begin
    os.killpg(client.pid, signal.SIGINT)
    try:
        client.wait(timeout=30)
    except subprocess.TimeoutExpired:  # once, a client took longer to stop: its totals stand
        os.killpg(client.pid, signal.SIGKILL)
        client.wait()
    with totals:
        totals.seek(0)
        last = totals.read().strip().rsplit("\n", 1)[-1].split()
    tried, served = (int(x) for x in last) if len(last) == 2 else (0, 0)
    return {
        "busy": busy,
        "elapsed": elapsed,
        "tried": tried,
        "served": served,
        "rate": count / elapsed,
    }


def early_drops(ns: str) -> int:
    """The SYNs the early variant's XDP program dropped (its counters, `status`)."""
    import json  # noqa: PLC0415

    report = json.loads(ns_run(ns, *WRAPPER, "status", "--json", timeout=120))
    return sum(sum(one["dropped"].values()) for one in report.get("early", []))


def run(smoke: bool) -> dict[str, Any]:
    rules = 1000 if smoke else 1_000_000
    count = 1 << (14 if smoke else 21)
    rounds = 1 if smoke else 3
    spaces = {v: f"alfflood{os.getpid()}{v[:3]}" for v in VARIANTS}
    prefixes = denied(rules, 14)
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        import ipaddress  # noqa: PLC0415

        rules_file = Path(tmp) / "deny.rules"
        rules_file.write_text("".join(f"{ipaddress.IPv6Address(p)}/64\n" for p in prefixes))
        frames_file = Path(tmp) / "frames"
        frames_file.write_bytes(frames(prefixes, count, 14))
        procs: list[Any] = []
        try:
            procs = setup(spaces, prefixes, rules_file)
            for r in range(rounds):
                turn = r % len(VARIANTS)
                order = VARIANTS[turn:] + VARIANTS[:turn]
                for variant in order:
                    samples[variant].append(one_flood(spaces[variant], frames_file, count))
            dropped_early = early_drops(spaces["early"])
        finally:
            for proc in procs:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
            subprocess.run([*WRAPPER, "set", "destroy", SET], capture_output=True, cwd=ROOT)
            for ns in spaces.values():
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    result: dict[str, Any] = {"rules": rules, "frames": count, "dropped_early": dropped_early}
    floor = statistics.median(s["busy"] for s in samples["floor"])
    for variant, got in samples.items():
        busy = statistics.median(s["busy"] for s in got)
        result[variant] = {
            "cpu_ns": (busy - floor) / count * 1e9,
            "busy_ns": busy / count * 1e9,
            "rate": statistics.median(s["rate"] for s in got),
            "tried": sum(int(s["tried"]) for s in got),
            "served": sum(int(s["served"]) for s in got),
            "conn_per_s": statistics.median(s["tried"] / s["elapsed"] for s in got),
        }
    return result


def main() -> int:
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, figures meaningless")
    r = run(parser.parse_args().smoke)
    print(f"{r['frames']:,} SYNs from distinct sources, {r['rules']:,} rules")
    print(f"dropped at XDP by the early variant: {r['dropped_early']:,}")
    for v in VARIANTS:
        x = r[v]
        print(
            f"{v:10} {x['cpu_ns']:7.0f} ns CPU/SYN over the floor ({x['busy_ns']:.0f} total), "
            f"{x['rate'] / 1e3:.0f}k SYN/s sent, allowed {x['served']}/{x['tried']} "
            f"({x['conn_per_s']:.0f}/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
