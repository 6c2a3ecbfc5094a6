"""A set's sieve (sets.c, alfwrapper/sets/bloom.py): the kernel finds every entry
through it, whatever was added, removed, resynced, flushed or rebuilt, and a kill
between an address's bits and its entry never leaves an entry the kernel does not see.
Run by the kernel (BPF_PROG_TEST_RUN) on the real program, with the set's real maps."""

from __future__ import annotations

import errno
import os
import random
import subprocess
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.support import WRAPPER

from alfwrapper import sets
from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import SIEVE_OLDER_FLAGS, FillEnv, sieve_header
from alfwrapper.errors import AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.host.bpf_calls import prog_test_run
from alfwrapper.host.frames import udp_frame
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import MOST_SETS, SocketRules
from alfwrapper.sets import bloom, content, creation, tree

pytestmark = pytest.mark.host

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
        program.plan_program(SocketRules(deny_sets=(name,))), FillEnv(open_set=creation.read_only)
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
    """Removals the sieve counts since its last rebuild (parts.sieve_header)."""
    fd = sets.open_role(name, "sieve")
    try:
        return sieve_header(fd)[1]
    finally:
        os.close(fd)


@pytest.mark.parametrize("how", [("add", "192.0.2.77", "2001:db8::77"), ("create",)])
def test_a_kill_between_the_bits_and_the_entry_leaves_no_entry_unseen(
    name: str, how: tuple[str, ...], tmp_path: object
) -> None:
    """Killed where an add or a make has set the addresses' bits: whatever the set
    then holds (`set list`) is what the kernel drops, and a second try finishes."""
    probes = [parse_prefix("192.0.2.77/32"), parse_prefix("2001:db8::77/128")]
    if how[0] == "create":
        listed = os.path.join(str(tmp_path), "list")
        with open(listed, "w", encoding="utf-8") as f:
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


def test_a_set_made_before_sieves_is_given_one_by_the_next_create(name: str) -> None:
    """A set an older alfwrapper made has no sieve, and no service can name it (its
    sieve does not exist: exit 78, fail closed); `set create` gives it one, made
    from what it holds, and keeps its entries."""
    held = [
        parse_prefix("198.51.100.7/32"),
        parse_prefix("2001:db8::7/128"),
        parse_prefix("203.0.113.0/24"),
    ]
    sets.create(name, held)
    os.unlink(tree.folder(name) / "sieve")
    out = subprocess.run(
        [*WRAPPER, "check", "--deny-set", name], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 78, out.stderr
    assert sets.create(name) is False
    assert sorted(p for p, _ in sets.entries(name)) == sorted(held)
    probes = [held[0], held[1], parse_prefix("203.0.113.5/32"), parse_prefix("192.0.2.1/32")]
    assert dropped(name, probes) == probes[:3]


def test_more_than_the_most_sets_are_refused_before_anything_is_made(
    name: str, tmp_path: Path
) -> None:
    """Each set a socket names is two maps of its program's own, of the kernel's 64: one
    more than MOST_SETS (allow and deny together) is a usage error, said before any set
    is opened or made."""
    many = [f"{name}-{i}" for i in range(MOST_SETS + 1)]
    argv = [arg for n in many for arg in ("--deny-set", n)]
    out = subprocess.run([*WRAPPER, "check", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 64 and f"more than {MOST_SETS}" in out.stderr, out.stderr
    half = len(many) // 2
    policy = tmp_path / "many.toml"
    policy.write_text(
        f"deny-set = {many[:half]!r}\nallow-set = {many[half:]!r}\n".replace("'", '"')
    )
    out = subprocess.run(
        [*WRAPPER, "check", "--policy", str(policy)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 78 and f"more than {MOST_SETS}" in out.stderr, out.stderr
    assert not any(tree.folder(n).exists() for n in many)


def _made_again_by_an_older_alfwrapper(name: str, entry: Prefix) -> None:
    """What an older `set destroy` then `set create` did: a new hosts map beside the
    sieve and hosts_at (which it knew nothing of, and left), holding an entry an older
    bouncer put there (no bits)."""
    where = tree.folder(name)
    os.unlink(where / "hosts")
    kind, key, value, flags = tree._SHAPES["hosts"]
    hosts = bpf_calls.map_create(kind, "old", key, value, 64, flags)
    try:
        bpf_calls.map_update(hosts, content._key(entry)[1], bytes(8))
        bpf_calls.obj_pin(hosts, str(where / "hosts"))
    finally:
        os.close(hosts)


def test_a_sieve_made_for_other_entries_is_refused_then_rebuilt(name: str) -> None:
    """An older alfwrapper that knew no sieves destroys a set (leaving its sieve and
    hosts_at pins) and makes it again: hosts_at holds the old hosts map, and the new
    one's entries have no bits in that sieve.  A start refuses it (78) rather than
    miss them; `set create`, or the next change, mends it from what the set holds.  A
    sieve of another size is no set's."""
    sets.create(name, [parse_prefix("192.0.2.1/32")])
    where = tree.folder(name)
    old = parse_prefix("198.51.100.9/32")
    _made_again_by_an_older_alfwrapper(name, old)
    check = [*WRAPPER, "check", "--deny-set", name]
    out = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert out.returncode == 78 and "the hosts map it holds is not the set's" in out.stderr, out
    out = subprocess.run(
        [*WRAPPER, "set", "create", name], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert subprocess.run(check, capture_output=True, timeout=120).returncode == 0
    assert dropped(name, [old, parse_prefix("192.0.2.1/32")]) == [old]
    older = parse_prefix("198.51.100.10/32")
    _made_again_by_an_older_alfwrapper(name, older)
    sets.add(name, [parse_prefix("192.0.2.2/32")])  # a change rebuilds it first
    probes = [older, parse_prefix("192.0.2.2/32"), old]
    assert dropped(name, probes) == probes[:2]  # `old` went with its hosts map
    # A sieve of a size no set has (not a header word and a power of two): refused.
    os.unlink(where / "sieve")
    kind, key, value, flags = tree._SHAPES["sieve"]
    odd = bpf_calls.map_create(kind, "odd", key, value, 100, flags)
    try:
        bpf_calls.obj_pin(odd, str(where / "sieve"))
    finally:
        os.close(odd)
    with pytest.raises(AlfError, match="is not a set's"):
        sets.open_role(name, "sieve")


def test_a_family_new_to_the_trie_is_marked_in_word_1_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bloom.sieve_add reads word 1's range bit as every word's: a kill between two
    batches that mark the others must leave word 1 unmarked, so it is written last."""
    written: list[list[int]] = []

    def batch(fd: int, keys: bytes, values: bytes, count: int) -> None:
        written.append(list(array("I", keys)))

    monkeypatch.setattr(bloom, "BATCH", 100)
    monkeypatch.setattr(bpf_calls, "map_update_batch", batch)
    bloom._write_words(-1, list(range(0, 300)), list(range(300)))
    assert [i for part in written for i in part][-2:] == [1, 0]  # then the header
    assert sorted(i for part in written for i in part) == list(range(300))


def test_a_kill_while_a_sieve_is_rebuilt_leaves_it_refused(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sieve made for other entries is rebuilt in batches; a kill after the first
    must leave its header naming the old hosts map, so a start still refuses it (78)
    rather than take a half-built sieve as the set's, and the next change finishes."""
    sets.create(name, [parse_prefix("192.0.2.1/32")], size=SIZE)
    old = parse_prefix("198.51.100.9/32")
    _made_again_by_an_older_alfwrapper(name, old)
    real, calls = bpf_calls.map_update_batch, []

    def killed_after_one(fd: int, keys: bytes, values: bytes, count: int) -> None:
        calls.append(count)
        if len(calls) > 1:
            raise OSError(errno.EINTR, "killed")
        real(fd, keys, values, count)

    monkeypatch.setattr(bloom, "BATCH", 100)
    monkeypatch.setattr(bpf_calls, "map_update_batch", killed_after_one)
    with pytest.raises((AlfError, OSError)):
        sets.add(name, [parse_prefix("192.0.2.2/32")])
    monkeypatch.undo()
    assert len(calls) == 2  # the rebuild's first batch went in, then the kill
    check = [*WRAPPER, "check", "--deny-set", name]
    out = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert out.returncode == 78 and "sieve was made for other entries" in out.stderr, out
    sets.add(name, [parse_prefix("192.0.2.2/32")])
    assert subprocess.run(check, capture_output=True, timeout=120).returncode == 0
    assert dropped(name, [old, parse_prefix("192.0.2.2/32")]) == [old, parse_prefix("192.0.2.2/32")]


def test_each_set_is_read_through_its_own_sieve(name: str) -> None:
    """A program reads each set it names through that set's own sieve, bound into
    its instructions as it loads (sets.c, Sets.bind): six deny sets, and four allow
    sets, each holding addresses of its own, all found; an address held by none
    passes the deny sets and fails the allow sets.  And a socket with both kinds:
    deny sets before allow sets, so a set read through another's sieve shows (sets of
    one kind alone give the same verdicts whichever of them holds an address)."""
    rng = random.Random(30)
    every = addresses(rng, 10 * 40 + 40)
    held = {f"{name}-{i}": every[40 * i : 40 * (i + 1)] for i in range(10)}
    nobodys = every[400:]
    try:
        for each, entries in held.items():
            sets.create(each, entries, SIZE)
        names = list(held)
        deny = SocketRules(deny_sets=tuple(names[:6]))
        allow = SocketRules(allow_sets=tuple(names[6:]))
        both = SocketRules(deny_sets=tuple(names[:3]), allow_sets=tuple(names[6:9]))
        env = FillEnv(open_set=creation.read_only)
        mixed = compiler.load_program(program.plan_program(both), env)
        for each, outcome in zip(names[:3] + names[6:9], [0] * 3 + [1] * 3, strict=True):
            got = [
                prog_test_run(mixed.fd, udp_frame(p.family, p.value)).retval > 0 for p in held[each]
            ]
            assert got == [bool(outcome)] * 40, each
        for rules, members, outcome in ((deny, names[:6], 0), (allow, names[6:], 1)):
            loaded = compiler.load_program(program.plan_program(rules), env)

            def verdict(p: Prefix, fd: int = loaded.fd) -> int:
                return 1 if prog_test_run(fd, udp_frame(p.family, p.value)).retval else 0

            for each in members:
                assert [verdict(p) for p in held[each]] == [outcome] * 40, each
            assert [verdict(p) for p in nobodys] == [1 - outcome] * 40
            # The same instructions with the placeholders still in them (no set bound):
            # a deny set that cannot be read drops all, an allow set allows nothing.
            fd, log = bpf_calls.prog_load_logged(loaded.programs["filter"], "unbound")
            assert fd >= 0, log
            try:
                assert [verdict(p, fd) for p in held[members[0]] + nobodys] == [0] * 80
            finally:
                os.close(fd)
    finally:
        for each in held:
            sets.destroy(each)


# A developer's filter that uses many maps of its own (each looked up, so that the
# program names it): with a socket's most sets, more than the kernel's 64.
def _many_maps_filter(count: int) -> str:
    maps = "".join(f"BPF_ARRAY(own{i}, u32, 1);\n" for i in range(count))
    reads = "".join(f"    p = own{i}.lookup(&zero);\n    if (p) n += *p;\n" for i in range(count))
    return (
        '#include "common.h"\n' + maps + "int filter(struct __sk_buff *skb) {\n"
        "    u32 zero = 0, n = 0;\n    u32 *p;\n" + reads + "    return n + 1;\n}\n"
    )


def test_the_most_sets_load_with_every_part_and_more_maps_are_refused(
    name: str, tmp_path: Path
) -> None:
    """16 sets (the most a socket names) beside interfaces, knocking, the drop log and
    a developer's filter with maps of its own load; a filter whose maps, with the
    sets', pass the 64 the kernel lets one program use is refused with that said
    (exit 64), not with the kernel's errno alone."""
    many = [f"{name}-{i}" for i in range(MOST_SETS)]
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    argv = [arg for n in many for arg in ("--deny-set", n)]
    try:
        for each in many:
            sets.create(each, [parse_prefix("192.0.2.1/32")], 64)
        for maps, code in ((8, 0), (30, 64)):
            source = tmp_path / f"maps{maps}.c"
            source.write_text(_many_maps_filter(maps))
            out = subprocess.run(
                [*WRAPPER, "check", *argv, "--interface", "lo", "--knock-secret", str(secret),
                 "--log-drops", "10", "--filter", str(source)],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert out.returncode == code, out.stderr
            if code:
                assert "more maps than the kernel lets one program use (64)" in out.stderr
                assert out.stderr.count("\n") == 1, out.stderr
    finally:
        for each in many:
            sets.destroy(each)


def test_a_sieve_an_older_alfwrapper_made_still_serves(name: str) -> None:
    """An older alfwrapper made sieves as inner maps (BPF_F_INNER_MAP, parts.
    SIEVE_OLDER_FLAGS): such a set is still named and read, its entries found."""
    members = addresses(random.Random(31), 40)
    sets.create(name, members, SIZE)
    path = tree.folder(name) / "sieve"
    new = sets.open_role(name, "sieve")
    try:
        kind, key, value, entries, _ = bpf_calls.map_shape(new)
        older = bpf_calls.map_create(kind, "older", key, value, entries, SIEVE_OLDER_FLAGS)
        try:
            for index in range(entries):
                at = index.to_bytes(4, "little")
                bpf_calls.map_update(older, at, bpf_calls.map_lookup(new, at, 8) or bytes(8))
            os.unlink(path)
            bpf_calls.obj_pin(older, str(path))
        finally:
            os.close(older)
    finally:
        os.close(new)
    fd = sets.open_role(name, "sieve")
    assert bpf_calls.map_shape(fd)[4] == SIEVE_OLDER_FLAGS
    os.close(fd)
    others = [p for p in addresses(random.Random(32), 40) if p not in set(members)]
    assert dropped(name, members + others) == members
