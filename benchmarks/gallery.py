"""The gallery's sshd as shipped, under the real systemd (PID 1): what an allowed
client waits and what a flood from a denied host costs the machine.

    gallery.py DEB [--smoke] [--json]

A Debian 12 guest is booted with systemd-nspawn (tests/boot/guest.sh: this host's
kernel, so the flood's cost shows in this host's /proc/stat) and DEB installed in
it.  Beside the shipped alfwrapper-sshd.socket (port 22: Accept=yes, its policy as
the socket's IPAddressAllow= and, per connection, alfwrapper judging the peer before
`sshd -i`) runs a plain socket unit (port 2223) that starts `sshd -i` alone, with
the same service settings.

- keyscan: an allowed `ssh-keyscan` (a key exchange), the two ports taking turns,
  once a start has kept the verdict (so that alfwrapper's starts COMMAND from it,
  as on a host after its first connections); its wall time on the client, median
  of the rounds.
- flood: 200 connection attempts a second from a denied host for 20 s (each a SYN
  from a new port, given 1 s), while the allowed client runs one keyscan a second;
  then the same keyscans for as long with no flood.  Each window's busy CPU of the
  whole machine (/proc/stat: all but idle, iowait and steal), in cores, and how
  many keyscans were served.  Needs root.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers.guest import DENY4, GUEST4, Guest  # noqa: E402

GUEST4B = "198.51.100.2"  # the guest's address on the denied host's network
PLAIN_PORT = 2223
PLAIN_SOCKET = f"""[Socket]
ListenStream={PLAIN_PORT}
Accept=yes
"""
PLAIN_SERVICE = """[Service]
ExecStart=-/usr/sbin/sshd -i
StandardInput=socket
StandardError=journal
RuntimeDirectory=sshd
RuntimeDirectoryMode=0755
RuntimeDirectoryPreserve=yes
"""
SCAN = "ssh-keyscan -T 30 -t ed25519 -p {port} " + GUEST4


def busy_jiffies() -> int:
    """The machine's busy time so far: /proc/stat's cpu line less idle, iowait, steal."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq


def timed_scans(g: Guest, ports: list[int]) -> list[tuple[int, float, bool]]:
    """One keyscan per port, in this order, timed on the client side: (port, seconds,
    the host key came back)."""
    loop = "; ".join(
        f"s=$(date +%s%N); {SCAN.format(port=p)} 2>/dev/null | grep -c ssh-ed25519; "
        f"echo {p} $(( $(date +%s%N) - s ))"
        for p in ports
    )
    out = g.script("client", f"bash -c {shlex.quote(loop)}", timeout=60 * len(ports) + 60)
    words = out.stdout.split()
    return [
        (int(words[i + 1]), int(words[i + 2]) / 1e9, words[i] == "1")
        for i in range(0, len(words), 3)
    ]


def paced_scans(g: Guest, seconds: float) -> tuple[int, int, float]:
    """Keyscans through the shipped unit, one a second for ``seconds``: served, tried,
    and the machine's busy CPU meanwhile, in cores."""
    tick = 100.0  # USER_HZ on Linux
    served = tried = 0
    busy, begin = busy_jiffies(), time.monotonic()
    while time.monotonic() - begin < seconds:
        start = time.monotonic()
        served += sum(ok for _, _, ok in timed_scans(g, [22]))
        tried += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))
    cores = (busy_jiffies() - busy) / tick / (time.monotonic() - begin)
    return served, tried, cores


def run(deb: Path, smoke: bool) -> dict[str, Any]:
    g = Guest("alfbench")
    g.stop()  # one left over by an interrupted run
    g.start()
    try:
        g.put(deb, "/root/alfwrapper.deb")
        g.run("apt-get install -y --no-install-recommends /root/alfwrapper.deb", timeout=900)
        g.run(
            "cp /usr/share/alfwrapper/units/* /etc/systemd/system/ && "
            f"printf %s {shlex.quote(PLAIN_SOCKET)} > /etc/systemd/system/plain-sshd.socket && "
            f"printf %s {shlex.quote(PLAIN_SERVICE)} > /etc/systemd/system/plain-sshd@.service"
            " && systemctl daemon-reload && "
            "systemctl start alfwrapper-sshd.socket plain-sshd.socket"
        )
        rounds = 1 if smoke else 15
        scans = timed_scans(g, [22, PLAIN_PORT])  # a first of each, not counted
        assert all(ok for _, _, ok in scans), f"a keyscan failed: {scans}"
        # Then through port 22 until a start has kept its verdict (lifecycle/verdicts.py),
        # as on any host after its first connections: not while the policy the package
        # has just installed is newer than the timestamp margin (cachedir.COARSE_NS).
        kept = "ls /var/cache/alfwrapper/programs/ | grep -c ^verdict-"
        deadline, warming = time.monotonic() + 60, 0
        while g.run(kept, check=False).strip() in ("", "0"):
            assert time.monotonic() < deadline, "no verdict kept within 60 s"
            time.sleep(1)
            timed_scans(g, [22])
            warming += 1
        scans = timed_scans(g, [22, PLAIN_PORT] * rounds)
        assert all(ok for _, _, ok in scans), f"a keyscan failed: {scans}"
        wrapped = statistics.median(s for p, s, _ in scans if p == 22)
        plain = statistics.median(s for p, s, _ in scans if p == PLAIN_PORT)

        rate, seconds = (20, 2) if smoke else (200, 20)
        with ThreadPoolExecutor(1) as pool:
            flood = pool.submit(g.client, "flood", DENY4, GUEST4B, "22", str(rate), str(seconds))
            served, tried, cores = paced_scans(g, seconds)
            flooded = flood.result()
        served_calm, tried_calm, calm = paced_scans(g, seconds)
        accepted = int(g.run("systemctl show -P NAccepted alfwrapper-sshd.socket"))
        allowed = len(scans) // 2 + 1 + warming + tried + tried_calm  # keyscans to port 22
        return {
            "keyscan": {"wrapped": wrapped, "plain": plain, "rounds": rounds,
                        "kept": int(g.run(kept).strip())},
            "flood": {
                "rate": rate, "seconds": seconds, "flood": flooded,
                "served": served, "tried": tried, "cores": cores,
                "served_calm": served_calm, "tried_calm": tried_calm, "cores_calm": calm,
                "accepted_denied": accepted - allowed,
            },
        }  # fmt: skip
    finally:
        g.stop()


def main() -> int:
    args = sys.argv[1:]
    result = run(Path(args[0]), "--smoke" in args)
    print(json.dumps(result) if "--json" in args else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
