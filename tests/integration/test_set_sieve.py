"""A set's sieve (sets.c, sets.py): the kernel finds every entry through it, whatever
was added, removed, resynced, flushed or rebuilt, and a kill between an address's
bits and its entry never leaves an entry the kernel does not see.  Run by the kernel
(BPF_PROG_TEST_RUN) on the real program, with the set's real maps."""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Iterator

import pytest
from support import WRAPPER

from alfwrapper import sets
from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.host import bpf_calls
from alfwrapper.host.bpf_calls import prog_test_run
from alfwrapper.host.frames import udp_frame
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import SocketRules

SIZE = 2048  # a sieve of 1024 words: rebuilt past 1024 removals


@pytest.fixture
def name(bpf_root: None) -> Iterator[str]:
    made = f"v{os.getpid()}-{time.monotonic_ns() % 10**9}"
    yield made
    sets.destroy(made)


def addresses(rng: random.Random, count: int) -> list[Prefix]:
    out: set[Prefix] = set()
    while len(out) < count:
        if rng.random() < 0.5:
            out.add(Prefix(4, 0xC6330000 | rng.getrandbits(16), 32))  # 198.51.0.0/16
        else:
            out.add(Prefix(6, (0x20010DB8 << 96) | rng.getrandbits(96), 128))
    return sorted(out, key=lambda p: (p.family, p.value))


def dropped(name: str, probes: list[Prefix]) -> list[Prefix]:
    """Which of ``probes`` a program denying the set drops (a program loaded now)."""
    loaded = compiler.load_program(
        program.plan_program(SocketRules(deny_sets=(name,))), FillEnv(open_set=sets.read_only)
    )
    return [p for p in probes if prog_test_run(loaded.fd, udp_frame(p.family, p.value)).retval == 0]


def test_the_kernel_finds_every_entry_through_the_sieve(name: str) -> None:
    rng = random.Random(28)
    members, others = addresses(rng, 1800), addresses(random.Random(29), 600)
    others = [p for p in others if p not in set(members)]
    sets.create(name, members[:100], SIZE)  # made holding some
    sets.hold(name, dict.fromkeys(members[100:], 0))  # many at once, as the bouncer
    assert dropped(name, members + others) == members
    # A range of each family: the trie is asked for sources in neither's hosts.
    ranges = [parse_prefix("203.0.113.0/24"), parse_prefix("2001:db8:ffff::/48")]
    inside = [parse_prefix("203.0.113.9/32"), parse_prefix("2001:db8:ffff::9/128")]
    sets.add(name, ranges)
    assert dropped(name, inside + others) == inside
    # Removals leave bits behind until the sieve is rebuilt, after as many as it has
    # words (1024): what stays is found before and after.
    gone, kept = members[:1000], members[1000:]
    assert sets.delete(name, gone) == 1000
    assert dropped(name, kept + gone + others) == kept
    assert sets.delete(name, ranges[:1]) == 1
    assert sets.delete(name, kept[:100]) == 100  # past 1024: rebuilt from the hash
    kept = kept[100:]
    assert dropped(name, kept + gone + inside + others) == [*kept, inside[1]]
    assert _stale(name) == 0
    # A resync makes it hold these alone; a flush, nothing.
    sets.assign(name, dict.fromkeys(gone[:500] + ranges[:1], 0))
    assert dropped(name, gone + kept + inside + others) == [*gone[:500], inside[0]]
    sets.flush(name)
    assert dropped(name, gone + kept + inside + others) == []
    # Bits for a whole address alone: the sieve's other entries stay unset.
    sets.add(name, kept[:1])
    assert dropped(name, kept + others) == kept[:1]


def _stale(name: str) -> int:
    fd = sets.open_role(name, "sieve")
    try:
        raw = bpf_calls.map_lookup(fd, b"\0\0\0\0", 8)
    finally:
        os.close(fd)
    assert raw is not None
    return int.from_bytes(raw[:8], "little")


@pytest.mark.parametrize("how", [("add", "192.0.2.77", "2001:db8::77"), ("create",)])
def test_a_kill_between_the_bits_and_the_entry_leaves_no_entry_unseen(
    name: str, how: tuple[str, ...], tmp_path: object
) -> None:
    """Killed where an add or a make has set the addresses' bits: whatever the set
    then holds (`set list`) is what the kernel drops, and a second try finishes."""
    probes = [parse_prefix("192.0.2.77/32"), parse_prefix("2001:db8::77/128")]
    if how[0] == "create":
        listed = os.path.join(str(tmp_path), "list")
        with open(listed, "w", encoding="utf-8") as f:  # noqa: PTH123
            f.write("192.0.2.77\n2001:db8::77\n")
        argv = ["set", "create", name, listed]
    else:
        sets.create(name)
        argv = ["set", *how[:1], name, *how[1:]]
    env = {**os.environ, "ALFWRAPPER_CRASH_AT": "set-bits-set"}
    out = subprocess.run([*WRAPPER, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out
    if sets.exists(name):
        held = [p for p, _ in sets.entries(name)]
        assert dropped(name, probes) == held
    out = subprocess.run([*WRAPPER, *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert dropped(name, probes) == probes
