"""What the firewall does, seen from outside: exact counters per reason, status as text,
JSON (against a schema) and Prometheus metrics (through a real parser), and the drop log,
rate-limited, under a flood."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers.hosts import Host, Network, Probe, Service, check_policy
from helpers.support import ECHO_SERVER, ROOT, WRAPPER
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.netns

ATTACKER = ROOT / "tests/programs/attacker.py"
ALLOWLIST = str(ROOT / "tests/data/allowlist.c")

STATUS_SCHEMA = {
    "type": "object",
    "required": ["services"],
    "properties": {
        "services": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "sockets"],
                "properties": {
                    "name": {"type": "string"},
                    "sockets": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "counters", "protocol", "address", "port",
                                         "pid", "rules", "runtime", "program"],
                            "properties": {
                                "name": {"type": "string"},
                                "protocol": {"enum": ["tcp", "udp"]},
                                "pid": {"type": ["integer", "null"]},
                                "program": {"type": "integer", "minimum": 1},
                                "rules": {"type": "object"},
                                "runtime": {"type": "array"},
                                "counters": {
                                    "type": "object",
                                    "required": ["passed", "dropped"],
                                    "properties": {
                                        "passed": {"type": "integer", "minimum": 0},
                                        "dropped": {
                                            "type": "object",
                                            "required": ["subnets", "interfaces", "knocking",
                                                         "filter", "malformed"],
                                            "additionalProperties": {
                                                "type": "integer", "minimum": 0},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        }
    },
}  # fmt: skip


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WRAPPER, *argv], capture_output=True, text=True, timeout=120)


def status(service: str) -> dict[str, Any]:
    out = cli("status", service, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    jsonschema.validate(report, STATUS_SCHEMA)
    return report


def udp_counters(service: str) -> dict[str, Any]:
    sockets = status(service)["services"][0]["sockets"]
    return next(s for s in sockets if s["protocol"] == "udp")["counters"]


def send(host: Host, count: int, tag: str, source: str = "", version: str = "4") -> None:
    """count datagrams to the UDP socket, each a different port so none is a retry."""
    target = host.server_v4 if version == "4" else host.server_v6
    argv = [sys.executable, str(ATTACKER)]
    if source:  # forged, with scapy: in one go (attacker.py raws)
        lines = "".join(
            f"{version} {source} {target} udp 8081 {tag}-{i} - {42000 + i}\n" for i in range(count)
        )
        sent = subprocess.run(host.command([*argv, "raws"]), input=lines, capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        assert sent.stdout.splitlines() == ["sent"] * count, sent.stdout
        return
    for i in range(count):
        cmd = [*argv, "udpflood", target, "8081", "1", f"{tag}-{i}"]
        subprocess.run(host.command(cmd), capture_output=True, timeout=60, check=True)


def start(network: Network, services: list[Service], service: str, *rules: str) -> Service:
    svc = Service(
        network.server,
        [*WRAPPER, "--service", service, "--listen", "[::]:8080", "--listen-datagram",
         "[::]:8081", *rules, "--", *ECHO_SERVER],
    )  # fmt: skip
    services.append(svc)
    svc.wait_for(r"^ready ")
    return svc


REASONS = {
    "subnets": ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"],
    "interfaces": ["--interface", "{allowed_if}"],
    "filter": ["--filter", ALLOWLIST, "--set", "allowed4", "192.0.2.2", "1",
               "--set", "port_limits", "0", "8081,1"],
    "malformed": ["--deny", "203.0.113.0/24"],
}  # fmt: skip


@pytest.mark.parametrize("reason", [*REASONS, "knocking"])
def test_counters_are_exact_per_reason(
    network: Network, services: list[Service], reason: str
) -> None:
    a, b = network.allowed, network.denied
    if reason == "knocking":
        rules = ["--knock", "7001,7002,7003"]
    else:
        rules = [r.format(allowed_if=a.server_if) for r in REASONS[reason]]
    service = f"count-{reason}"
    svc = start(network, services, service, *rules)
    passed, dropped = 5, 7
    if reason == "knocking":  # nobody passes until they knock: all are knocks, dropped
        send(b, dropped, "den")
        expect = {"passed": 0, "knocking": dropped}
    elif reason == "malformed":  # IPv4-mapped sources, from the allowed link
        send(a, passed, "ok")
        send(a, dropped, "mapped", source="::ffff:192.0.2.9", version="6")
        expect = {"passed": passed, "malformed": dropped}
    else:
        send(a, passed, "ok")
        send(b, dropped, "den")
        expect = {"passed": passed, reason: dropped}
    deadline = time.monotonic() + 10
    while True:
        got = udp_counters(service)
        flat = {"passed": got["passed"], **got["dropped"]}
        want = {k: expect.get(k, 0) for k in flat}
        if flat == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert flat == want, (flat, svc.output())
    # Counters outlive a reload: the socket's own, pinned.
    out = cli("reload", service)
    assert out.returncode == 0, out.stderr
    assert udp_counters(service) == got


def test_status_text_json_and_prometheus(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    svc = start(network, services, "seen", "--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48")
    check_policy(
        svc,
        served=[Probe(a, "tcp", 4, 8080)],
        dropped=[Probe(b, "tcp", 4, 8080)],
    )
    assert cli("deny", "seen", "203.0.113.7").returncode == 0
    report = status("seen")
    tcp = next(s for s in report["services"][0]["sockets"] if s["protocol"] == "tcp")
    assert tcp["pid"] == svc.proc.pid
    assert tcp["rules"]["allow"] == 2 and tcp["runtime"] == [
        {"verdict": "deny", "cidr": "203.0.113.7/32"}
    ]
    assert tcp["counters"]["passed"] >= 1 and tcp["counters"]["dropped"]["subnets"] >= 1
    text = cli("status", "seen").stdout
    assert text.startswith("seen:\n") and f"pid {tcp['pid']}" in text
    assert f"subnets {tcp['counters']['dropped']['subnets']}" in text, text
    # Prometheus, read back by prometheus_client's own parser, and into a file atomically.
    out = cli("status", "seen", "--prometheus")
    families = {f.name: f for f in text_string_to_metric_families(out.stdout)}
    samples = families["alfwrapper_packets"].samples
    dropped = {
        s.labels["reason"]: s.value
        for s in samples
        if s.labels["protocol"] == "tcp" and s.labels["verdict"] == "drop"
    }
    assert dropped["subnets"] == tcp["counters"]["dropped"]["subnets"]
    assert {s.labels["service"] for s in samples} == {"seen"}
    runtime = families["alfwrapper_runtime_rules"].samples
    assert [s.value for s in runtime if s.labels["protocol"] == "tcp"] == [1]
    # Prometheus' conventions: no empty label value, and a build_info.
    assert '=""' not in out.stdout, out.stdout
    passed = [s for s in samples if s.labels["verdict"] == "pass"]
    assert passed and all("reason" not in s.labels for s in passed), passed
    (info,) = families["alfwrapper_build_info"].samples
    assert info.name == "alfwrapper_build_info" and info.value == 1 and info.labels["version"]


def test_prometheus_file_is_written_whole(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    start(network, services, "scraped", "--deny", "203.0.113.0/24")
    target = tmp_path / "alfwrapper.prom"
    # A folder someone else left in the tree is no service: it must not break the listing.
    stray = Path("/sys/fs/bpf/alfwrapper/left by someone")
    (stray / "1000").mkdir(parents=True)
    try:
        out = cli("status", "--prometheus", "--output", str(target))
    finally:
        shutil.rmtree(stray)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    names = {f.name for f in text_string_to_metric_families(target.read_text())}
    assert "alfwrapper_packets" in names
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left


def test_drop_log_under_a_flood(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    rate = 50
    svc = start(network, services, "flooded", "--allow", "192.0.2.0/24", "--log-drops", str(rate))
    send(b, 1, "first")
    first = cli("log", "flooded")
    assert first.returncode == 0, first.stderr
    assert "dns" not in first.stdout  # sockets are unnamed here
    line = first.stdout.splitlines()[0]
    assert "dropped by subnets: 198.51.100.2 udp port 8081" in line, first.stdout
    # 100,000 denied datagrams, while the allowed host is served.
    begin = time.monotonic()
    flood = subprocess.Popen(
        b.command(
            [sys.executable, str(ATTACKER), "udpflood", b.server_v4, "8081", "100000", "flood"]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    check_policy(svc, served=[Probe(a, "udp", 4, 8081), Probe(a, "tcp", 4, 8080)], dropped=[])
    sent = flood.communicate(timeout=120)[0].split()
    elapsed = time.monotonic() - begin
    assert sent[0] == "sent" and int(sent[1]) == 100000, sent
    out = cli("log", "flooded", "--json")
    events = [json.loads(line) for line in out.stdout.splitlines()]
    counters = udp_counters("flooded")
    udp = next(s for s in status("flooded")["services"][0]["sockets"] if s["protocol"] == "udp")
    dropped = counters["dropped"]["subnets"]
    # Within the rate (a burst of one second's worth, plus one a CPU for the races),
    # and every drop either logged (the first one, read before, and these) or counted
    # as suppressed.
    assert len(events) <= rate * (elapsed + 1) + rate + 4, (len(events), elapsed)
    assert 1 + len(events) + udp["log_suppressed"] == dropped, (len(events), udp, dropped)
    assert dropped > 1000, dropped  # the flood did reach the filter
    assert all(e["reason"] == "subnets" and e["source"] == b.v4 for e in events)
    assert sum(e["suppressed_before"] for e in events) <= udp["log_suppressed"]


def bpftool(*argv: str) -> Any:
    out = subprocess.run(["bpftool", "-j", *argv], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_programs_and_maps_are_named_for_service_and_socket(
    network: Network, services: list[Service]
) -> None:
    start(network, services, "web", "--allow", "192.0.2.0/24", "--log-drops", "5",
          "--knock", "7001,7002,7003")  # fmt: skip
    for s in status("web")["services"][0]["sockets"]:
        label = f"web_{s['protocol'][0]}{s['port']}"
        prog = bpftool("prog", "show", "id", str(s["program"]))
        assert prog["name"] == label, prog
        names = {bpftool("map", "show", "id", str(i))["name"] for i in prog["map_ids"]}
        wanted = {f"{label}.{role}" for role in ("cnt", "log", "logb", "rt", "sn4", "snl", "snr")}
        assert wanted <= names, names
        # The knock state is the service's, shared: named for the socket that made it.
        assert any(n.startswith("web_") and n.endswith(".kst") for n in names), names
    dispatchers = [
        p["name"] for p in bpftool("prog", "show") if p.get("name", "").startswith("web_")
    ]
    assert sorted(dispatchers).count("web_t8080_d") == 1, dispatchers
