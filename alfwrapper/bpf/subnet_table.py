"""Compile subnet rules into the lookup tables the subnet filter reads.

Why not a BPF LPM trie: its lookup walks one node per prefix bit in the worst
case and gets slower as the rule set grows (about 1,500 ns a packet at a
million rules and varied sources here), and it needs CAP_BPF.  Instead the
wrapper resolves allow/deny into one verdict per address and lays it out so
that a packet costs a fixed, small number of dependent memory reads:

* IPv4 (V4Table, built with numpy; SmallV4 for a few rules): DIR-24-8-style, two levels.  The first
  R address bits (R from 16 to 26, chosen per rule set for the least memory)
  pick a block's entry: two bits, PASS and DESCEND, in 32-byte lines of 64
  entries that also hold the index of the line's first leaf.  A block that
  rules split has a leaf, one bit per address; its index is the line's first
  plus the DESCEND bits before it (a popcount in the same line: a rank
  directory, so no entry needs room for an index).  At most two dependent
  reads a packet (line, then leaf), whatever the rules, and 0.5 bytes per
  block: 8 MiB at R=24.  Both arrays are mmapable and filled with one copy
  each, not a syscall per entry.
* IPv6: a multibit trie with leaf pushing, whose levels sit at byte
  boundaries: an ARRAY indexed by the first 16 bits, then entries of one
  HASH map keyed by (family, byte count, leading bytes), only at the byte
  lengths the rule set uses (at most 14).  Each entry says "pass" or "drop"
  for its whole block, or "descend", in which case the PASS bit is the
  verdict for the parts of the block that have no entry of their own.
  Prefixes expand to the next level boundary, at most 2**7 entries per rule.
  Built with numpy where only one list has IPv6 rules and none is longer than
  64 bits (_table64: a blocklist, or an allow list of /48s to /64s); otherwise
  one prefix at a time (_family_table), to the same table.

Up to SMALL_RULES rules, both are laid out in plain Python instead (_small_table),
so that a start with a few rules never imports numpy.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence, Sized
from functools import cached_property
from typing import Any, TypeVar

from alfwrapper.errors import EX_DATAERR, AlfError
from alfwrapper.policy.prefix_list import SMALL_RULES, PrefixList
from alfwrapper.policy.prefixes import FAMILY_BITS, Prefix
from alfwrapper.policy.rules import SubnetRules
from alfwrapper.record import Record

# numpy arrays.  numpy is imported where used, so that a missing numpy is one clear
# line (cli); and typed loosely, so that Debian's numpy 1.24 and pip's 2.x check alike.
Array = Any
Placed = TypeVar("Placed")
Keys = TypeVar("Keys", bound=Sized)

ROOT_BITS = 16
ROOT_SLOTS = 1 << ROOT_BITS  # IPv6 roots
NODE_PASS = 1
NODE_DESCEND = 2
LINE_WORDS = 4  # an IPv4 line: DESCEND bits, PASS bits, first leaf, padding (32 bytes)
MAX_NODES = 8 << 20  # about 80 bytes of kernel memory each
BUCKET_SLOTS = 7  # an IPv6 bucket, one cache line: 7 u64 keys, 7 value bytes, a count
BUCKET_WORDS = 8
BUCKET_MAX_BYTES = 8  # levels up to /64 go in buckets; deeper ones in the HASH
KEYS_PER_BUCKET = 2  # at most, on average: few full buckets, so one line a lookup
# Odd 64-bit multipliers (from splitmix64 and murmur3's finalisers), tried in pairs
# until every key fits.
MULTIPLIERS = (
    (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9),
    (0x94D049BB133111EB, 0xFF51AFD7ED558CCD),
    (0xC4CEB9FE1A85EC53, 0xD6E8FEB86659FD93),
)
V4_ROOT_BITS = range(16, 27)  # the IPv4 first-level sizes to choose from (leaves >= 8 B)

# Coverage of a block by one rule list.
_NONE, _FULL, _PARTIAL = 0, 1, 2

# struct subnet_key: defined here, handed to C by parts.c_struct (the one definition).
KEY_FIELDS = (("nbytes", "u8"), ("family", "u8"), ("pad", "u8[2]"), ("addr", "u8[16]"))
VALUE = struct.Struct("=I")
_BUCKET = struct.Struct(f"={BUCKET_WORDS}Q")  # a bucket as the map holds it


class V4Shape(Record, eq=False):
    """The size of an IPv4 table (V4Table, SmallV4): a first level of ``root_bits``,
    room for ``capacity`` leaves."""

    root_bits: int
    capacity: int

    @property
    def leaf_bytes(self) -> int:
        return 1 << (32 - self.root_bits - 3)

    @property
    def size(self) -> int:
        return (LINE_WORDS * 8 << (self.root_bits - 6)) + self.capacity * self.leaf_bytes


def cheapest_first_level(leaves: Callable[[int], int]) -> tuple[int, int]:
    """The first-level size (in V4_ROOT_BITS) whose table needs the least memory, and
    its leaf count, ``leaves(bits)``: (bits, capacity)."""
    best: tuple[int, int, int] | None = None
    for bits in V4_ROOT_BITS:
        lines = LINE_WORDS * 8 << (bits - 6)
        if best is not None and lines >= best[0]:
            break  # wider first levels only cost more
        capacity = leaves(bits)
        size = (lines + capacity * (1 << (32 - bits - 3)), bits, capacity)
        best = size if best is None else min(best, size)
    assert best is not None  # at most 32 MiB of lines and 2**26 leaves of 8 bytes
    return best[1], best[2]


class V4Table(V4Shape, eq=False):
    """IPv4: the first ``root_bits`` bits of an address pick an entry, 64 entries to a
    line of ``lines`` (LINE_WORDS u64: DESCEND bits, PASS bits, the line's first leaf,
    padding).  An entry's PASS bit is its block's verdict, unless its DESCEND bit is
    set: then its leaf, ``leaves[first leaf + DESCEND bits before it]``, has a bit per
    address of the block (bit i of byte i // 8, least significant first).

    It holds the rules as Ranges and writes the arrays on demand: ``fill`` into the
    maps' own memory at load, so that no copy of the table is held while BCC
    compiles; ``lines`` and ``leaves`` for tests and tools.  ``capacity`` leaves have
    room: one for each block that may need one (_split_blocks)."""

    allow: Ranges
    deny: Ranges
    allow_all: bool

    @cached_property
    def _arrays(self) -> tuple[Array, Array]:
        import numpy as np  # noqa: PLC0415

        arrays: dict[str, Array] = {
            "lines": np.zeros((1 << (self.root_bits - 6), LINE_WORDS), np.uint64),
            "leaves": np.zeros((self.capacity, self.leaf_bytes), np.uint8),
        }

        def write(kind: str, first: int, rows: Array) -> None:
            arrays[kind][first : first + len(rows)] = rows

        self.fill(write)
        return arrays["lines"], arrays["leaves"]

    @property
    def lines(self) -> Array:
        return self._arrays[0]

    @property
    def leaves(self) -> Array:
        return self._arrays[1]

    def fill(self, write: Callable[[str, int, Array], None]) -> None:
        """Write the table a window of blocks at a time, so that no more than a window
        is held: ``write(kind, first, rows)`` puts ``rows`` at row ``first`` of the
        "lines" (u64, LINE_WORDS a row) or of the "leaves" (leaf_bytes a row).  Rows
        not written are zero."""
        _fill_v4(self, write)


class BucketLevel(Record):
    """One IPv6 level of at most 8 bytes in the bucket array: its entries are keyed by
    the address's first ``nbytes`` bytes (a big-endian integer), in buckets
    ``offset`` to ``offset + 2**bits - 1``.  A key is in the bucket its first
    multiplier picks ((key * m) mod 2**64 >> (64 - bits)) or, only when that one is
    full, in the one its second picks."""

    nbytes: int
    offset: int
    bits: int
    multipliers: tuple[int, int]


class SubnetTable(Record):
    """The filled-in maps and the level layout the filter is compiled for.

    ``v4`` is the IPv4 table.  For IPv6, ``roots`` are the first level;
    ``buckets`` (uint64, BUCKET_WORDS a bucket) hold the levels of at most 8
    bytes (``bucket_levels``); ``levels`` are the byte lengths of the deeper
    hash levels, in order, and ``nodes`` (family, byte length, block, node
    value) their entries.
    """

    v4: V4Table | SmallV4
    roots: tuple[int, ...]
    nodes: tuple[tuple[int, int, int, int], ...]
    levels: tuple[int, ...]
    bucket_levels: tuple[BucketLevel, ...] = ()
    buckets: Any = None  # Array, or bytes (a few rules: _small_table)

    @property
    def bucket_rows(self) -> int:
        return sum(1 << level.bits for level in self.bucket_levels)


def _node(deny: int, allow: int) -> int:
    """Verdict for a block from its coverage by the deny and the allow lists."""
    if deny == _FULL:
        return 0
    if deny == _NONE:
        if allow == _FULL:
            return NODE_PASS
        if allow == _NONE:
            return 0
        return NODE_DESCEND  # blocks below with no entry: covered by neither
    if allow == _NONE:
        return 0
    if allow == _FULL:
        return NODE_DESCEND | NODE_PASS  # blocks below with no entry: allowed only
    return NODE_DESCEND


def _cover(prefixes: Iterable[Prefix], level_bits: list[int], width: int) -> list[dict[int, int]]:
    """Per level, the blocks a rule list covers fully or partly (partly = has a rule below)."""
    tables: list[dict[int, int]] = [{} for _ in level_bits]
    by_length: dict[int, list[int]] = {}
    for p in prefixes:
        by_length.setdefault(p.length, []).append(p.value)
    level_of = {}
    for length in by_length:
        level_of[length] = next(i for i, bits in enumerate(level_bits) if bits >= length)
    # Shorter prefixes first, so a prefix inside one already covered is skipped.
    for length in sorted(by_length):
        depth = level_of[length]
        shifts = [width - bits for bits in level_bits[: depth + 1]]
        above = list(zip(tables[:depth], shifts[:depth], strict=True))
        table = tables[depth]
        shift = shifts[depth]
        count = 1 << (level_bits[depth] - length)
        for value in by_length[length]:
            covered = False
            for t, s in above:
                state = t.get(value >> s)
                if state == _FULL:
                    covered = True
                    break
                if state is None:
                    break  # nothing below an absent block: no FULL deeper either
            if covered:
                continue
            first = value >> shift
            if count == 1:
                table[first] = _FULL
            else:
                for block in range(first, first + count):
                    table[block] = _FULL
            for t, s in above:
                t.setdefault(value >> s, _PARTIAL)
    return tables


def _family_table(  # noqa: C901
    family: int, rules: SubnetRules, allow_root: int
) -> tuple[list[int], list[tuple[int, int, int, int]], tuple[int, ...]]:
    width = FAMILY_BITS[family]
    deny = list(_of_family(rules.deny, family))
    allow = list(_of_family(rules.allow, family))
    lengths = {p.length for p in deny} | {p.length for p in allow}
    level_bytes = sorted({(length + 7) // 8 for length in lengths if length > ROOT_BITS})
    level_bits = [ROOT_BITS] + [8 * b for b in level_bytes]
    deny_cover = _cover(deny, level_bits, width)
    allow_cover = _cover(allow, level_bits, width)

    if not deny or not allow:
        # One list, the other uniform: every entry maps on its own, no merge needed.
        if deny:
            cover = deny_cover
            node_of = {st: _node(st, allow_root) for st in (_FULL, _PARTIAL)}
        else:
            cover = allow_cover
            node_of = {st: _node(_NONE, st) for st in (_FULL, _PARTIAL)}
        node_of[_NONE] = _node(_NONE, allow_root)
        roots = [node_of[_NONE]] * ROOT_SLOTS
        for block, state in cover[0].items():
            roots[block] = node_of[state]
        nodes: list[tuple[int, int, int, int]] = []
        if node_of[_PARTIAL] & NODE_DESCEND:
            for nbytes, table in zip(level_bytes, cover[1:], strict=True):
                nodes += [(family, nbytes, block, node_of[state]) for block, state in table.items()]
        return roots, nodes, tuple(level_bytes)

    roots = []
    states: dict[int, tuple[int, int]] = {}
    d0, a0 = deny_cover[0], allow_cover[0]
    for block in range(ROOT_SLOTS):
        d, a = d0.get(block, _NONE), a0.get(block, allow_root)
        node = _node(d, a)
        roots.append(node)
        if node & NODE_DESCEND:
            states[block] = (d, a)

    nodes = []
    for depth in range(1, len(level_bits)):
        step = level_bits[depth] - level_bits[depth - 1]
        nbytes = level_bytes[depth - 1]
        dt, at = deny_cover[depth], allow_cover[depth]
        below: dict[int, tuple[int, int]] = {}
        for block in dt.keys() | at.keys():
            parent = states.get(block >> step)
            if parent is None:
                continue  # under a leaf: never looked up
            d = dt.get(block, _FULL if parent[0] == _FULL else _NONE)
            a = at.get(block, _FULL if parent[1] == _FULL else _NONE)
            node = _node(d, a)
            nodes.append((family, nbytes, block, node))
            if node & NODE_DESCEND:
                below[block] = (d, a)
        states = below
        if len(nodes) > MAX_NODES:
            break
    return roots, nodes, tuple(level_bytes)


def _table64(
    rules: SubnetRules, allow_root: int
) -> tuple[list[int], dict[int, tuple[Array, Array]], tuple[int, ...]] | None:
    """_family_table for IPv6 by numpy, where it is simple: one list (allow or deny,
    the other uniform), no prefix longer than 64 bits (so a block is a uint64).  The
    same table; None where it does not apply."""
    deny, allow = _of_family(rules.deny, 6), _of_family(rules.allow, 6)
    if len(deny) and len(allow):
        return None
    one = deny if len(deny) else allow
    if len(one) and int(one.length.max()) > 64:
        return None
    import numpy as np  # noqa: PLC0415

    lengths = {int(n) for n in np.unique(one.length)}
    level_bytes = sorted({(n + 7) // 8 for n in lengths if n > ROOT_BITS})
    level_bits = [ROOT_BITS] + [8 * b for b in level_bytes]
    full, partial = _cover64(one.high, one.length, level_bits)
    if len(deny):
        node_of = {st: _node(st, allow_root) for st in (_FULL, _PARTIAL)}
    else:
        node_of = {st: _node(_NONE, st) for st in (_FULL, _PARTIAL)}
    roots = np.full(ROOT_SLOTS, _node(_NONE, allow_root), np.int64)
    roots[full[0].astype(np.int64)] = node_of[_FULL]
    roots[partial[0].astype(np.int64)] = node_of[_PARTIAL]
    columns = {}
    if node_of[_PARTIAL] & NODE_DESCEND:
        for depth, nbytes in enumerate(level_bytes, 1):
            columns[nbytes] = (
                np.concatenate([full[depth], partial[depth]]),
                np.concatenate(
                    [
                        np.full(len(full[depth]), node_of[_FULL], np.uint8),
                        np.full(len(partial[depth]), node_of[_PARTIAL], np.uint8),
                    ]
                ),
            )
    return roots.tolist(), columns, tuple(level_bytes)


def _cover64(
    highs: Array, lengths: Array, level_bits: list[int]
) -> tuple[list[Array], list[Array]]:
    """_cover by numpy, for prefixes of at most 64 bits (``highs``: their top 64 bits):
    per level, the blocks covered fully and those covered partly, sorted."""
    import numpy as np  # noqa: PLC0415

    depth_of = np.searchsorted(np.array(level_bits), lengths, side="left")
    full: list[Array] = []
    kept: list[Array] = []  # per level, the prefixes not inside a fully covered block
    for depth, bits in enumerate(level_bits):
        mine = depth_of == depth
        high, length = highs[mine], lengths[mine].astype(np.int64)
        inside = np.zeros(len(high), bool)
        for above, above_bits in zip(full, level_bits, strict=False):
            inside |= _member(high >> np.uint64(64 - above_bits), above)
        high, length = high[~inside], length[~inside]
        kept.append(high)
        count = np.left_shift(1, bits - length)
        first = high >> np.uint64(64 - bits)
        starts = np.repeat(np.cumsum(count) - count, count)
        offsets = (np.arange(int(count.sum())) - starts).astype(np.uint64)
        full.append(np.unique(np.repeat(first, count) + offsets))
    partial = []
    for depth, bits in enumerate(level_bits):
        below = [k >> np.uint64(64 - bits) for k in kept[depth + 1 :]]
        partial.append(
            np.setdiff1d(
                np.unique(np.concatenate([np.zeros(0, np.uint64), *below])),
                full[depth],
                assume_unique=True,
            )
        )
    return full, partial


def _member(values: Array, ordered: Array) -> Array:
    """Which of ``values`` are in the sorted array ``ordered``."""
    import numpy as np  # noqa: PLC0415

    if not len(ordered):
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return ordered[at] == values


def build_subnet_table(rules: SubnetRules) -> SubnetTable:
    """Resolve the rules into one verdict per address block and lay out the maps."""
    small = _small_table(rules)
    return small if small is not None else _bulk_table(rules)


def _bulk_table(rules: SubnetRules) -> SubnetTable:
    """The tables laid out with numpy (any number of rules)."""
    allow_all = not rules.allow  # no allow rule at all: everything not denied passes
    v4 = build_v4(_of_family(rules.allow, 4), _of_family(rules.deny, 4), allow_all)
    allow_root = _FULL if allow_all else _NONE
    bulk = _table64(rules, allow_root)
    if bulk is not None:
        roots6, columns, levels6 = bulk
        nodes6: list[tuple[int, int, int, int]] = []
        count = sum(len(keys) for keys, _ in columns.values())
    else:
        roots6, nodes6, levels6 = _family_table(6, rules, allow_root)
        columns = node_columns(nodes6, [n for n in levels6 if n <= BUCKET_MAX_BYTES])
        count = len(nodes6)
    if count > MAX_NODES:
        raise _too_big(f"more than {MAX_NODES} map entries")
    return _assembled(v4, roots6, nodes6, levels6, build_buckets(columns))


def _assembled(
    v4: V4Table | SmallV4,
    roots6: Sequence[int],
    nodes6: Sequence[tuple[int, int, int, int]],
    levels6: Sequence[int],
    buckets: tuple[tuple[BucketLevel, ...], Any],
) -> SubnetTable:
    """The table from its IPv4 part and its IPv6 levels: those of up to
    BUCKET_MAX_BYTES in ``buckets``, the deeper ones' entries in the HASH."""
    return SubnetTable(
        v4=v4,
        roots=tuple(roots6),
        nodes=tuple(n for n in nodes6 if n[1] > BUCKET_MAX_BYTES),
        levels=tuple(n for n in levels6 if n > BUCKET_MAX_BYTES),
        bucket_levels=buckets[0],
        buckets=buckets[1],
    )


def _too_big(what: str) -> AlfError:
    return AlfError(
        "subnet rules",
        f"they expand to {what}",
        "merge adjacent prefixes into shorter ones, or prefer prefix lengths "
        "that are multiples of 8",
        EX_DATAERR,
    )


# -- IPv4: two levels, numpy -----------------------------------------------------------


def _of_family(prefixes: Sequence[Prefix], family: int) -> PrefixList:
    return PrefixList.of(prefixes).of_family(family)


class Ranges(Record, eq=False):
    """The union of a list of IPv4 prefixes as prefixes that are sorted and disjoint
    (possibly adjacent): a union of prefixes is one of disjoint prefixes, so only the
    ones inside others are dropped.  5 bytes a range."""

    start: Array  # uint32, ascending
    length: Array  # uint8

    @classmethod
    def of(cls, prefixes: PrefixList) -> Ranges:
        import numpy as np  # noqa: PLC0415

        key = np.sort(prefixes.low.astype(np.int64) << 6 | prefixes.length)  # wider first
        start, length = key >> 6, key & 63
        reach = np.maximum.accumulate(start + (np.int64(1) << (32 - length)))
        keep = np.ones(len(key), bool)
        keep[1:] = start[1:] >= reach[:-1]  # not inside an earlier range
        return cls(start[keep].astype(np.uint32), length[keep].astype(np.uint8))

    def wider(self, bits: int) -> tuple[Array, Array]:
        """The ranges of at least a block of ``bits`` bits, as block intervals [from, to)."""
        import numpy as np  # noqa: PLC0415

        wide = self.length <= bits
        first = self.start[wide].astype(np.int64) >> (32 - bits)
        return first, first + (np.int64(1) << (bits - self.length[wide].astype(np.int64)))

    def narrower(self, bits: int) -> tuple[Array, Array]:
        """The ranges smaller than a block: (start, length), as stored (no copy to a
        wider type: at a million rules each copy costs time at every start)."""
        narrow = self.length > bits
        return self.start[narrow], self.length[narrow]


def build_v4(allow: Sequence[Prefix], deny: Sequence[Prefix], allow_all: bool) -> V4Table:
    """The IPv4 table, with the first-level size that needs the least memory (its
    arrays are written later, by V4Table.fill)."""
    allowed, denied = Ranges.of(PrefixList.of(allow)), Ranges.of(PrefixList.of(deny))
    bits, capacity = cheapest_first_level(lambda bits: _split_count(allowed, denied, bits))
    return V4Table(bits, capacity, allowed, denied, allow_all)


def _split_blocks(allowed: Ranges, denied: Ranges, bits: int) -> Array:
    """The blocks, ascending, that ranges smaller than a block fall in, but for those
    denied whole: the blocks that may need a leaf."""
    import numpy as np  # noqa: PLC0415

    runs = [r.start[r.length > bits] >> (32 - bits) for r in (allowed, denied) if len(r.start)]
    if len(runs) == 2:  # two ascending runs: a stable sort merges them in linear time
        blocks = _distinct(np.sort(np.concatenate(runs), kind="stable"))
    else:
        blocks = _distinct(runs[0]) if runs else np.zeros(0, np.uint32)
    first, end = denied.wider(bits)
    if not len(first) or not len(blocks):
        return blocks
    row = np.searchsorted(first, blocks, side="right") - 1
    return blocks[(row < 0) | (blocks >= end[np.maximum(row, 0)])]


def _split_count(allowed: Ranges, denied: Ranges, bits: int) -> int:
    """len(_split_blocks(...)), without the array where one list alone splits blocks
    and no deny covers a whole one (every first-level size is counted at start-up)."""
    import numpy as np  # noqa: PLC0415

    runs = [r.start[r.length > bits] for r in (allowed, denied)]
    if sum(bool(len(run)) for run in runs) != 1 or len(denied.wider(bits)[0]):
        return len(_split_blocks(allowed, denied, bits))
    block = max(runs, key=len) >> (32 - bits)  # ascending: count where it changes
    return 1 + int(np.count_nonzero(block[1:] != block[:-1]))


def _distinct(ordered: Array) -> Array:
    """The distinct values of a sorted array (np.unique without its sort or hashing)."""
    import numpy as np  # noqa: PLC0415

    if not len(ordered):
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def _coverage(first: Array, end: Array, lo: int, hi: int) -> Array:
    """Which of the positions lo..hi-1 the sorted, disjoint intervals [first, end)
    cover: one pass over a difference array, no per-interval loop."""
    import numpy as np  # noqa: PLC0415

    i, j = np.searchsorted(end, lo, side="right"), np.searchsorted(first, hi, side="left")
    s, e = np.clip(first[i:j], lo, hi) - lo, np.clip(end[i:j], lo, hi) - lo
    if len(s) > 1:  # join touching intervals, so that no position both starts and ends one
        apart = s[1:] != e[:-1]
        s, e = s[np.concatenate(([True], apart))], e[np.concatenate((apart, [True]))]
    diff = np.zeros(hi - lo + 1, np.int32)  # int32: its cumsum is vectorised, int8's not
    diff[s] = 1
    diff[e] = -1
    np.cumsum(diff, out=diff)
    return diff[:-1] != 0


_ALL_ONES = (1 << 64) - 1
_LEAF_WINDOW = 1 << 24  # leaf bits worked on at a time (2 MiB): bounds the temporaries
_BLOCK_WINDOW = 1 << 20  # blocks worked on at a time


def _fill_v4(table: V4Table, write: Callable[[str, int, Array], None]) -> None:
    import numpy as np  # noqa: PLC0415

    bits = table.root_bits
    leaf_bits = 1 << (32 - bits)
    split = _split_blocks(table.allow, table.deny, bits)
    wide = {name: r.wider(bits) for name, r in (("allow", table.allow), ("deny", table.deny))}
    narrow = {name: r.narrower(bits) for name, r in (("allow", table.allow), ("deny", table.deny))}
    total, begin, done = 1 << bits, 0, 0
    while begin < total:
        # A window of whole lines, with at most _LEAF_WINDOW leaf bits (one line at least).
        end = min(begin + _BLOCK_WINDOW, total)
        lo, hi = np.searchsorted(split, (begin, end))
        if (hi - lo) * leaf_bits > _LEAF_WINDOW:
            end = max(begin + 64, int(split[lo + _LEAF_WINDOW // leaf_bits]) >> 6 << 6)
            hi = np.searchsorted(split, end)
        blocks = split[lo:hi]
        passes = (
            np.ones(end - begin, bool) if table.allow_all else _coverage(*wide["allow"], begin, end)
        )
        if len(wide["deny"][0]):
            passes &= ~_coverage(*wide["deny"], begin, end)
        descend = np.zeros(end - begin, bool)
        if len(blocks):
            # A leaf byte per 8 addresses: the block's verdict, the narrower allow
            # ranges added, the narrower deny ranges taken away.
            leaf = np.empty((len(blocks), leaf_bits >> 3), np.uint8)
            leaf[:] = np.where(passes[blocks - begin], 0xFF, 0).astype(np.uint8)[:, None]
            flat = leaf.reshape(-1)  # a view: the same bytes
            for name in ("allow", "deny"):
                if len(narrow[name][0]):
                    found = _leaf_bytes(blocks, *narrow[name], bits)
                    if name == "allow":
                        flat |= found
                    else:
                        flat &= ~found
            words = leaf.view(np.uint64)  # leaves are whole u64s: reduce 8 bytes at a time
            whole = np.bitwise_and.reduce(words, axis=1) == np.uint64(_ALL_ONES)
            mixed = (np.bitwise_or.reduce(words, axis=1) != 0) & ~whole
            passes[blocks - begin] = whole
            descending = blocks[mixed] - begin
            descend[descending] = True
            if mixed.any():  # in address order: a leaf's index is its rank
                write("leaves", done, leaf[mixed])
        else:
            descending = blocks
        out = np.zeros(((end - begin) >> 6, LINE_WORDS), np.uint64)
        for word, flags in ((0, descend), (1, passes)):
            packed = np.packbits(flags.reshape(-1, 64), axis=1, bitorder="little")
            out[:, word] = packed.view("<u8").reshape(-1)
        counts = np.bincount(descending >> 6, minlength=len(out)).astype(np.uint64)
        out[:, 2] = done + np.cumsum(counts, dtype=np.uint64) - counts
        write("lines", begin >> 6, out)
        done += len(descending)
        begin = end


def _leaf_bytes(blocks: Array, start: Array, length: Array, bits: int) -> Array:
    """The leaves of ``blocks``, laid end to end, with the bits set that the ranges
    (start, length), smaller than a block, cover; ranges in other blocks are skipped."""
    import numpy as np  # noqa: PLC0415

    leaf_bytes = 1 << (32 - bits - 3)
    out = np.zeros(len(blocks) * leaf_bytes, np.uint8)
    top = (int(blocks[-1]) + 1) << (32 - bits)  # 2**32 for the last block: past any start
    lo = np.searchsorted(start, np.uint32(int(blocks[0]) << (32 - bits)))
    hi = np.searchsorted(start, np.uint32(top)) if top < 1 << 32 else len(start)
    start, length = start[lo:hi], length[lo:hi]
    block = start >> (32 - bits)
    row = np.minimum(np.searchsorted(blocks, block), len(blocks) - 1)
    found = blocks[row] == block
    offset = start[found] & ((1 << (32 - bits)) - 1)
    span = np.int64(1) << (32 - length[found].astype(np.int64))
    byte = row[found] * leaf_bytes + (offset >> 3)
    # Under 8 addresses: bits of one byte.  Ranges are sorted and disjoint, so those
    # sharing a byte are neighbours: OR them together, one group at a time.
    small = span < 8
    if small.any():
        where, mask = byte[small], ((1 << span[small]) - 1) << (offset[small] & 7)
        group = np.flatnonzero(np.concatenate(([True], where[1:] != where[:-1])))
        out[where[group]] = np.bitwise_or.reduceat(mask.astype(np.uint8), group)
    # 8 or more: whole bytes, which no other range shares.
    count = span[~small] >> 3
    if len(count):
        first = np.repeat(byte[~small] - (np.cumsum(count) - count), count)
        out[first + np.arange(len(first))] = 0xFF
    return out


def lookup_v4(table: V4Table | SmallV4, value: int) -> bool:
    entry = value >> (32 - table.root_bits)
    descend, passes, first = (int(w) for w in table.lines[entry >> 6][:3])
    bit = 1 << (entry & 63)
    if not descend & bit:
        return bool(passes & bit)
    leaf = table.leaves[first + (descend & (bit - 1)).bit_count()]
    address = value & ((1 << (32 - table.root_bits)) - 1)
    return bool(leaf[address >> 3] >> (address & 7) & 1)


# -- IPv6 levels of up to 8 bytes: one cache line a level, probed independently ---------


def _bucket_of(keys: Array, multiplier: int, bits: int) -> Array:
    import numpy as np  # noqa: PLC0415

    with np.errstate(over="ignore"):
        return (keys * np.uint64(multiplier)) >> np.uint64(64 - bits)


def _ranks(buckets: Array) -> Array:
    """Each key's place among the keys of its bucket, in key order."""
    import numpy as np  # noqa: PLC0415

    order = np.argsort(buckets, kind="stable")
    ordered = buckets[order]
    ranks = np.empty(len(buckets), np.int64)
    ranks[order] = np.arange(len(buckets)) - np.searchsorted(ordered, ordered, side="left")
    return ranks


def _place(keys: Array, bits: int, pair: tuple[int, int]) -> tuple[Any, Any] | None:
    """Each key's bucket and slot: its first bucket, or its second when the first has
    more keys than slots.  A lookup reads a full first bucket whole before the second,
    so any BUCKET_SLOTS of a crowded bucket's keys may stay: those whose second
    bucket has the most room move (one crowded bucket at a time), so that a second
    bucket overflows only when no choice fits.  None then.  (Moving the keys that
    came last, whatever their second bucket, failed all three pairs for 5 of 20 sets
    of 500,000 random /64s, which doubled the table; this way, none of them.)"""
    import numpy as np  # noqa: PLC0415

    bucket = _bucket_of(keys, pair[0], bits).astype(np.int64)
    count = np.bincount(bucket, minlength=1 << bits)
    crowded = np.flatnonzero(count[bucket] > BUCKET_SLOTS)  # the keys that may move
    if len(crowded):
        second = _bucket_of(keys[crowded], pair[1], bits).astype(np.int64)
        room = np.maximum(BUCKET_SLOTS - count, 0)  # a bucket's own keys come first
        members: dict[int, list[int]] = {}
        for i, first in enumerate(bucket[crowded].tolist()):
            members.setdefault(first, []).append(i)
        moved = []
        for first in sorted(members):
            mine = sorted(members[first], key=lambda i: -int(room[second[i]]))
            for i in mine[: len(mine) - BUCKET_SLOTS]:
                if room[second[i]] <= 0:
                    return None
                room[second[i]] -= 1
                moved.append(i)
        bucket[crowded[moved]] = second[moved]
    return bucket, _ranks(bucket)


def fitted(
    keys: Keys, place: Callable[[Keys, int, tuple[int, int]], Placed | None]
) -> tuple[int, tuple[int, int], Placed]:
    """A bucket level for ``keys``: the fewest buckets (at least a bucket for
    KEYS_PER_BUCKET keys) and the first pair of MULTIPLIERS where ``place(keys,
    bits, pair)`` finds every key a place, and those places."""
    bits = max(1, (len(keys) // KEYS_PER_BUCKET).bit_length())
    while True:
        for pair in MULTIPLIERS:
            placed = place(keys, bits, pair)
            if placed is not None:
                return bits, pair, placed
        bits += 1


def node_columns(
    nodes: Sequence[tuple[int, int, int, int]], levels: Sequence[int]
) -> dict[int, tuple[Array, Array]]:
    """Nodes (family, byte count, block, node) as build_buckets takes them: per byte
    count, the blocks (uint64) and their nodes (uint8)."""
    import numpy as np  # noqa: PLC0415

    columns = {}
    for nbytes in levels:
        mine = [n for n in nodes if n[1] == nbytes]
        columns[nbytes] = (
            np.fromiter((n[2] for n in mine), np.uint64, len(mine)),
            np.fromiter((n[3] for n in mine), np.uint8, len(mine)),
        )
    return columns


def build_buckets(
    columns: dict[int, tuple[Array, Array]],
) -> tuple[tuple[BucketLevel, ...], Any]:
    """The bucket array of these IPv6 levels (byte count -> blocks and their nodes):
    about two keys a bucket, so a lookup reads one cache line a level (a second only
    past a full one)."""
    import numpy as np  # noqa: PLC0415

    made, parts, offset = [], [], 0
    for nbytes in sorted(columns):
        keys, values = columns[nbytes]
        if not len(keys):
            continue  # every prefix of that length is covered by a shorter one
        bits, pair, (bucket, slot) = fitted(keys, _place)
        table = np.zeros((1 << bits, BUCKET_WORDS), np.uint64)
        table[bucket.astype(np.int64), slot] = keys
        tail = table.view(np.uint8).reshape(-1, 8 * BUCKET_WORDS)[:, 8 * BUCKET_SLOTS :]
        tail[bucket.astype(np.int64), slot] = values  # the last word: values, then count
        tail[:, BUCKET_SLOTS] = np.bincount(bucket.astype(np.int64), minlength=1 << bits)
        made.append(BucketLevel(nbytes, offset, bits, pair))
        parts.append(table)
        offset += 1 << bits
    empty = np.zeros((0, BUCKET_WORDS), np.uint64)
    return tuple(made), np.concatenate(parts) if parts else empty


def bucket_words(buckets: Any, index: int) -> list[int]:
    """The BUCKET_WORDS u64 of one bucket, from either layout's buckets."""
    if isinstance(buckets, bytes | bytearray):
        return list(_BUCKET.unpack_from(buckets, index * _BUCKET.size))
    return [int(w) for w in buckets[index]]


def _in_bucket(buckets: Any, index: int, key: int) -> int | None:
    words = bucket_words(buckets, index)
    tail = words[BUCKET_SLOTS].to_bytes(8, "little")
    for i in range(tail[BUCKET_SLOTS]):
        if words[i] == key:
            return tail[i]
    return None


def lookup_buckets(table: SubnetTable, value: int, node: int) -> int:
    """The deepest bucket level's entry for an IPv6 address, else ``node``."""
    for level in table.bucket_levels:
        key = value >> (128 - 8 * level.nbytes)
        for multiplier in level.multipliers:
            index = level.offset + ((key * multiplier) % 2**64 >> (64 - level.bits))
            found = _in_bucket(table.buckets, index, key)
            if found is not None:
                node = found
                break
            if bucket_words(table.buckets, index)[BUCKET_SLOTS] >> 56 < BUCKET_SLOTS:
                break  # not full: not in a second bucket either
    return node


def lookup(table: SubnetTable, family: int, value: int) -> bool:
    """Walk the tables as the filter does: does a packet from this address pass?

    The reference the kernel program is tested against, and a unit-test oracle.
    """
    if family == 4:
        return lookup_v4(table.v4, value)
    width = FAMILY_BITS[family]
    node = lookup_buckets(table, value, table.roots[value >> (width - ROOT_BITS)])
    entries = {(f, n, b): v for f, n, b, v in table.nodes if f == family}
    for nbytes in table.levels:
        if not node & NODE_DESCEND:
            break
        child = entries.get((family, nbytes, value >> (width - 8 * nbytes)))
        node = child if child is not None else node & NODE_PASS
    return bool(node & NODE_PASS)


def encode_nodes(table: SubnetTable, key: struct.Struct) -> tuple[bytes, bytes]:
    """The hash map's keys and values, packed as struct subnet_key (``key``) / u32 arrays."""
    keys = bytearray(key.size * len(table.nodes))
    values = bytearray(VALUE.size * len(table.nodes))
    pack_key, pack_value = key.pack_into, VALUE.pack_into
    ksize, vsize = key.size, VALUE.size
    for i, (family, nbytes, block, node) in enumerate(table.nodes):
        pack_key(keys, i * ksize, nbytes, family, b"", block.to_bytes(nbytes, "big"))
        pack_value(values, i * vsize, node)
    return bytes(keys), bytes(values)


# -- A few rules: the same tables in plain Python ---------------------------------------

# Up to SMALL_RULES rules (prefix_list.py, whose reader they pass too), a start lays
# out its tables without numpy.  (With at most 64 leaves, the cheapest IPv4 first level
# is at most 2**18 blocks: 8,192 lines.)
_LOW64 = (1 << 64) - 1
Range = tuple[int, int]  # an IPv4 range as Ranges holds it: (start, length)


class SmallV4(V4Shape, eq=False):
    """V4Table's layout of a few rules, made in plain Python (_small_table): the lines
    and the leaves that are used, as bytes."""

    line_data: bytes
    leaf_data: bytes

    def fill(self, write: Callable[[str, int, Any], None]) -> None:
        """As V4Table.fill, in one write each."""
        write("lines", 0, memoryview(self.line_data))
        if self.leaf_data:
            write("leaves", 0, memoryview(self.leaf_data))

    @property
    def lines(self) -> Array:  # for tests and tools, as V4Table's
        import numpy as np  # noqa: PLC0415

        return np.frombuffer(self.line_data, np.uint64).reshape(-1, LINE_WORDS)

    @property
    def leaves(self) -> Array:
        import numpy as np  # noqa: PLC0415

        leaves = np.zeros((self.capacity, self.leaf_bytes), np.uint8)
        used = np.frombuffer(self.leaf_data, np.uint8).reshape(-1, self.leaf_bytes)
        leaves[: len(used)] = used
        return leaves


def _small_table(rules: SubnetRules) -> SubnetTable | None:
    """The tables of at most SMALL_RULES rules, laid out in plain Python, so that such a
    start never imports numpy (about 50 ms and 20 MiB): the same IPv4 bytes and the
    same IPv6 roots, entries and buckets' contents as the numpy layout
    (tests/unit/test_subnet_table.py holds them to each other).  None for more rules."""
    if len(rules.allow) + len(rules.deny) > SMALL_RULES:
        return None
    allow_all = not rules.allow
    allowed = _small_ranges(p for p in rules.allow if p.family == 4)
    denied = _small_ranges(p for p in rules.deny if p.family == 4)
    bits, capacity = cheapest_first_level(lambda bits: len(_small_split(allowed, denied, bits)))
    v4 = SmallV4(bits, capacity, *_small_v4(allowed, denied, allow_all, bits))
    roots6, nodes6, levels6 = _family_table(6, rules, _FULL if allow_all else _NONE)
    columns = {
        nbytes: [(n[2], n[3]) for n in nodes6 if n[1] == nbytes]
        for nbytes in levels6
        if nbytes <= BUCKET_MAX_BYTES
    }
    return _assembled(v4, roots6, nodes6, levels6, _small_buckets(columns))


def _small_ranges(prefixes: Iterable[Prefix]) -> list[Range]:
    """Ranges.of: sorted, wider first at the same start, those inside others dropped."""
    kept, reach = [], -1
    for start, length in sorted((p.value, p.length) for p in prefixes):
        if start >= reach:
            kept.append((start, length))
        reach = max(reach, start + (1 << (32 - length)))
    return kept


def _small_split(allowed: list[Range], denied: list[Range], bits: int) -> list[int]:
    """_split_blocks: the blocks narrower ranges fall in, but those denied whole."""
    shift = 32 - bits
    blocks = sorted({s >> shift for s, n in allowed + denied if n > bits})
    wide = [(s >> shift, (s >> shift) + (1 << (bits - n))) for s, n in denied if n <= bits]
    return [b for b in blocks if not any(first <= b < end for first, end in wide)]


def _small_v4(
    allowed: list[Range], denied: list[Range], allow_all: bool, bits: int
) -> tuple[bytes, bytes]:
    """_fill_v4's lines and used leaves, with a Python integer as each bitmap."""
    shift, total = 32 - bits, 1 << bits
    leaf_bits = 1 << shift
    whole = (1 << leaf_bits) - 1

    def blocks(ranges: list[Range]) -> int:  # the blocks wide ranges cover, as bits
        covered = 0
        for start, length in ranges:
            if length <= bits:
                covered |= ((1 << (1 << (bits - length))) - 1) << (start >> shift)
        return covered

    passes = ((1 << total) - 1 if allow_all else blocks(allowed)) & ~blocks(denied)
    descend, leaves = 0, []
    for block in _small_split(allowed, denied, bits):
        leaf = whole if passes >> block & 1 else 0
        for ranges, adds in ((allowed, True), (denied, False)):
            for start, length in ranges:
                if length > bits and start >> shift == block:
                    span = ((1 << (1 << (32 - length))) - 1) << (start & (leaf_bits - 1))
                    leaf = leaf | span if adds else leaf & ~span
        passes = passes | 1 << block if leaf == whole else passes & ~(1 << block)
        if leaf not in (0, whole):
            descend |= 1 << block
            leaves.append(leaf.to_bytes(leaf_bits // 8, "little"))
    lines = array("Q", bytes(total // 64 * LINE_WORDS * 8))
    for word, bitmap in ((0, descend), (1, passes)):
        lines[word::LINE_WORDS] = _u64s(bitmap.to_bytes(total // 8, "little"))
    descend_words, first = _u64s(descend.to_bytes(total // 8, "little")), 0
    for line, word in enumerate(descend_words):  # each line's first leaf: a running count
        lines[line * LINE_WORDS + 2] = first
        first += word.bit_count()
    return lines.tobytes(), b"".join(leaves)


def _u64s(little: bytes) -> array[int]:
    words = array("Q", little)
    if sys.byteorder == "big":
        words.byteswap()
    return words


def _small_buckets(
    columns: dict[int, list[tuple[int, int]]],
) -> tuple[tuple[BucketLevel, ...], bytes]:
    """build_buckets for a few keys: the same sizes and the same placement rule."""
    made, parts, offset = [], [], 0
    for nbytes in sorted(columns):
        entries = columns[nbytes]
        if not entries:
            continue
        keys = [key for key, _ in entries]
        bits, pair, placed = fitted(keys, _small_place)
        table = bytearray(_BUCKET.size << bits)
        count: dict[int, int] = {}
        for (key, value), bucket in zip(entries, placed, strict=True):
            slot = count.get(bucket, 0)
            count[bucket] = slot + 1
            struct.pack_into("=Q", table, bucket * _BUCKET.size + 8 * slot, key)
            table[bucket * _BUCKET.size + 8 * BUCKET_SLOTS + slot] = value
        for bucket, n in count.items():
            table[bucket * _BUCKET.size + _BUCKET.size - 1] = n
        made.append(BucketLevel(nbytes, offset, bits, pair))
        parts.append(bytes(table))
        offset += 1 << bits
    return tuple(made), b"".join(parts)


def _small_place(keys: list[int], bits: int, pair: tuple[int, int]) -> list[int] | None:
    """_place for a few keys: each key's bucket (its slot: its place among the keys of
    that bucket, in key order), or None."""
    first = [(key * pair[0] & _LOW64) >> (64 - bits) for key in keys]
    count: dict[int, int] = {}
    for bucket in first:
        count[bucket] = count.get(bucket, 0) + 1
    room = {b: max(BUCKET_SLOTS - n, 0) for b, n in count.items()}
    members: dict[int, list[int]] = {}
    for i, bucket in enumerate(first):
        if count[bucket] > BUCKET_SLOTS:
            members.setdefault(bucket, []).append(i)
    second = {i: (keys[i] * pair[1] & _LOW64) >> (64 - bits) for m in members.values() for i in m}
    placed = list(first)
    for bucket in sorted(members):
        mine = sorted(members[bucket], key=lambda i: -room.get(second[i], BUCKET_SLOTS))
        for i in mine[: len(mine) - BUCKET_SLOTS]:
            if room.get(second[i], BUCKET_SLOTS) <= 0:
                return None
            room[second[i]] = room.get(second[i], BUCKET_SLOTS) - 1
            placed[i] = second[i]
    return placed
