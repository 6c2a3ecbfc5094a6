"""Every part gives the same verdict on the same crafted packet in a test run
(BPF_PROG_TEST_RUN, where the packet starts at the network header) as on a real socket
(where it starts at the transport header): IPv4 options, IPv6 extension headers,
IPv4-mapped sources, TCP and UDP.  The verdicts the backlog check and `explain` give
are only as good as this agreement.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import pytest
from helpers.attacks import ATTACKER, PARTS
from helpers.craft import frame, packet
from helpers.hosts import Host, Network, Service, ifindex
from helpers.support import ECHO_SERVER, WRAPPER

from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.host.bpf_calls import prog_test_run

pytestmark = pytest.mark.netns


@dataclass(frozen=True)
class Case:
    sender: str  # "allowed" or "denied": the host that sends it
    version: str
    src: str  # "" for the sender's own address
    kind: str  # "udp" or "syn"
    exts: tuple[str, ...] = ()


CASES = [
    Case("allowed", "4", "", "udp"),
    Case("allowed", "4", "", "udp", ("ipopt",)),
    Case("allowed", "6", "", "udp"),
    Case("allowed", "6", "", "udp", ("hbh",)),
    Case("allowed", "6", "", "udp", ("dest", "frag")),
    Case("allowed", "6", "", "udp", ("hbh", "dest", "frag")),
    Case("allowed", "6", "::ffff:203.0.113.9", "udp"),  # mapped, from an allowed link
    Case("denied", "4", "", "udp"),
    Case("denied", "4", "", "udp", ("ipopt",)),
    Case("denied", "6", "", "udp", ("hbh",)),
    Case("denied", "6", "::ffff:192.0.2.2", "udp"),  # the allowed host's IPv4, mapped
    Case("denied", "6", "::ffff:198.51.100.2", "udp"),
    Case("allowed", "4", "", "syn"),
    Case("allowed", "4", "", "syn", ("ipopt",)),
    Case("allowed", "6", "", "syn", ("hbh",)),
    Case("allowed", "6", "", "syn", ("dest", "frag")),
    Case("denied", "4", "", "syn"),
    Case("denied", "6", "", "syn", ("hbh",)),
    Case("denied", "6", "::ffff:192.0.2.2", "syn"),
]


def send(host: Host, packets: list[tuple[str, ...]]) -> list[str]:
    """Crafted packets from host, sent in one go (attacker.py raws); the answer to each."""
    out = subprocess.run(
        host.command([sys.executable, str(ATTACKER), "raws"]),
        input="".join(" ".join(fields) + "\n" for fields in packets),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    answers = out.stdout.splitlines()
    assert len(answers) == len(packets), out.stdout
    return answers


# Deny rules alone: what an IPv4-mapped source slipped past (it is no IPv6 the rules name).
RULES = {**PARTS, "deny-only": ["--deny", "198.51.100.0/24", "--deny", "2001:db8:b::/48"]}


@pytest.mark.parametrize("part", ["subnets", "deny-only", "interfaces", "filter"])
def test_test_run_and_socket_agree(network: Network, services: list[Service], part: str) -> None:
    a, b = network.allowed, network.denied
    rules = [r.format(allowed_if=a.server_if) for r in RULES[part]]
    svc = Service(
        network.server,
        [
            *WRAPPER,
            "--listen",
            "[::]:8080",
            "--listen-datagram",
            "[::]:8081",
            *rules,
            "--",
            *ECHO_SERVER,
        ],
    )
    services.append(svc)
    svc.wait_for(r"^ready ")
    # The same rules, loaded here for test runs.
    config = parse_policy(rules)
    index = {name: ifindex(network.server, name) for name in (a.server_if, b.server_if)}
    loaded = compiler.load_program(
        program.plan_program(config.rules_for("web")),
        FillEnv({index[n]: n for n in config.rules_for("web").interfaces}),
    )
    rows, sent = [], {"allowed": [], "denied": []}
    for n, case in enumerate(CASES):
        host = a if case.sender == "allowed" else b
        src = case.src or (host.v4 if case.version == "4" else host.v6)
        dst = host.server_v4 if case.version == "4" else host.server_v6
        port = 8081 if case.kind == "udp" else 8080
        token = f"case{n}-{uuid.uuid4().hex[:8]}"
        pkt = packet(case.version, src, dst, case.kind, port, token, case.exts, 41000 + n)
        run = prog_test_run(loaded.fd, frame(pkt), ingress_ifindex=index[host.server_if])
        fields = (case.version, src, dst, case.kind, str(port), token, ",".join(case.exts) or "-")
        sent[case.sender].append((*fields, str(41000 + n)))
        rows.append((case, token, run.retval != 0))
    answers = dict(zip([f[5] for f in sent["allowed"]], send(a, sent["allowed"]), strict=True))
    answers |= zip([f[5] for f in sent["denied"]], send(b, sent["denied"]), strict=True)
    # Everything sent; let the application log what it got.
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        time.sleep(0.1)
    on_socket = {
        token: (token in svc.output()) if case.kind == "udp" else (answers[token] == "synack")
        for case, token, _ in rows
    }
    disagree = [(c, run, on_socket[t]) for c, t, run in rows if run != on_socket[t]]
    assert not disagree, f"test run vs socket: {disagree}\n{svc.output()}"
    # And the verdicts are the policy's: not a vacuous agreement.
    for case, token, _ in rows:
        expected = case.sender == "allowed" and not case.src.startswith("::ffff:")
        assert on_socket[token] == expected, (case, svc.output())


def test_knocking_agrees_on_crafted_knocks(network: Network, services: list[Service]) -> None:
    """Knocks with IPv4 options and IPv6 extension headers open the door, in both contexts."""
    a, b = network.allowed, network.denied
    rules = ["--knock", "7001,7002,7003"]
    svc = Service(network.server, [*WRAPPER, "--listen", "[::]:8080", *rules, "--", *ECHO_SERVER])
    services.append(svc)
    svc.wait_for(r"^ready ")
    config = parse_policy(rules)
    loaded = compiler.load_program(program.plan_program(config.rules_for("web")))
    for version, exts in (("4", ("ipopt",)), ("6", ("hbh", "dest"))):
        src = a.v4 if version == "4" else a.v6
        dst = a.server_v4 if version == "4" else a.server_v6
        got_run, batch = [], []
        for sport in (7001, 7002, 7003):
            pkt = packet(version, src, dst, "knock", 8080, "", exts, sport)
            got_run.append(prog_test_run(loaded.fd, frame(pkt)).retval != 0)
            batch.append((version, src, dst, "knock", "8080", "-", ",".join(exts), str(sport)))
        pkt = packet(version, src, dst, "syn", 8080, "", exts, 50000)
        got_run.append(prog_test_run(loaded.fd, frame(pkt)).retval != 0)
        batch.append((version, src, dst, "syn", "8080", "-", ",".join(exts), "50000"))
        answers = send(a, batch)
        assert answers[:3] == ["sent"] * 3, answers
        got_socket = [False, False, False]  # knocks are dropped: never answered
        got_socket.append(answers[3] == "synack")
        assert got_run == got_socket == [False, False, False, True], (version, got_run, got_socket)
    # Never knocked: nothing, in both.
    src, dst = b.v4, b.server_v4
    pkt = packet("4", src, dst, "syn", 8080, "", (), 50001)
    assert prog_test_run(loaded.fd, frame(pkt)).retval == 0
    assert send(b, [("4", src, dst, "syn", "8080", "-", "-", "50001")]) == ["none"]


@pytest.mark.parametrize("part", ["subnets", "filter"])
def test_fragmented_datagrams_are_judged_whole(
    network: Network, services: list[Service], part: str
) -> None:
    """Real fragments (IPv4, and IPv6 with its fragment header): the socket sees the
    reassembled datagram, and the filter judges it by its source like any other."""
    a, b = network.allowed, network.denied
    rules = [r.format(allowed_if=a.server_if) for r in RULES[part]]
    svc = Service(
        network.server, [*WRAPPER, "--listen-datagram", "[::]:8081", *rules, "--", *ECHO_SERVER]
    )
    services.append(svc)
    svc.wait_for(r"^ready ")
    sent = {}
    for host in (b, a):
        batch = []
        for version in ("4", "6"):
            src, dst = (host.v4, host.server_v4) if version == "4" else (host.v6, host.server_v6)
            token = f"frag{version}-{uuid.uuid4().hex[:8]}"
            batch.append((version, src, dst, "udpfrag", "8081", token, "-", "42000"))
            sent[token] = host is a
        for answer in send(host, batch):
            assert answer in ("sent 3", "sent 4"), answer  # it did go out in fragments
    for token in (t for t, ok in sent.items() if ok):
        svc.wait_for(token)
    time.sleep(1)  # the denied ones were sent first: had they passed, they would be in by now
    for token, allowed in sent.items():
        assert (token in svc.output()) == allowed, (token, svc.output())
