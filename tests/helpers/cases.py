"""Every shape of program alfwrapper generates, and how to record them on the host.

A program's code depends on which parts its rules use (program.plan_program), on
the table sizes the rules give (the subnet part's -D settings), on whether its
socket keeps pinned state (the runtime rules part and the dispatcher), and on
--log-drops.  Each case below is one rule set; it is recorded twice: through
`alfwrapper check` (the program of an Accept=yes connection or of `check`: no
pinned state) and through the wrapper itself (a created TCP and UDP socket with
pinned state, its dispatcher, then `true` as the application).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
WRAPPER = [sys.executable, "-m", "alfwrapper"]
MILLION = 1_000_000


@dataclass(frozen=True)
class Case:
    name: str
    rules: str  # rule options; {files} is the folder of the rule files below
    check: bool = True  # through `alfwrapper check` (no rules: no program to check)
    wrapper: bool = True  # through the wrapper (a created socket with pinned state)


def rule_files(folder: Path) -> None:
    """The big rule sets: a million of each family, mixed, and deep IPv6 rules."""
    folder.mkdir(parents=True, exist_ok=True)
    v4 = folder / "v4-million.rules"
    if not v4.exists():
        base = int(ipaddress.IPv4Address("10.0.0.0"))
        v4.write_text("".join(f"{ipaddress.IPv4Address(base + 7 * i)}\n" for i in range(MILLION)))
    v6 = folder / "v6-million.rules"
    if not v6.exists():
        v6.write_text(
            "".join(f"2001:db8:{i >> 16:x}:{i & 0xFFFF:x}::/64\n" for i in range(MILLION))
        )
    mixed = folder / "mixed-million.rules"
    if not mixed.exists():
        lines4 = v4.read_text().splitlines()[: MILLION // 2]
        lines6 = v6.read_text().splitlines()[: MILLION // 2]
        mixed.write_text("\n".join(lines4 + lines6) + "\n")
    deep = folder / "v6-deep.rules"
    if not deep.exists():
        deep.write_text(
            "".join(f"2001:db8:ff::{i >> 16:x}:{i & 0xFFFF:x}/128\n" for i in range(100_000))
        )


SECRET = "knock.secret"
CLIENT_KEY = "client.key"  # a client's own SPA key (knock-spa-key)
FILTER = f"--filter {ROOT}/examples/filters/allowlist.c"
TEST_FILTER = f"--filter {ROOT}/tests/data/allowlist.c"
SETS = "--set allowed4 192.0.2.2 1 --set allowed6 2001:db8:a::2 1 --set port_limits 0 8080,1"

# The most sets one socket names (policy.rules.MOST_SETS): each is two maps of its
# program's own, beside every other part's.
MANY_SETS = tuple(f"ktier-s{i}" for i in range(14))
SET_NAMES = ("ktier-d", "ktier-a", *MANY_SETS)
CASES = (
    Case("empty", "", check=False),
    Case("allow-v4", "--allow 192.0.2.0/24"),
    Case("allow-v6", "--allow 2001:db8:a::/48"),
    Case("deny-only", "--deny 198.51.100.0/24 --deny 2001:db8:b::/48"),
    Case("mapped", "--allow ::ffff:192.0.2.0/120 --deny ::ffff:192.0.2.1"),
    Case(
        "allow-deny-deep",
        "--allow 192.0.2.0/24 --deny 192.0.2.1 --allow 2001:db8::/32 --deny 2001:db8::1/128 "
        "--deny 2001:db8:0:1:2:3::/96",
    ),
    Case("v4-million", "--allow-file {files}/v4-million.rules"),
    Case("v6-million", "--deny-file {files}/v6-million.rules"),
    Case("mixed-million", "--allow-file {files}/mixed-million.rules"),
    Case("v6-deep", "--allow-file {files}/v6-deep.rules --deny 2001:db8:ff::1"),
    Case("interface", "--interface lo"),
    Case("knock-ports", "--knock 7001,7002,7003"),
    Case("knock-secret", f"--knock-secret {{files}}/{SECRET} --knock-steps 4"),
    # Single-packet authorization: the sockets' programs and their SPA sockets' (SipHash,
    # an atomic compare-and-swap; each SPA socket on its socket's address).
    Case(
        "knock-spa",
        f"--knock-secret {{files}}/{SECRET} --knock-spa --knock-spa-port 39999 "
        f"--knock-spa-key {{files}}/{CLIENT_KEY} "
        "--knock-spa-sender --allow 192.0.2.0/24 --allow 2001:db8::/32",
    ),
    Case("filter", f"{FILTER} {SETS}"),
    Case("filter-raw-offsets", f"{TEST_FILTER} {SETS}"),
    Case("log-drops", "--allow 192.0.2.0/24 --log-drops 50"),
    Case(
        "composed",
        f"--interface lo --allow 192.0.2.0/24 --deny 2001:db8:b::/48 --knock 7001,7002 "
        f"{FILTER} {SETS} --log-drops 10",
    ),
    Case("sets-deny", "--deny-set ktier-d --deny 2001:db8:b::/48"),
    Case("sets-allow", "--allow-set ktier-a --deny-set ktier-d --allow 192.0.2.0/24"),
    Case(
        "sets-most-composed",
        f"--interface lo --allow 192.0.2.0/24 --knock-secret {{files}}/{SECRET} {FILTER} {SETS} "
        "--log-drops 10 --allow-set ktier-a --deny-set ktier-d "
        + " ".join(f"--deny-set {name}" for name in MANY_SETS),
    ),
    Case(
        "composed-million",
        f"--allow-file {{files}}/mixed-million.rules --knock-secret {{files}}/{SECRET} "
        f"{FILTER} {SETS} --log-drops 10",
    ),
)


# Early drop's XDP program, for one set and for each count up to the most one interface
# takes (sets/early.py: MOST_EARLY): root's alone (replay_bpf.c loads it as root only).
EARLY = "early"
EARLY_INTERFACE = "ktier-early0"  # one end of a veth pair (this kernel has no dummy)


def record_early(env: dict[str, str], out: Path) -> dict[str, str]:
    """`alfwrapper set early` of each named set in turn on a veth interface (its
    programs in out/early.early.rec), then early drop taken off it again."""
    failures: dict[str, str] = {}
    subprocess.run(["ip", "link", "del", EARLY_INTERFACE], capture_output=True)
    subprocess.run(
        ["ip", "link", "add", EARLY_INTERFACE, "type", "veth", "peer", "name", "ktier-early1"],
        check=True,
    )
    try:
        for name in SET_NAMES:
            env = {**env, "ALF_RECORD_BPF": str(out / f"{EARLY}.early.rec")}
            done = subprocess.run(
                [*WRAPPER, "set", "early", name, EARLY_INTERFACE],
                env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
            )  # fmt: skip
            if done.returncode != 0:
                failures[f"{EARLY}.early {name}"] = done.stderr.strip()[-2000:]
    finally:
        for name in SET_NAMES:
            subprocess.run([*WRAPPER, "set", "early", name], capture_output=True, cwd=ROOT)
        subprocess.run(["ip", "link", "del", EARLY_INTERFACE], capture_output=True)
    return failures


def record(recorder: Path, out: Path, files: Path) -> dict[str, str]:
    """Run every case with the recorder preloaded; returns {recording: error} for the
    runs that failed on the host (each run's programs are in out/NAME.rec)."""
    rule_files(files)
    for name in (SECRET, CLIENT_KEY):
        secret = files / name
        if not secret.exists():
            secret.write_bytes(os.urandom(32))
            secret.chmod(0o600)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.rec"):
        old.unlink()
    failures: dict[str, str] = {}
    env = {**os.environ, "LD_PRELOAD": str(recorder), "PYTHONPATH": str(ROOT)}
    only = set(filter(None, os.environ.get("ALF_KERNEL_CASES", "").split(",")))
    for name in SET_NAMES:  # the named sets the cases name, empty
        subprocess.run(
            [*WRAPPER, "set", "create", name], check=True, capture_output=True, timeout=60, cwd=ROOT
        )
    for port, case in enumerate(CASES, start=39100):
        if only and case.name not in only:
            continue
        rules = case.rules.replace("{files}", str(files)).split()
        runs = {f"{case.name}.check": [*WRAPPER, "check", *rules]} if case.check else {}
        if case.wrapper:
            runs[f"{case.name}.wrapper"] = [
                *WRAPPER, "--service", f"ktier-{case.name}", "--listen", f"127.0.0.1:{port}",
                "--listen-datagram", f"[::1]:{port}", *rules, "--", "true",
            ]  # fmt: skip
        for recording, argv in runs.items():
            env["ALF_RECORD_BPF"] = str(out / f"{recording}.rec")
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
            )
            if done.returncode != 0:
                failures[recording] = done.stderr.strip()[-2000:]
    if not only or EARLY in only:
        failures.update(record_early(env, out))
    subprocess.run([*WRAPPER, "gc"], capture_output=True, timeout=120, cwd=ROOT)
    for name in SET_NAMES:
        subprocess.run(
            [*WRAPPER, "set", "destroy", name], capture_output=True, timeout=60, cwd=ROOT
        )
    return failures
