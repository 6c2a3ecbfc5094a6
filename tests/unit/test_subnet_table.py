"""The subnet table gives every address the verdict the rules mean."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from helpers.oracle import passes, probe_addresses, random_rules
from helpers.support import ROOT
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from alfwrapper.bpf import subnet_table
from alfwrapper.bpf.subnet_table import (
    MAX_NODES,
    NODE_DESCEND,
    NODE_PASS,
    ROOT_SLOTS,
    build_subnet_table,
    lookup,
    lookup_buckets,
)
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import SubnetRules
from alfwrapper.record import replace

pytestmark = pytest.mark.unit


def rules_of(allow: list[str] = (), deny: list[str] = ()) -> SubnetRules:  # type: ignore[assignment]
    return SubnetRules(allow=tuple(map(parse_prefix, allow)), deny=tuple(map(parse_prefix, deny)))


def check(rules: SubnetRules, addresses: list[tuple[int, int]]) -> None:
    table = build_subnet_table(rules)
    for family, value in addresses:
        assert lookup(table, family, value) == passes(rules, family, value), (family, hex(value))


def test_no_rules_pass_everything() -> None:
    table = build_subnet_table(SubnetRules())
    assert set(table.roots) == {NODE_PASS} and len(table.roots) == ROOT_SLOTS
    assert set(table.v4.lines[:, 1].tolist()) == {2**64 - 1}  # every block's PASS bit
    assert not table.v4.lines[:, 0].any() and len(table.v4.leaves) == 0  # no DESCEND
    assert table.nodes == ()


def test_allow_in_one_family_drops_the_other() -> None:
    table = build_subnet_table(rules_of(allow=["192.0.2.0/24"]))
    assert lookup(table, 4, parse_prefix("192.0.2.9").value)
    assert not lookup(table, 4, parse_prefix("192.0.3.9").value)
    assert not lookup(table, 6, parse_prefix("2001:db8::1").value)


def test_deny_wins_inside_allow() -> None:
    rules = rules_of(allow=["192.0.2.0/24"], deny=["192.0.2.128/25"])
    table = build_subnet_table(rules)
    assert lookup(table, 4, parse_prefix("192.0.2.127").value)
    assert not lookup(table, 4, parse_prefix("192.0.2.128").value)
    # allow inside deny does not punch a hole
    table = build_subnet_table(rules_of(allow=["192.0.2.7"], deny=["192.0.0.0/16"]))
    assert not lookup(table, 4, parse_prefix("192.0.2.7").value)


def test_ipv6_levels_are_the_byte_lengths_in_use() -> None:
    table = build_subnet_table(
        rules_of(
            allow=[
                "192.0.2.0/24",
                "198.51.100.7",
                "10.0.0.0/8",
                "2001:db8::/48",
                "2001:db8:8000::/33",
            ]
        )
    )
    assert [b.nbytes for b in table.bucket_levels] == [5, 6] and table.levels == ()


def test_covered_prefixes_add_no_entries() -> None:
    table = build_subnet_table(
        rules_of(
            allow=["192.0.0.0/16", "192.0.2.0/24", "192.0.2.1", "2001:db8::/32", "2001:db8:1::/48"]
        )
    )
    # The /32's own entry, in the 4-byte bucket level; the /48 adds none.
    assert [b.nbytes for b in table.bucket_levels] == [4] and table.nodes == ()
    assert lookup_buckets(table, 0x20010DB8 << 96, -1) == NODE_PASS
    assert [len(keys) for keys in bucket_entries(table)] == [1]  # one key
    assert len(table.v4.leaves) == 0


def test_expansion_to_the_next_byte() -> None:
    table = build_subnet_table(rules_of(deny=["2001:db8::/41"]))
    assert [b.nbytes for b in table.bucket_levels] == [6]
    assert all(lookup_buckets(table, (0x20010DB8 << 96) | (i << 80), -1) == 0 for i in range(128))
    assert lookup_buckets(table, (0x20010DB8 << 96) | (128 << 80), -1) == -1  # 128 entries
    assert table.roots[0x2001] == NODE_DESCEND | NODE_PASS


def test_ipv4_table_takes_the_least_memory() -> None:
    """One /32 splits one block: 16 first-level bits (32 KiB of lines) and one 8 KiB leaf.
    Many /32s spread over the space: a wider first level with small leaves."""
    table = build_subnet_table(rules_of(deny=["192.0.2.7"]))
    assert (table.v4.root_bits, len(table.v4.leaves), table.v4.leaf_bytes) == (16, 1, 8192)
    line = table.v4.lines[0xC000 >> 6].tolist()  # 192.0/16 is bit 0 of its line
    assert line[0] == 1 and line[1] == 2**64 - 2 and line[2] == 0  # descends, to leaf 0
    bit = 2 * 256 + 7  # 192.0.2.7 in 192.0.0.0/16
    leaf = table.v4.leaves[0].tolist()
    assert leaf[bit >> 3] == 0xFF ^ (1 << (bit & 7)) and leaf.count(0xFF) == 8191
    assert table.v4.size == (1 << 15) + 8192
    rng = random.Random(7)
    spread = [
        f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.1" for _ in range(3000)
    ]
    table = build_subnet_table(rules_of(deny=spread))
    assert table.v4.root_bits > 16
    assert table.v4.size < (1 << 15) + len(table.v4.leaves) * 8192


def test_too_many_entries_is_a_clear_error() -> None:
    many = [f"2001:db8:{b:x}:{c:x}000::/49" for b in range(1 << 16) for c in (0, 8)]
    assert len(many) * 128 > MAX_NODES
    from alfwrapper.errors import AlfError  # noqa: PLC0415

    with pytest.raises(AlfError, match="expand to more than"):
        build_subnet_table(rules_of(deny=many[: MAX_NODES // 128 + 1]))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_table_agrees_with_the_rules(seed: int, count: int) -> None:
    rng = random.Random(seed)
    rules = random_rules(rng, count)
    check(rules, probe_addresses(rng, rules, 60))


@pytest.mark.parametrize("root_bits", [16, 22])
def test_windows_give_the_table_whole(root_bits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The IPv4 table is written a window of blocks at a time; small windows (cut by
    blocks, and by leaf bits where leaves crowd) give the same arrays as one window,
    and every probe its meaning."""
    monkeypatch.setattr(subnet_table, "V4_ROOT_BITS", range(root_bits, root_bits + 1))
    rng = random.Random(root_bits)
    lists: tuple[list[Prefix], list[Prefix]] = ([], [])
    for _ in range(400):  # dense in 192.0.0.0/10: most blocks split, some wholly covered
        length = rng.randint(root_bits + 1, 32) if rng.random() < 0.95 else root_bits - 2
        value = (0xC0000000 | rng.getrandbits(22)) >> (32 - length) << (32 - length)
        lists[rng.random() < 0.4].append(Prefix(4, value, length))
    rules = SubnetRules(allow=tuple(lists[0]), deny=tuple(lists[1]))
    whole = build_subnet_table(rules).v4
    # Read now: the arrays are written when first read, and must be in the usual windows.
    lines, leaves = whole.lines.copy(), whole.leaves.copy()
    monkeypatch.setattr(subnet_table, "_BLOCK_WINDOW", 128)
    monkeypatch.setattr(subnet_table, "_LEAF_WINDOW", 3 << (32 - root_bits))
    cut = build_subnet_table(rules).v4
    assert whole.capacity > 10 and (cut.lines == lines).all()
    assert (cut.leaves == leaves).all()
    monkeypatch.undo()  # the arrays are the same, so one check of their meaning serves
    check(rules, probe_addresses(rng, rules, 3000))


def nested_ipv6(rng: random.Random, count: int) -> list[Prefix]:
    """IPv6 prefixes of up to 64 bits, many inside others and many on the same blocks:
    what a blocklist of /48s, /56s and /64s with a few wider ranges looks like."""
    out: list[Prefix] = []
    for _ in range(count):
        if out and rng.random() < 0.5:  # inside (or equal to) one already drawn
            outer = rng.choice(out)
            length = rng.randint(outer.length, 64)
            value = outer.value | (rng.getrandbits(length - outer.length) << (128 - length))
        else:
            length = rng.choice((0, 7, 16, 17, 23, 32, 33, 40, 48, 56, 60, 63, 64))
            value = (0x20010DB8 << 96 | rng.getrandbits(96)) >> (128 - length) << (128 - length)
        out.append(Prefix(6, value & ~((1 << (128 - length)) - 1), length))
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 60), st.booleans(), st.booleans())
def test_ipv6_in_bulk_is_the_same_table(seed: int, count: int, denied: bool, v4: bool) -> None:
    """One IPv6 list of prefixes of at most 64 bits (the other list empty, or of IPv4
    only) is laid out by numpy: the same roots and the same entries as the general
    path, entry for entry."""
    rng = random.Random(seed)
    six = tuple(nested_ipv6(rng, count))
    four = (parse_prefix("192.0.2.0/24"),) if v4 else ()
    rules = SubnetRules(allow=four if denied else six, deny=six if denied else four)
    for allow_root in (subnet_table._NONE, subnet_table._FULL):
        bulk = subnet_table._table64(rules, allow_root)
        assert bulk is not None
        roots, nodes, levels = subnet_table._family_table(6, rules, allow_root)
        assert bulk[0] == roots and bulk[2] == levels
        got = {
            (nbytes, int(k), int(v))
            for nbytes, (keys, values) in bulk[1].items()
            for k, v in zip(keys, values, strict=True)
        }
        assert got == {(n[1], n[2], n[3]) for n in nodes}
        assert sum(len(k) for k, _ in bulk[1].values()) == len(nodes)  # no entry twice
    check(rules, probe_addresses(rng, rules, 40))


def test_ipv6_in_bulk_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both lists with IPv6 rules, or a prefix longer than 64 bits: the general path;
    otherwise the general path is not taken at all."""
    both = rules_of(allow=["2001:db8::/32"], deny=["2001:db8::/48"])
    long = rules_of(allow=["2001:db8::/32", "2001:db8::1/128"])
    for rules in (both, long):
        assert subnet_table._table64(rules, subnet_table._NONE) is None

    def one_at_a_time(*args: object) -> None:
        raise AssertionError("laid out one prefix at a time")

    monkeypatch.setattr(subnet_table, "_family_table", one_at_a_time)
    monkeypatch.setattr(subnet_table, "SMALL_RULES", 0)  # as if they were many
    rules = rules_of(allow=["192.0.2.0/24", "2001:db8::/48", "2001:db8:1::/64"])
    check(rules, [(6, 0x20010DB8 << 96), (6, 0x20010DB8_0002 << 80), (4, 0xC0000201)])


@pytest.mark.parametrize("seed", range(8))
def test_buckets_fit_at_two_keys_a_bucket(seed: int) -> None:
    """250,000 random /64s fit in the first pair of multipliers at two keys a bucket,
    every time: a crowded bucket moves the keys whose second bucket has room (moving
    the last ones instead fails for 2 of these 8 key sets, and a table whose three
    pairs all fail doubles).  Each bucket holds at most BUCKET_SLOTS keys, and a key
    is in its second bucket only behind a full first one, where a lookup looks."""
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    keys = np.unique(np.uint64(0x20010DB8 << 32) | rng.integers(0, 1 << 32, 250_000, np.uint64))
    bits = (len(keys) // subnet_table.KEYS_PER_BUCKET).bit_length()
    pair = subnet_table.MULTIPLIERS[0]
    placed = subnet_table._place(keys, bits, pair)
    assert placed is not None
    bucket, slot = placed
    first = subnet_table._bucket_of(keys, pair[0], bits).astype(np.int64)
    second = subnet_table._bucket_of(keys, pair[1], bits).astype(np.int64)
    held = np.bincount(bucket, minlength=1 << bits)
    assert held.max() <= subnet_table.BUCKET_SLOTS and slot.max() < subnet_table.BUCKET_SLOTS
    assert len(np.unique(bucket << 3 | slot)) == len(keys)  # no slot taken twice
    moved = bucket != first
    assert (bucket[moved] == second[moved]).all()
    assert (held[first[moved]] == subnet_table.BUCKET_SLOTS).all()


def mixed_rules(rng: random.Random, count: int) -> SubnetRules:
    """Up to SMALL_RULES rules of both families: random ones in documentation ranges,
    nested IPv6 ones, and now and then a wide IPv4 range (a /0 to a /12)."""
    rules = random_rules(rng, count // 2)
    six = nested_ipv6(rng, count // 4)
    wide = [
        Prefix(4, rng.getrandbits(32) >> (32 - n) << (32 - n) if n else 0, n)
        for n in rng.sample((0, 1, 8, 12), rng.randint(0, 2))
    ]
    lists = (list(rules.allow), list(rules.deny))
    for p in six + wide:
        lists[rng.random() < 0.5].append(p)
    return SubnetRules(allow=tuple(lists[0]), deny=tuple(lists[1]))


def bucket_entries(table: subnet_table.SubnetTable) -> list[dict[int, int]]:
    """Per bucket level, each key and its value, found as the filter finds them."""
    out = []
    for level in table.bucket_levels:
        found = {}
        for index in range(level.offset, level.offset + (1 << level.bits)):
            words = subnet_table.bucket_words(table.buckets, index)
            tail = words[-1].to_bytes(8, "little")
            for slot in range(tail[-1]):
                found[words[slot]] = tail[slot]
        for key, value in found.items():
            probe = key << (128 - 8 * level.nbytes)
            alone = replace(table, bucket_levels=(level,))
            assert subnet_table.lookup_buckets(alone, probe, -1) == value, hex(key)
        out.append(found)
    return out


def first_difference(a: bytes, b: bytes) -> int | None:
    """The first offset where a and b differ (or where the shorter ends), or None: what
    an assertion on megabytes should say (pytest's diff of them, unabridged under CI=true,
    runs for minutes)."""
    if a == b:
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


# No shrinking: a smaller seed is not a smaller rule set, and a failing seed (printed)
# is enough to see the rules again.
@settings(max_examples=300, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    st.integers(0, 2**32), st.integers(0, subnet_table.SMALL_RULES), st.sampled_from((16, 18, 20))
)
def test_a_few_rules_give_the_same_tables_without_numpy(
    seed: int, count: int, least_bits: int
) -> None:
    """A few rules are laid out in plain Python (_small_table): the same IPv4 lines and
    leaves, byte for byte, the same IPv6 roots and deeper entries, and bucket levels
    of the same sizes holding the same keys and values, each where a lookup finds it;
    so a program compiled for one fits the other.  (From a first level of
    ``least_bits``, so that wider ones are laid out too.)"""
    rng = random.Random(seed)
    rules = mixed_rules(rng, count)
    before = subnet_table.V4_ROOT_BITS
    subnet_table.V4_ROOT_BITS = range(least_bits, 27)
    try:
        small = subnet_table._small_table(rules)
        bulk = subnet_table._bulk_table(rules)
    finally:
        subnet_table.V4_ROOT_BITS = before
    assert small is not None and isinstance(small.v4, subnet_table.SmallV4)
    assert (small.v4.root_bits, small.v4.capacity) == (bulk.v4.root_bits, bulk.v4.capacity)
    assert first_difference(small.v4.lines.tobytes(), bulk.v4.lines.tobytes()) is None
    assert first_difference(small.v4.leaves.tobytes(), bulk.v4.leaves.tobytes()) is None
    assert (small.roots, small.nodes, small.levels) == (bulk.roots, bulk.nodes, bulk.levels)
    shape = [(b.nbytes, b.offset, b.bits) for b in small.bucket_levels]
    assert shape == [(b.nbytes, b.offset, b.bits) for b in bulk.bucket_levels]
    assert small.bucket_rows == len(bulk.buckets)
    assert bucket_entries(small) == bucket_entries(bulk)
    check(rules, probe_addresses(rng, rules, 60))


def test_a_few_rules_start_without_numpy() -> None:
    """What a start with a few rules runs to lay out and write its tables imports no
    numpy; more rules than SMALL_RULES take the numpy layout."""
    code = (
        "import sys\n"
        "from alfwrapper.bpf.subnet_table import build_subnet_table, SmallV4\n"
        "from alfwrapper.policy.prefixes import parse_prefix\n"
        "from alfwrapper.policy.rules import SubnetRules\n"
        "rules = SubnetRules(allow=tuple(map(parse_prefix, sys.argv[1:])))\n"
        "table = build_subnet_table(rules)\n"
        "table.v4.fill(lambda kind, first, rows: rows.tobytes())\n"
        "print(isinstance(table.v4, SmallV4), 'numpy' in sys.modules)\n"
    )
    few = ["192.0.2.0/24", "198.51.100.7", "2001:db8::/32", "2001:db8:1::/64"]
    many = [f"192.0.2.{i}" for i in range(subnet_table.SMALL_RULES + 1)]
    for rules, expected in ((few, "True False"), (many, "False True")):
        out = subprocess.run(
            [sys.executable, "-c", code, *rules],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert out.stdout.strip() == expected, (rules[:3], out.stdout, out.stderr)
