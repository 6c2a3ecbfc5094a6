"""What the netns tests share: starting the wrapped echo service in a network,
checking who it serves, knocking, rule files, and running the wrapper for its errors."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

from helpers.hosts import Host, Network, Service, all_probes, check_policy
from helpers.support import ECHO_SERVER, WRAPPER


def start(
    network: Network, services: list[Service], argv: list[str], ready: bool = True
) -> Service:
    svc = Service(network.server, argv)
    services.append(svc)
    if ready:
        svc.wait_for(r"^ready ")
    return svc


def allowed_in_denied_out(
    svc: Service, network: Network, tcp: int = 8080, udp: int | None = 8081
) -> None:
    """The allowed host is served over TCP (and UDP), IPv4 and IPv6; the denied one is not."""
    check_policy(
        svc,
        served=all_probes(network.allowed, tcp, udp),
        dropped=all_probes(network.denied, tcp, udp),
    )


def wrapped(*options: str) -> list[str]:
    return [*WRAPPER, *options, "--", *ECHO_SERVER]


def million_rule_file(path: Path, allowed: list[str]) -> None:
    """1,000,000 CIDRs: random /24s and /32s plus some IPv6, none covering the denied host."""
    rng = random.Random(2018)
    lines = []
    while len(lines) < 1_000_000 - len(allowed):
        value = rng.getrandbits(32)
        if value >> 24 in (0, 127, 198) or value >> 28 >= 14:
            continue  # keep clear of 198.51.100.0/24 (the denied host) and odd ranges
        if len(lines) % 2:
            lines.append(f"{value >> 24}.{value >> 16 & 255}.{value >> 8 & 255}.0/24")
        elif len(lines) % 10 == 4:
            # 2001:XXXX::/32 with XXXX odd never covers 2001:db8::/32.
            lines.append(f"2001:{value >> 16 | 1:x}:{value & 0xFFFF:x}::/48")
        else:
            lines.append(f"{value >> 24}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}")
    path.write_text("# a million rules\n" + "\n".join(lines + allowed) + "\n")


def knock(host: Host, family: int, *how: str, port: int = 8080) -> str:
    """Knock with `alfwrapper knock`; returns the ports it knocked from."""
    target = host.server_v4 if family == 4 else host.server_v6
    out = subprocess.run(
        host.command([*WRAPPER, "knock", target, str(port), *how]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("from ports ")[1].strip()


def run(
    tmp_path: Path, *options: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> tuple[int, str, bool]:
    """Run the wrapper with a COMMAND that leaves a mark; return (code, stderr, ran)."""
    mark = tmp_path / "command-ran"
    argv = [*prefix, *WRAPPER, *options, "--", "/bin/sh", "-c", f"touch {mark}"]
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
    )
    return out.returncode, out.stderr, mark.exists()


def assert_one_line(stderr: str, *needles: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("alfwrapper: "), stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], stderr
