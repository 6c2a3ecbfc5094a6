"""Compile subnet rules into the lookup table the subnet filter walks (pure Python).

Why not a BPF LPM trie: its lookup walks one node per prefix bit in the worst
case and gets slower as the rule set grows (about 150 ns at a million rules
here), and it needs CAP_BPF.  Instead the wrapper resolves allow/deny into a
single verdict per address block and lays it out as a multibit trie with leaf
pushing, whose levels sit at byte boundaries:

* level 0 is an ARRAY indexed by the first 16 address bits (one per family);
* deeper levels are entries of one HASH map keyed by (family, byte count,
  leading bytes), only at the byte lengths the rule set actually uses.

Each entry says "pass" or "drop" for its whole block, or "descend", in which
case the PASS bit is the verdict for the parts of the block that have no
entry of their own.  A packet costs one array lookup plus one hash lookup per
level it descends, bounded by the number of distinct byte lengths in the rule
set (at most 2 for IPv4, 14 for IPv6) and independent of the number of rules.
Prefixes expand to the next level boundary, at most 2**7 entries per rule.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from alfwrapper.errors import EX_DATAERR, AlfError
from alfwrapper.rules import FAMILY_BITS, Prefix, SubnetRules

ROOT_BITS = 16
ROOT_SLOTS = 1 << ROOT_BITS
ROOT_ENTRIES = 2 * ROOT_SLOTS  # IPv4 roots, then IPv6 roots
NODE_PASS = 1
NODE_DESCEND = 2
MAX_NODES = 8 << 20  # about 80 bytes of kernel memory each

# Coverage of a block by one rule list.
_NONE, _FULL, _PARTIAL = 0, 1, 2

# struct subnet_key: defined here, handed to C by parts.c_struct (the one definition).
KEY_FIELDS = (("nbytes", "u8"), ("family", "u8"), ("pad", "u8[2]"), ("addr", "u8[16]"))
VALUE = struct.Struct("=I")


@dataclass(frozen=True)
class SubnetTable:
    """The filled-in maps and the level layout the filter is compiled for.

    ``levels`` holds, per family, the byte lengths of the hash levels, in order.
    ``nodes`` holds (family, byte length, block, node value) per hash entry.
    """

    roots: tuple[int, ...]
    nodes: tuple[tuple[int, int, int, int], ...]
    levels: dict[int, tuple[int, ...]]


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


def _family_table(
    family: int, rules: SubnetRules, allow_root: int
) -> tuple[list[int], list[tuple[int, int, int, int]], tuple[int, ...]]:
    width = FAMILY_BITS[family]
    deny = [p for p in rules.deny if p.family == family]
    allow = [p for p in rules.allow if p.family == family]
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


def build_subnet_table(rules: SubnetRules) -> SubnetTable:
    """Resolve the rules into one verdict per address block and lay out the maps."""
    allow_root = _FULL if not rules.allow else _NONE
    roots4, nodes4, levels4 = _family_table(4, rules, allow_root)
    roots6, nodes6, levels6 = _family_table(6, rules, allow_root)
    nodes = nodes4 + nodes6
    if len(nodes) > MAX_NODES:
        raise AlfError(
            "subnet rules",
            f"they expand to more than {MAX_NODES} map entries",
            "merge adjacent prefixes into shorter ones, or prefer prefix lengths "
            "that are multiples of 8",
            EX_DATAERR,
        )
    return SubnetTable(
        roots=tuple(roots4 + roots6),
        nodes=tuple(nodes),
        levels={4: levels4, 6: levels6},
    )


def lookup(table: SubnetTable, family: int, value: int) -> bool:
    """Walk the table as the filter does: does a packet from this address pass?

    The reference the kernel program is tested against, and a unit-test oracle.
    """
    width = FAMILY_BITS[family]
    index = (value >> (width - ROOT_BITS)) + (ROOT_SLOTS if family == 6 else 0)
    node = table.roots[index]
    entries = {(f, n, b): v for f, n, b, v in table.nodes if f == family}
    for nbytes in table.levels[family]:
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
