"""The denied client during the wrapper's own start: created sockets are filtered before
they are bound, so nothing sent while a slow start (a 1,000,000-rule file) compiles and
loads is queued unfiltered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from attacks import ATTACKER, seen_from, wait_line
from hosts import Network, Service, all_probes, check_policy
from support import ECHO_SERVER, WRAPPER
from wrapping import million_rule_file


def test_nothing_reaches_created_sockets_during_a_slow_start(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    a, b = network.allowed, network.denied
    rules = tmp_path / "million.rules"
    million_rule_file(rules, ["192.0.2.2/32", "2001:db8:a::2/128"])
    stop = tmp_path / "stop"
    floods = [
        subprocess.Popen(
            b.command(
                [
                    sys.executable,
                    str(ATTACKER),
                    "flood",
                    target,
                    "8080",
                    "8081",
                    str(stop),
                    f"EARLY{family}",
                ]
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        for family, target in ((4, b.server_v4), (6, b.server_v6))
    ]
    try:
        for proc in floods:
            assert wait_line(proc) == "flooding"
        svc = Service(
            network.server,
            [
                *WRAPPER,
                "--listen",
                "[::]:8080",
                "--listen-datagram",
                "[::]:8081",
                "--allow-file",
                str(rules),
                "--",
                *ECHO_SERVER,
            ],
        )
        services.append(svc)
        svc.wait_for(r"^ready ", timeout=120)
        check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    finally:
        stop.touch()
        counts = [proc.communicate(timeout=90)[0].strip() for proc in floods]
    assert all(int(c.split()[1]) > 50 for c in counts), counts  # it did flood the start
    assert not seen_from(svc, b.v4, b.v6), svc.output()
    assert "EARLY" not in svc.output()
