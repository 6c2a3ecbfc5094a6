"""`alfwrapper explain SERVICE` against real traffic: after every live change (a
runtime deny, allow and revoke, a set entry, a knock, a reload), the verdict it gives
for each probe is what the application then receives; it moves no counter; and when the
files changed since the rules were put in force, it refuses instead of answering for
other rules."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, all_probes, check_policy, start_echo
from helpers.support import WRAPPER
from helpers.wrapping import knock

pytestmark = pytest.mark.netns

SEQ = "7001,7002,7003"


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WRAPPER, *argv], capture_output=True, text=True, timeout=120)


def explained(service: str, probe: Probe) -> dict[str, object]:
    out = cli("explain", service, "--from", probe.source, "--port", str(probe.port),
              "--protocol", probe.proto, "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


class Said(dict):  # type: ignore[type-arg]
    """Explain's verdicts by probe (a Probe's Host is not hashable)."""

    def __getitem__(self, probe: Probe) -> dict[str, object]:
        return super().__getitem__(repr(probe))  # type: ignore[no-any-return]


def agree(svc: Service, service: str, probes: list[Probe]) -> Said:
    """Explain each probe, then send it: explain's pass is served, its drop dropped."""
    said = Said({repr(p): explained(service, p) for p in probes})
    check_policy(
        svc,
        served=[p for p in probes if said[p]["verdict"] == "pass"],
        dropped=[p for p in probes if said[p]["verdict"] == "drop"],
    )
    return said


def counters(service: str) -> str:
    out = cli("status", service, "--json")
    assert out.returncode == 0, out.stderr
    return json.dumps([s.get("counters") for s in json.loads(out.stdout)["services"][0]["sockets"]])


@pytest.fixture
def set_name(bpf_root: None) -> Iterator[str]:
    name = f"x{os.getpid()}-{time.monotonic_ns() % 10**9}"
    yield name
    cli("set", "destroy", name)


def test_explain_follows_runtime_rules_sets_and_reloads(
    network: Network, services: list[Service], set_name: str, tmp_path: Path
) -> None:
    a, b = network.allowed, network.denied
    assert cli("set", "create", set_name).returncode == 0
    denied = tmp_path / "deny.txt"
    denied.write_text("203.0.113.0/24\n")
    svc = start_echo(
        network, services, "explained", "--deny-set", set_name, "--deny-file", str(denied)
    )
    probes = all_probes(a, 8080, 8081) + all_probes(b, 8080, 8081)
    said = agree(svc, "explained", probes)
    assert all(v["verdict"] == "pass" for v in said.values()), said

    before = counters("explained")
    for probe in probes:
        explained("explained", probe)
    assert counters("explained") == before  # explain judges no packet of the service's

    assert cli("deny", "explained", a.v4, "2001:db8:a::/48").returncode == 0
    said = agree(svc, "explained", probes)
    tcp4 = said[Probe(a, "tcp", 4, 8080)]
    assert tcp4["verdict"] == "drop" and tcp4["part"] == "runtime", tcp4
    assert f"runtime deny {a.v4}/32" in str(tcp4["rule"]), tcp4
    assert said[Probe(a, "udp", 6, 8081)]["verdict"] == "drop"

    assert cli("set", "add", set_name, b.v6).returncode == 0
    said = agree(svc, "explained", probes)
    assert said[Probe(b, "tcp", 6, 8080)]["verdict"] == "drop"
    assert f"{b.v6}/128 in set {set_name}" in str(said[Probe(b, "tcp", 6, 8080)]["rule"])
    assert said[Probe(b, "tcp", 4, 8080)]["verdict"] == "pass"

    # A runtime allow on one socket; a reload keeps the runtime rules.
    assert cli("allow", "explained", "--socket", "web", a.v4).returncode == 0
    assert cli("reload", "explained").returncode == 0
    said = agree(svc, "explained", probes)
    assert said[Probe(a, "tcp", 4, 8080)]["verdict"] == "pass"
    assert "runtime allow" in str(said[Probe(a, "tcp", 4, 8080)]["rule"])
    assert said[Probe(a, "udp", 4, 8081)]["verdict"] == "drop"

    # The rule file changed, not yet reloaded: explain will not answer for it.
    denied.write_text("203.0.113.0/24\n198.51.100.0/24\n")
    out = cli("explain", "explained", "--from", b.v4, "--port", "8080")
    assert out.returncode == 75 and "changed since" in out.stderr, out
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out
    assert cli("reload", "explained").returncode == 0
    said = agree(svc, "explained", probes)
    assert said[Probe(b, "tcp", 4, 8080)]["verdict"] == "drop"
    assert str(denied) in str(said[Probe(b, "tcp", 4, 8080)]["rule"])

    assert cli("revoke", "explained", "--all").returncode == 0
    assert cli("set", "del", set_name, b.v6).returncode == 0
    said = agree(svc, "explained", probes)
    assert [p for p in probes if said[p]["verdict"] == "drop"] == [
        p for p in probes if p.host is b and p.family == 4
    ], said


def test_explain_follows_knocks(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    svc = start_echo(network, services, "explained-knock", "--knock", SEQ)
    probes = all_probes(a, 8080, 8081) + all_probes(b, 8080, 8081)
    said = agree(svc, "explained-knock", probes)
    assert all(v["verdict"] == "drop" and v["part"] == "knocking" for v in said.values()), said
    knock(a, 4, "--sequence", SEQ)
    said = agree(svc, "explained-knock", probes)
    opened = [p for p in probes if said[p]["verdict"] == "pass"]
    assert opened == [Probe(a, "tcp", 4, 8080), Probe(a, "udp", 4, 8081)], said
    # Explaining took no knock step and changed nothing: still open, still shut.
    said = agree(svc, "explained-knock", probes)
    assert said[Probe(a, "tcp", 4, 8080)]["verdict"] == "pass"


def test_explain_service_errors(network: Network, services: list[Service]) -> None:
    start_echo(network, services, "explained-errors", "--deny", "203.0.113.0/24")
    for argv, code, needle in (
        (["explain", "nosuch", "--from", "192.0.2.1"], 64, "has no pinned state"),
        (["explain", "explained-errors", "--from", "192.0.2.1"], 64, "more than one socket"),
        (["explain", "explained-errors", "--from", "192.0.2.1", "--deny", "192.0.2.0/24"],
         64, "is for explaining rules"),
        (["explain", "explained-errors", "--socket", "nope", "--from", "192.0.2.1"], 64,
         "no socket of that name"),
    ):  # fmt: skip
        out = cli(*argv)
        assert out.returncode == code and needle in out.stderr, (argv, out)
        assert len(out.stderr.splitlines()) == 1, out.stderr
