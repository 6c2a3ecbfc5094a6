"""The loaded program, run by the kernel (BPF_PROG_TEST_RUN), agrees with the rules."""

from __future__ import annotations

import random

import pytest
from oracle import passes, probe_addresses, random_rules

from alfwrapper import compiler
from alfwrapper.rules import SocketRules, SubnetRules, parse_prefix
from alfwrapper.syscalls import prog_test_run, udp_frame


def verdicts(rules: SubnetRules, addresses: list[tuple[int, int]]) -> list[bool]:
    loaded = compiler.load_rules(SocketRules(rules))
    return [
        prog_test_run(loaded.fd, udp_frame(family, value)).retval != 0
        for family, value in addresses
    ]


@pytest.mark.parametrize("seed", range(6))
def test_kernel_agrees_with_rules(bpf_root: None, seed: int) -> None:
    rng = random.Random(seed)
    rules = random_rules(rng, rng.choice((3, 30, 300)))
    addresses = probe_addresses(rng, rules, 500)
    got = verdicts(rules, addresses)
    wrong = [
        (f, hex(v)) for (f, v), g in zip(addresses, got, strict=True) if g != passes(rules, f, v)
    ]
    assert not wrong, f"{len(wrong)} wrong verdicts, e.g. {wrong[:5]}"


def test_pass_keeps_the_whole_packet(bpf_root: None) -> None:
    # A socket filter's return value is a length; anything short of "all" would trim TCP.
    loaded = compiler.load_rules(SocketRules(SubnetRules(deny=(parse_prefix("198.51.100.0/24"),))))
    assert prog_test_run(loaded.fd, udp_frame(4, 0xC0000201)).retval == 0xFFFFFFFF


def test_non_ip_is_dropped(bpf_root: None) -> None:
    loaded = compiler.load_rules(SocketRules(SubnetRules(deny=(parse_prefix("198.51.100.0/24"),))))
    arp = bytes(6) + bytes(6) + b"\x08\x06" + bytes(28)
    assert prog_test_run(loaded.fd, arp).retval == 0
    assert prog_test_run(loaded.fd, udp_frame(6, parse_prefix("2001:db8::1").value)).retval != 0
