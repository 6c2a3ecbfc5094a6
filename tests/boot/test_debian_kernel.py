"""The boot tier on Debian's own kernels: the same guest images booted by qemu with
Debian 12's 6.1 and Debian 13's 6.12 (emulated, TCG: /dev/kvm here is nested PVM,
which cannot boot them), the
`.deb` installed, the echo unit as shipped serving allowed clients and dropping denied
ones (its Accept=yes unit never accepting a denied one), the loader compiling and
loading for an ordinary user (and counting what they hold in a memory cgroup of
theirs: cgroup v2, as both releases boot), and a unit whose every start fails stopping
its socket instead of being started for each waiting client.

Under TCG everything is 10 to 30 times slower: a start compiles for about a minute."""

from __future__ import annotations

import json
import re

import pytest
from helpers.guest import (
    KERNELS,
    Guest,
    a_failing_start_stops_its_socket,
    a_named_set_under_the_template,
    never_accepted,
    platform_line,
    served_and_dropped,
    stop,
)
from helpers.support import PROGRAMS, loader_arguments

from alfwrapper.loader.quota import DEFAULT_MAP_MEMORY

pytestmark = pytest.mark.boot

HOARD = PROGRAMS / "hoard.py"

FIRST = "400"  # seconds for a first client: the service compiles under emulation
ECHO = "alfwrapper-echo.service"


def test_echo_on_debians_own_kernel(qemu_guest: Guest) -> None:
    g = qemu_guest
    assert g.run("uname -r").startswith(KERNELS[g.suite]), g.run("uname -r")
    code, out = g.status("alfwrapper doctor", timeout=900)
    assert code == 0, out
    assert platform_line(g) in out, out
    g.run("systemctl start alfwrapper-echo.socket")
    try:
        served_and_dropped(g, ECHO, 8080, first=FIRST)
    finally:
        stop(g, "alfwrapper-echo.socket", ECHO)
    # Accept=yes: the generator's IPAddressAllow= drops a denied peer before systemd
    # accepts it, on this kernel's cgroup filters too.
    g.run("systemctl start alfwrapper-echo-accept.socket")
    try:
        never_accepted(g, "alfwrapper-echo-accept.socket", "8083")
    finally:
        stop(g, "alfwrapper-echo-accept.socket")


def test_a_named_set_on_debians_own_kernel(qemu_guest: Guest) -> None:
    a_named_set_under_the_template(qemu_guest, 8086, FIRST)


def test_the_loader_on_debians_own_kernel(qemu_guest: Guest) -> None:
    g = qemu_guest
    g.run("id alfcheck >/dev/null 2>&1 || useradd -m alfcheck")
    g.run("systemctl start alfwrapper-loader.socket")
    try:
        code, out = g.status("cd / && runuser -u alfcheck -- alfwrapper doctor", timeout=900)
        assert code == 0 and "through the loader" in out, out + g.journal(
            "alfwrapper-loader.service"
        )
        # Debian 12 and 13 boot cgroup v2 with Landlock in their LSM list: both guards hold.
        assert "counted by the kernel (a memory cgroup of yours)" in out, out
        assert "every compile is confined by Landlock (ABI" in out, out
    finally:
        stop(g, "alfwrapper-loader.socket", "alfwrapper-loader.service")


def test_a_slow_failing_start_stops_its_socket(qemu_guest: Guest) -> None:
    """Where a start takes seconds (here, a million-line rule file with a bad last line,
    read under emulation), systemd's default start limit (5 in 10 s) never hits, and a
    waiting client had the service started again and again.  The shipped limit (10 in
    5 minutes) stops it."""
    a_failing_start_stops_its_socket(qemu_guest, "5", 400, slow_lines=1_000_000)


# MiB.  Each program with RULES IPv6 /64s holds about 19 MiB of maps, so MOST of them
# are well over the quota whatever one request peaks at: a few fit, then one is
# refused.  The quota is kept small: under emulation each request takes about 30 s
# (one run: a request alone peaked at 124 MiB; the user's count grew 90 MiB with the
# first program, then 17 MiB a program, and the ninth was refused).
QUOTA = 256
RULES = 300_000
MOST = 60
# MiB.  MemAvailable is the whole guest's: beside what the user's cgroup holds it falls
# with the loader's own process, the journal, and the part of the cgroup's page cache
# MemAvailable does not count as free (one CI run: 532 MiB at a quota of 512; in
# another run MemAvailable fell up to 137 MiB more than the cgroup's own count grew).
# Held uncounted, MOST programs would take about 1,100 MiB.
SLACK = 128


def test_the_loaders_quota_counts_what_a_user_holds(qemu_guest: Guest) -> None:
    """A user keeps each program's fd and drops its socket (hoard.py): what the
    loader's own books count goes to zero, but the kernel charges every map to the
    user's memory cgroup until it is freed, whose memory.max is the quota, so one program
    is refused, and MemAvailable never fell by more than the quota and SLACK."""
    g = qemu_guest
    g.run("id alfcheck >/dev/null 2>&1 || useradd -m alfcheck")
    g.put(HOARD, "/var/tmp/hoard.py")
    dropin = "/etc/systemd/system/alfwrapper-loader.service.d"
    g.run(
        f"mkdir -p {dropin} && printf '[Service]\\nExecStart=\\nExecStart=/usr/bin/alfwrapper "
        f"loader {loader_arguments()} --max-map-memory {QUOTA}\\n' "
        f"> {dropin}/quota.conf && systemctl daemon-reload && "
        "systemctl restart alfwrapper-loader.socket"
    )
    try:  # one request alone: what it peaks at, its compile included, fits the default
        g.run(f"cd / && runuser -u alfcheck -- python3 /var/tmp/hoard.py {RULES} 1", timeout=600)
        log = g.journal("alfwrapper-loader.service")
        base = re.search(r"counted by the kernel in (\S+)/u<UID>", log)
        assert base, log
        cgroup = f"{base[1]}/u{g.run('id -u alfcheck').strip()}"
        peak = int(g.run(f"cat {cgroup}/memory.peak")) / 2**20
        print(f"one request of {RULES:,} rules peaked at {peak:.0f} MiB")
        assert peak < DEFAULT_MAP_MEMORY >> 20, peak
        hoard = f"/var/tmp/hoard.py {RULES} {MOST} --counted 3< {cgroup}/memory.current"
        code, out = g.status(f"cd / && runuser -u alfcheck -- python3 {hoard}", timeout=1500)
        log = g.journal("alfwrapper-loader.service")
        assert code == 0, out + log
        assert "counted by the kernel" in log, log
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        first, *loads = lines
        print(f"quota {QUOTA} MiB: " + "; ".join(
            f"{i + 1}: {'refused' if 'error' in x['answer'] else 'loaded'}, MemAvailable "
            f"{(first['available'] - x['available']) / 1024:+.0f} MiB, counted "
            f"{(x['counted'] - first['counted']) / 1024:+.0f} MiB"
            for i, x in enumerate(loads)))  # fmt: skip
        refused = [x["answer"]["error"] for x in loads if "error" in x["answer"]]
        assert refused and refused[0]["code"] == 77 and "quota" in refused[0]["what"], out + log
        assert sum("error" not in x["answer"] for x in loads) >= 1, out
        # Uncounted, they would hold over three times the quota (about 1 GiB: each
        # program's maps are 19 MiB on 6.1, 17 MiB on 6.12).
        assert MOST * loads[0]["answer"]["map_bytes"] > 3 * QUOTA << 20, out
        assert int(g.run(f"cat {cgroup}/memory.max")) == QUOTA << 20
        fell = max(first["available"] - x["available"] for x in loads) / 1024
        assert fell <= QUOTA + SLACK, (fell, out)
    finally:
        g.run(
            f"rm -rf {dropin}; systemctl daemon-reload; systemctl stop "
            "alfwrapper-loader.socket alfwrapper-loader.service",
            check=False,
        )
