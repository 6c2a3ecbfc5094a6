"""End-to-end TCP throughput through the wrapper, against nftables and iptables.

Each variant gets a network namespace of its own, so that one variant's
host firewall rules (iptables walks its whole chain for every packet) cost
the others nothing.  On each namespace's loopback, with offloads off (so the
filter runs once per packet, as in the 2018 paper), at several MTUs, the
same sink is served four ways:

- unfiltered: behind alfwrapper with no rules, so no filter;
- alfwrapper: behind alfwrapper with the rules;
- nftables: unfiltered, with the rules as an interval set in an input hook;
- iptables: unfiltered, with the rules as linear ACCEPT rules (up to 1,000),
  the client's address last (the worst case), then DROP.

Rounds are interleaved, the variant order rotating, and medians reported.
Traffic stays on the namespace's loopback.  Bounded: every blast lasts
SECONDS, and the number of blasts is fixed.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PORTS = {"unfiltered": 9101, "alfwrapper": 9102, "nftables": 9103, "iptables": 9104}
CLIENT = "127.0.0.1"


def ns_run(ns: str, *argv: str, stdin: str | None = None) -> None:
    subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        check=True,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=600,
    )


def prefixes(count: int, seed: int) -> list[str]:
    """count-1 random IPv4 prefixes (/24 and /32, clear of 127/8) and the client, last."""
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < count - 1:
        v = rng.getrandbits(32)
        if v >> 24 in (0, 127) or v >> 28 >= 14:
            continue
        out.add(
            f"{v >> 24}.{v >> 16 & 255}.{v >> 8 & 255}.0/24"
            if len(out) % 2
            else f"{v >> 24}.{v >> 16 & 255}.{v >> 8 & 255}.{v & 255}/32"
        )
    return sorted(out) + [f"{CLIENT}/32"]


def wait_port(ns: str, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"],
            capture_output=True,
            text=True,
        ).stdout
        if "LISTEN" in out:
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def start_servers(spaces: dict[str, str], rules_file: Path | None) -> list[subprocess.Popen[bytes]]:
    procs = []
    for variant, port in PORTS.items():
        argv = [sys.executable, "-m", "alfwrapper", "--listen", f"127.0.0.1:{port}"]
        if variant == "alfwrapper" and rules_file is not None:
            argv += ["--allow-file", str(rules_file)]
        argv += ["--", sys.executable, str(HERE / "sink.py")]
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", spaces[variant], *argv],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    for variant, port in PORTS.items():
        wait_port(spaces[variant], port)
    return procs


def host_rules(spaces: dict[str, str], rules: list[str]) -> None:
    """The same rules in nftables (interval set) and iptables (linear, up to 1,000)."""
    elements = ",\n".join(rules)
    ns_run(
        spaces["nftables"],
        "nft",
        "-f",
        "-",
        stdin=(
            "table inet alfbench {\n"
            "  set allow4 { type ipv4_addr; flags interval; auto-merge;\n"
            f"    elements = {{ {elements} }}\n  }}\n"
            "  chain input { type filter hook input priority 0; policy accept;\n"
            f"    tcp dport {PORTS['nftables']} ip saddr != @allow4 drop\n  }}\n"
            "}\n"
        )
        if rules
        else "table inet alfbench { }\n",
    )
    if rules and len(rules) <= 1000:
        lines = ["*filter"]
        lines += [f"-A INPUT -p tcp --dport {PORTS['iptables']} -s {r} -j ACCEPT" for r in rules]
        lines += [f"-A INPUT -p tcp --dport {PORTS['iptables']} -j DROP", "COMMIT", ""]
        ns_run(spaces["iptables"], "iptables-restore", stdin="\n".join(lines))
    else:
        ns_run(spaces["iptables"], "iptables", "-F", "INPUT")


def blast(ns: str, port: int, seconds: float) -> float:
    out = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            str(HERE / "blast.py"),
            CLIENT,
            str(port),
            str(seconds),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    return float(out.stdout.strip())


def run(
    rule_counts: list[int], mtus: list[int], rounds: int, seconds: float
) -> list[dict[str, object]]:
    """One row per (rules, MTU): median bits per second of each variant."""
    spaces = {v: f"alfbench{os.getpid()}{v[:3]}" for v in PORTS}
    rows: list[dict[str, object]] = []
    try:
        for ns in spaces.values():
            subprocess.run(["ip", "netns", "add", ns], check=True)
            ns_run(ns, "ip", "link", "set", "lo", "up")
            ns_run(ns, "ethtool", "-K", "lo", "tso", "off", "gso", "off", "gro", "off")
        with tempfile.TemporaryDirectory() as tmp:
            for count in rule_counts:
                rules = prefixes(count, count) if count else []
                rules_file = None
                if rules:
                    rules_file = Path(tmp) / f"{count}.rules"
                    rules_file.write_text("\n".join(rules) + "\n")
                host_rules(spaces, rules)
                procs = start_servers(spaces, rules_file)
                try:
                    for mtu in mtus:
                        for ns in spaces.values():
                            ns_run(ns, "ip", "link", "set", "lo", "mtu", str(mtu))
                        samples: dict[str, list[float]] = {v: [] for v in PORTS}
                        variants = list(PORTS)
                        if count > 1000 or not rules:
                            variants.remove("iptables")
                        for r in range(rounds):
                            order = variants[r % len(variants) :] + variants[: r % len(variants)]
                            for variant in order:
                                samples[variant].append(
                                    blast(spaces[variant], PORTS[variant], seconds)
                                )
                        rows.append(
                            {
                                "rules": count,
                                "mtu": mtu,
                                **{
                                    v: statistics.median(s) if s else None
                                    for v, s in samples.items()
                                },
                            }
                        )
                finally:
                    for proc in procs:
                        os.killpg(proc.pid, signal.SIGTERM)
                        proc.wait()
    finally:
        for ns in spaces.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return rows


def table(rows: list[dict[str, object]]) -> list[str]:
    lines = [
        "| Rules | MTU | unfiltered Gbit/s | alfwrapper | nftables | iptables |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        base = float(row["unfiltered"])  # type: ignore[arg-type]
        lines.append(
            f"| {row['rules']:,} | {row['mtu']} | {base / 1e9:.2f} | "
            f"{_cell(row['alfwrapper'], base)} | {_cell(row['nftables'], base)} | "
            f"{_cell(row['iptables'], base)} |"
        )
    return lines


def _cell(value: object, base: float) -> str:
    if value is None:
        return "–"
    bps = float(value)  # type: ignore[arg-type]
    return f"{bps / 1e9:.2f} ({bps / base:.0%})"
