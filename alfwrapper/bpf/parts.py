"""The filter parts, each registered once: its C file, settings, call, maps and drop reason.

A socket's program is made of the parts its rules use (program.py composes
them, in the order of PARTS).  A part says:

- ``source``: its file in filters/, restricted C (a plan may add more files
  of the part's, with a condition of theirs: PartPlan.more);
- ``used(rules)``: whether a socket's rules need it;
- ``plan(rules)``: its -D settings, C generated from Python (struct layouts
  and constants defined once, here, never copied into C), and the data its
  maps are filled from; pure, so the same rules always give the same program;
- ``condition``: the C expression that passes a packet, given ``skb`` and the
  parsed ``pkt`` (common.h);
- ``bind(tables, plan, rules, env)``: maps of the host's (named sets) that the
  program reads in place of placeholders of its own, written into its instructions
  as it loads (compiler.py);
- ``fill(tables, plan, env)``: how its maps (tables.Tables) are filled once loaded;
- ``reason``: the drop counter it adds to, per socket;
- ``why(rules, packet)``: what `explain` says when it dropped a packet.

Adding a part means adding one class here and one file in filters/.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import struct
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import compress
from typing import TYPE_CHECKING, Any

from alfwrapper.bpf import map_values, table_cache
from alfwrapper.bpf.subnet_table import (
    KEY_FIELDS,
    LINE_WORDS,
    NODE_DESCEND,
    NODE_PASS,
    ROOT_SLOTS,
    SubnetTable,
    build_subnet_table,
    encode_nodes,
)
from alfwrapper.bpf.tables import Table, Tables
from alfwrapper.errors import EX_CONFIG, EX_OSERR, EX_SOFTWARE, EX_USAGE, AlfError, excerpt
from alfwrapper.host import cachedir
from alfwrapper.policy.rules import MOST_SETS, SocketRules
from alfwrapper.record import Record, as_tuple, field, replace

if TYPE_CHECKING:
    from alfwrapper.policy import knocking

# Why a packet was passed or dropped: the counters' indexes, in C as ALF_REASON_*.
REASONS = ("passed", "malformed", "interfaces", "subnets", "knocking", "filter")
# Prefixes of map names the parts use; a developer's filter may not use them.
RESERVED_PREFIXES = ("subnet_", "iface_", "knock_", "alf_")
L4_CB = 4  # skb->cb[] word that carries the transport offset to a developer's filter


def _no_sets(name: str, role: str) -> int:
    raise AlfError(
        f"named set {name}", "sets are not reachable here", "run the service as root's", EX_USAGE
    )


class FillEnv(Record):
    """What filling needs from the host: interface indexes, how to name one, and how
    to open a named set's map (an fd, closed after use; sets.open_role)."""

    interfaces: dict[int, str] = field(default_factory=dict)  # index -> name, allowed now
    ifindex_of: map_values.IfindexOf = lambda _name: None
    open_set: Callable[[str, str], int] = _no_sets

    @classmethod
    def of_host(cls, rules: Iterable[SocketRules]) -> FillEnv:
        """This network namespace's indexes of the interfaces these rules name (an
        unknown name is an error), and its way to look up more (--set values)."""
        from alfwrapper.host import interfaces  # noqa: PLC0415  (not for most starts)

        wanted = sorted({name for r in rules for name in r.interfaces})
        indexes = interfaces.resolve(wanted) if wanted else {}
        return cls({index: name for name, index in indexes.items()}, interfaces.link_index)


class Pins(Record):
    """Where a socket's maps that outlive its programs are pinned (state/), if anywhere."""

    socket_dir: str
    service_dir: str

    def path(self, name: str) -> str:
        return f"{self.socket_dir}/{name}"


class PartPlan(Record):
    """One part, planned for one socket's rules."""

    part: Part
    defines: tuple[tuple[str, str], ...] = ()
    prelude: str = ""  # C generated here, pasted before the part's file
    data: Any = None
    pinned: tuple[tuple[str, str], ...] = ()  # (map, pin path): maps that outlive the program
    # Files of the part's pasted after its own where these rules need them, and the
    # condition they give in place of the part's (knocking.c, then spa.c for SPA).
    more: tuple[str, ...] = ()
    condition: str = ""
    # Keeps what fill writes, for a later start (bpf/table_cache.py); not part of the plan.
    recorder: Any = field(default=None, compare=False, repr=False)


def c_struct(name: str, fields: Sequence[tuple[str, str]]) -> tuple[str, struct.Struct]:
    """A struct defined once, in Python: its C declaration and its struct module format.

    ``fields`` are (name, type) with types u8, u16, u32, u64 or u8[N].
    """
    c_fields = [
        f"u8 {member}[{kind[3:-1]}];" if kind.startswith("u8[") else f"{kind} {member};"
        for member, kind in fields
    ]
    fmt = "=" + "".join(_code(kind) for _, kind in fields)
    return f"struct {name} {{ {' '.join(c_fields)} }};\n", struct.Struct(fmt)


def c_offsets(fields: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Where each of c_struct's ``fields`` starts (packed, as c_struct makes them)."""
    offsets, at = {}, 0
    for member, kind in fields:
        offsets[member] = at
        at += struct.calcsize("=" + _code(kind))
    return offsets


def _code(kind: str) -> str:
    """A c_struct field's type as the struct module writes it."""
    if kind.startswith("u8[") and kind.endswith("]"):
        return f"{int(kind[3:-1])}s"
    return {"u8": "B", "u16": "H", "u32": "I", "u64": "Q"}[kind]


SUBNET_KEY_C, SUBNET_KEY = c_struct("subnet_key", KEY_FIELDS)


class Dropped(Record):
    """A packet `explain` saw dropped: its source address as written, the interface it
    arrived on ("" if not given), and the longest deny rule covering it, with where
    that rule is written ("" if none)."""

    addr: str
    ingress: str
    deny: str = ""


class Part:
    name = ""
    reason = ""  # the counter a drop by this part goes to: one of REASONS
    source = ""
    condition = ""
    ports = False  # reads the transport header (alf_parse_packet's, with ALF_PORTS)

    def used(self, rules: SocketRules, pins: Pins | None) -> bool:
        raise NotImplementedError

    def plan(self, rules: SocketRules, pins: Pins | None) -> PartPlan:
        return PartPlan(self)

    def fill(self, tables: Tables, plan: PartPlan, rules: SocketRules, env: FillEnv) -> None:
        pass

    def bind(
        self, tables: Tables, plan: PartPlan, rules: SocketRules, env: FillEnv
    ) -> dict[str, int]:
        """Maps of the host's that the program reads in place of its own placeholders,
        by the placeholder's name: opened fds, written into the instructions as they
        load (compiler.py), and closed by the caller."""
        return {}

    def why(self, rules: SocketRules, packet: Dropped) -> str:
        """What `explain` says when this part dropped the packet."""
        return ""


class Interfaces(Part):
    """Ingress interface allow-list; reached through the watcher's iface_alive array."""

    name = reason = "interfaces"
    source = "interfaces.c"
    condition = "interfaces_pass(skb)"
    MIN_SLOTS = 4096  # iface_allowed's entries at least: interfaces the watcher may add

    def used(self, rules: SocketRules, pins: Pins | None) -> bool:
        return bool(rules.interfaces)

    def plan(self, rules: SocketRules, pins: Pins | None) -> PartPlan:
        return PartPlan(self, (("IFACE_SLOTS", str(max(self.MIN_SLOTS, len(rules.interfaces)))),))

    def fill(self, tables: Tables, plan: PartPlan, rules: SocketRules, env: FillEnv) -> None:
        set_interfaces(tables, {i: n for i, n in env.interfaces.items() if n in rules.interfaces})

    def why(self, rules: SocketRules, packet: Dropped) -> str:
        allowed = ", ".join(rules.interfaces)
        if not packet.ingress:
            return f"no --interface given, and only {allowed} may pass"
        return f"arrived on {packet.ingress}, not one of {allowed}"


RUNTIME_ALLOW, RUNTIME_DENY = 1, 2
RUNTIME_RULES = 65536
# runtime.c's LPM trie key: prefixlen counts the 32 bits of family and padding too.
RUNTIME_KEY_FIELDS = (("prefixlen", "u32"), ("family", "u8"), ("pad", "u8[3]"), ("addr", "u8[16]"))
RUNTIME_KEY_C, RUNTIME_KEY = c_struct("alf_runtime_key", RUNTIME_KEY_FIELDS)

# The drop log's ring buffer record and its per-socket rate bucket (common.h's
# alf_log_drop; lifecycle/droplog.py reads them).
EVENT_FIELDS = (
    ("ts_ns", "u64"),
    ("ifindex", "u32"),
    ("suppressed", "u32"),
    ("sport", "u16"),
    ("dport", "u16"),
    ("reason", "u8"),
    ("family", "u8"),
    ("proto", "u8"),
    ("pad", "u8"),
    ("addr", "u8[16]"),
)
BUCKET_FIELDS = (
    ("credit_ns", "u64"),
    ("last_ns", "u64"),
    ("pending", "u64"),
    ("suppressed", "u64"),
)
EVENT_C, EVENT = c_struct("alf_event", EVENT_FIELDS)
BUCKET_C, BUCKET = c_struct("alf_bucket", BUCKET_FIELDS)


class Runtime(Part):
    """Allow and deny rules added while the service runs (alfwrapper allow/deny/revoke).

    Only with pinned state: its maps belong to the socket, not to a program.
    A runtime rule decides the subnet question before the policy's own rules.
    """

    name = "runtime"
    reason = "subnets"
    source = "runtime.c"
    condition = "(alf_rt = runtime_verdict(&pkt)) != ALF_RUNTIME_DENY"

    def used(self, rules: SocketRules, pins: Pins | None) -> bool:
        return pins is not None

    def plan(self, rules: SocketRules, pins: Pins | None) -> PartPlan:
        assert pins is not None
        pinned = (
            ("alf_runtime", pins.path("runtime")),
            ("alf_runtime_count", pins.path("runtime_count")),
        )
        defines = (("ALF_RUNTIME_RULES", str(RUNTIME_RULES)),)
        return PartPlan(self, defines, RUNTIME_KEY_C, pinned=pinned)


# A named set's two maps (sets.c): whole addresses in a hash, shorter prefixes in an
# LPM trie (the runtime rules' key), each entry's value its expiry (u64 ns, 0: never).
SET_HOST_FIELDS = (("length", "u8"), ("family", "u8"), ("pad", "u8[2]"), ("addr", "u8[16]"))
SET_HOST_C, SET_HOST = c_struct("alf_set_host", SET_HOST_FIELDS)
SET_RANGE_C, SET_RANGE = c_struct("alf_set_range", RUNTIME_KEY_FIELDS)
SET_EXPIRY = struct.Struct("=Q")
SET_ALLOW, SET_DENY = 1, 2
# A set's pins, in its folder (alfwrapper/sets/tree.py).  hosts_at is an array of
# maps of one slot holding the hosts map in force: a program reads the hosts through
# it, so a set whose hosts map is full grows (sets/content.py: _grow, a larger copy,
# then one update of this slot) while every program that names it runs.
SET_ROLES = ("hosts", "ranges", "sieve", "hosts_at")
# The maps a program is bound to (Sets.bind): not the hosts map itself.
SET_BOUND_ROLES = ("hosts_at", "ranges", "sieve")
# Both maps' flags: BPF_F_NO_PREALLOC (memory for the entries there, not for the
# room) and BPF_F_RDONLY_PROG (no program may write into a set: the verifier says so).
SET_FLAGS = 1 | 1 << 7
# A set's sieve (sets.c): an ARRAY of u64 words, a blocked Bloom filter of its whole
# addresses, so that a source in none of them costs a packet one cache line.  An
# address is a key (IPv4: its 32 bits; IPv6: its two 64-bit halves folded, the
# second times SIEVE_MIX), the key times SIEVE_MULTIPLIER (mod 2^64) its hash, the
# hash's top bits choose a word (the shift: the program's alf_set_shifts, from the
# sieve's size), and the 14 bits at SIEVE_BIT1 and the 15 at SIEVE_BIT2, each modulo
# 62, two of its bits.  Bits 62 and 63 of every word say whether the trie may hold
# ranges of IPv4 and of IPv6 (SIEVE_RANGE_BITS).  Word 0 is user space's (sieve_header).
# What writes the sieve is alfwrapper/sets/bloom.py; its layout stays here, since the
# program's settings and Sets.bind are made from it.
# A program reads each sieve it names as a map of its own (bound at load: Sets.bind),
# not through an array of maps, so that the verifier inlines the lookup.
# Flags: BPF_F_RDONLY_PROG and BPF_F_MMAPABLE (user space reads it mapped, never
# writes it so: a program's read-only map cannot be).  A sieve made by an older
# alfwrapper also has BPF_F_INNER_MAP (SIEVE_OLDER_FLAGS), which still serves, a
# helper call a packet slower.
SIEVE_WORD = struct.Struct("=Q")
SIEVE_FLAGS = 1 << 7 | 1 << 10
SIEVE_OLDER_FLAGS = SIEVE_FLAGS | 1 << 12
SIEVE_MIX = 0xC2B2AE3D27D4EB4F
SIEVE_MULTIPLIER = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd: Fibonacci hashing
SIEVE_BIT1, SIEVE_BIT2 = 12, 26
SIEVE_RANGE_BITS = {4: 62, 6: 63}
# sets.c's array of maps of every set's ranges, by the role it holds, and the map it
# takes its shape from (alf_set_ranges: alf_set_range_shape); a set's sieve and its
# hosts_at are maps of the program's own instead (sieve_map, hosts_map), placeholders
# whose places Sets.bind's maps take as the program loads.
SET_ARRAYS = {"ranges": "alf_set_ranges"}
INNER_MAPS = {array: f"{array[:-1]}_shape" for array in SET_ARRAYS.values()} | {
    f"alf_set_hosts_{i}": "alf_set_host_shape" for i in range(MOST_SETS)
}


# Early drop (filters/early.c, sets/early.py): an XDP program's keys.  A port's key is
# a socket's family (4, 6), protocol, port (host order) and bound address (zeros: any);
# its value the bits of the program's sets that every socket there denies.  A local
# key is one of the host's addresses (pad zero).
EARLY_PORT_FIELDS = (("family", "u8"), ("proto", "u8"), ("port", "u16"), ("addr", "u8[16]"))
EARLY_PORT_C, EARLY_PORT = c_struct("alf_early_port", EARLY_PORT_FIELDS)
EARLY_LOCAL_FIELDS = (("family", "u8"), ("pad", "u8[3]"), ("addr", "u8[16]"))
EARLY_LOCAL_C, EARLY_LOCAL = c_struct("alf_early_local", EARLY_LOCAL_FIELDS)
EARLY_PORTS, EARLY_LOCAL_ADDRESSES = 4096, 4096  # the maps' room


def sieve_map(index: int) -> str:
    """The program's map that set number ``index``'s sieve is bound to (sets.c)."""
    return f"alf_set_sieve_{index}"


def hosts_map(index: int) -> str:
    """The program's map that set number ``index``'s hosts_at is bound to (sets.c)."""
    return f"alf_set_hosts_{index}"


def _sieve_maps_c(count: int) -> str:
    """sets.c's maps of each set: a placeholder for its sieve, of one word (the
    header, which no program reads: a program whose sieve was not bound finds no word
    and fails closed), and one for its hosts_at, an array of maps of one empty slot
    (not bound: no hosts map, and the set cannot be read); alf_set_sieve_word, the
    word at an index of set ``set``'s sieve, and alf_set_hosts_of, its hosts map in
    force.  BCC reads map syntax only as written out, not in a macro: hence C made
    here."""
    sieves, hosts = [sieve_map(i) for i in range(count)], [hosts_map(i) for i in range(count)]

    def switch(maps: list[str]) -> str:
        cases = "".join(
            f"    case {i}:\n        return {m}.lookup(index);\n" for i, m in enumerate(maps)
        )
        return f"    switch (set) {{\n{cases}    }}\n    return 0;\n}}\n"

    return (
        "".join(f'BPF_F_TABLE("array", u32, u64, {m}, 1, ALF_SIEVE_FLAGS);\n' for m in sieves)
        + "".join(f'BPF_ARRAY_OF_MAPS({m}, "alf_set_host_shape", 1);\n' for m in hosts)
        + "static __always_inline u64 *alf_set_sieve_word(u32 set, u32 *index)\n{\n"
        + switch(sieves)
        + "static __always_inline void *alf_set_hosts_of(u32 set, u32 *index)\n{\n"
        + switch(hosts)
    )


def sieve_shift(entries: int) -> int:
    """The shift to a word's index of a sieve of ``entries`` (a header word, then a
    power of two of them: sets/bloom.py's sieve_words); 0 for any other size
    (sets.open_role refuses such a sieve, and sets.c fails closed on 0)."""
    words = entries - 1
    if words < 2 or words & (words - 1):
        return 0
    return 64 - (words.bit_length() - 1)


class Sets(Part):
    """Named sets: the host's shared, live lists of prefixes (sets.c).

    Deny sets drop whatever else allows.  Allow sets add to the subnet rules' allow
    list: a source in one passes the subnet rules (unless they deny it), and where
    there are no allow rules, only the allow sets' entries pass.  A socket with allow
    sets, allow rules and deny rules at once is refused (SocketRules.sets_conflict).
    """

    name = "sets"
    reason = "subnets"
    source = "sets.c"
    condition = "(alf_set = sets_verdict(&pkt, alf_rt)) != ALF_SET_DENY"

    def used(self, rules: SocketRules, pins: Pins | None) -> bool:
        return bool(rules.allow_sets or rules.deny_sets)

    def plan(self, rules: SocketRules, pins: Pins | None) -> PartPlan:
        if rules.sets_conflict:  # refused where the policy is built (policy/files.py)
            raise AlfError(
                "named sets", "allow sets beside allow and deny rules", "report this", EX_SOFTWARE
            )
        if rules.too_many_sets:  # sets.c keeps a bit for each set in one word
            raise AlfError(
                "named sets",
                f"more than {MOST_SETS}, allow and deny together",
                "merge sets: one set may hold any number of prefixes",
                EX_USAGE,
            )
        allow_rules = bool(len(rules.subnets.allow))
        names = (*rules.deny_sets, *rules.allow_sets)
        defines = (
            ("ALF_SETS", str(len(names))),
            ("ALF_DENY_SETS", str(len(rules.deny_sets))),
            # With allow rules, an allow set's entry passes them; without, the sets
            # are the allow list, and the subnet rules (deny only) still judge.
            ("ALF_SET_MEMBER", "ALF_SET_ALLOW" if allow_rules else "0"),
            ("ALF_SET_OTHERS", "0" if allow_rules else "ALF_SET_DENY"),
            ("ALF_SET_FLAGS", str(SET_FLAGS)),
            ("ALF_SIEVE_FLAGS", str(SIEVE_FLAGS)),
            ("ALF_SIEVE_MIX", f"{SIEVE_MIX:#x}ULL"),
            ("ALF_SIEVE_MULTIPLIER", f"{SIEVE_MULTIPLIER:#x}ULL"),
            ("ALF_SIEVE_BIT1", str(SIEVE_BIT1)),
            ("ALF_SIEVE_BIT2", str(SIEVE_BIT2)),
            ("ALF_SIEVE_RANGE4", str(SIEVE_RANGE_BITS[4])),
            ("ALF_SIEVE_RANGE6", str(SIEVE_RANGE_BITS[6])),
        )
        return PartPlan(self, defines, SET_HOST_C + SET_RANGE_C + _sieve_maps_c(len(names)))

    def bind(
        self, tables: Tables, plan: PartPlan, rules: SocketRules, env: FillEnv
    ) -> dict[str, int]:
        """Each set's maps, opened once: its hosts and ranges into the program's arrays
        of maps, its shift into alf_set_shifts, and its sieve returned, to take its
        placeholder's place (sieve_map) as the program loads; deny sets, then allow
        sets.  What one open gave goes in together, so a set made again meanwhile is
        never read half old, half new."""
        bound: dict[str, int] = {}
        try:
            for index, name in enumerate((*rules.deny_sets, *rules.allow_sets)):
                self._bind_one(tables, index, name, env, bound)
        except BaseException:
            for fd in bound.values():
                os.close(fd)
            raise
        return bound

    @staticmethod
    def _bind_one(
        tables: Tables, index: int, name: str, env: FillEnv, bound: dict[str, int]
    ) -> None:
        fds: dict[str, int] = {}
        try:
            for role in SET_BOUND_ROLES:
                fds[role] = env.open_set(name, role)
            if not sieve_fits(fds["hosts_at"], fds["sieve"]):
                raise AlfError(
                    f"named set {name}",
                    "its sieve was made for other entries (the set was changed by an "
                    "older alfwrapper, or made again as this program was filled)",
                    f"run `alfwrapper set create {name}` as root, which rebuilds it, "
                    "then start again",
                    EX_CONFIG,
                )
            put_shift(tables["alf_set_shifts"].map_fd, index, fds["sieve"])
            for role, array in SET_ARRAYS.items():
                bpf_map_put_fd(tables[array].map_fd, index, fds[role])
            bound[sieve_map(index)] = fds.pop("sieve")
            bound[hosts_map(index)] = fds.pop("hosts_at")
        except OSError as err:
            raise AlfError(
                f"named set {name}",
                f"its maps do not fit this alfwrapper's filter ({err.strerror or err})",
                f"make it again: alfwrapper set destroy {name}, then set create",
                EX_SOFTWARE,
            ) from None
        finally:
            for fd in fds.values():
                os.close(fd)

    def why(self, rules: SocketRules, packet: Dropped) -> str:
        rules_too = " and matches no allow rule" if len(rules.subnets.allow) else ""
        return (
            f"{packet.addr} is in none of the allow sets ({', '.join(rules.allow_sets)}){rules_too}"
        )


class Subnets(Part):
    name = reason = "subnets"
    source = "subnets.c"
    condition = (
        "alf_rt == ALF_RUNTIME_ALLOW || alf_set == ALF_SET_ALLOW || "
        "subnets_pass(pkt.family, pkt.addr)"
    )

    def used(self, rules: SocketRules, pins: Pins | None) -> bool:
        return bool(rules.subnets.allow or rules.subnets.deny)

    def plan(self, rules: SocketRules, pins: Pins | None) -> PartPlan:
        name = table_cache.key(rules.subnets)
        image = None if name is None else table_cache.load(name)
        if image is not None:  # the rules as an earlier start built them: not read
            return PartPlan(self, image.defines, SUBNET_KEY_C, image)
        table = build_subnet_table(rules.subnets)

        defines = (
            ("V4_ROOT_BITS", str(table.v4.root_bits)),
            ("V4_LEAVES", str(max(1, table.v4.capacity))),
            ("V4_LEAF_BYTES", str(table.v4.leaf_bytes)),
            ("SUBNET_NODES", str(max(1, len(table.nodes)))),
            ("SUBNET_ROOT_SLOTS", str(ROOT_SLOTS)),
            ("SUBNET_PASS", str(NODE_PASS)),
            ("SUBNET_DESCEND", str(NODE_DESCEND)),
            ("V6_BUCKETS", str(max(1, table.bucket_rows))),
            (
                "V6_STEPS",
                " ".join(
                    [
                        f"SUBNET_PROBE({b.nbytes}, {b.offset}, {b.bits}, {b.multipliers[0]:#x}ULL, "
                        f"{b.multipliers[1]:#x}ULL)"
                        for b in table.bucket_levels
                    ]
                    + [f"SUBNET_STEP({n})" for n in table.levels]
                ),
            ),
        )
        kept = None if name is None else table_cache.Recorder(name)
        return PartPlan(self, defines, SUBNET_KEY_C, table, recorder=kept)

    def fill(self, tables: Tables, plan: PartPlan, rules: SocketRules, env: FillEnv) -> None:
        """Build the table into the maps (and keep what was written: table_cache.py),
        or write what an earlier start built."""
        if isinstance(plan.data, table_cache.Image):
            image: table_cache.Image = plan.data
            try:
                for map_name, offset, data in image.writes:
                    write_mapped_at(tables[map_name].map_fd, offset, data, map_name)
                for map_name, count, keys, values in image.batches:
                    update_batch(tables[map_name], bytes(keys), bytes(values), count, map_name)
            except (AlfError, ValueError, KeyError, TypeError) as err:
                table_cache.forget(image.name)
                raise AlfError(
                    f"the kept subnet table {image.name}",
                    f"does not fit the maps ({err})",
                    "start again: it is removed, and the table is built",
                    EX_SOFTWARE,
                ) from None
            return
        recorder: table_cache.Recorder | None = plan.recorder
        try:
            self._build(tables, plan.data, recorder)
        except BaseException:
            if recorder is not None:
                recorder.abandon()
            raise
        if recorder is not None:
            recorder.keep(plan.defines)

    def _build(self, tables: Tables, table: SubnetTable, kept: Any) -> None:
        maps = {
            "lines": ("subnet_v4", LINE_WORDS * 8),
            "leaves": ("subnet_leaves", table.v4.leaf_bytes),
        }

        def write(name: str, offset: int, data: bytes | memoryview) -> None:
            write_mapped_at(tables[name].map_fd, offset, data, name)
            if kept is not None:
                kept.write(name, offset, data)

        def batch(name: str, keys: bytes, values: bytes, count: int) -> None:
            update_batch(tables[name], keys, values, count, name)
            if kept is not None:
                kept.batch(name, count, keys, values)

        def write_v4(kind: str, first: int, rows: Any) -> None:
            name, row_bytes = maps[kind]
            write(name, first * row_bytes, rows.tobytes())

        table.v4.fill(write_v4)  # a window at a time, into the maps' own memory
        if table.bucket_rows:
            write("subnet_v6", 0, memoryview(table.buckets).cast("B"))
        # The maps are new (compiler.load_program fills them once) and hold zeros: only
        # the other roots are written; none, for IPv4 rules with no allow-all root.
        slots = list(compress(range(len(table.roots)), table.roots))
        if slots:
            roots = [table.roots[slot] for slot in slots]
            batch("subnet_roots", u32s(slots), u32s(roots), len(slots))
        if table.nodes:
            keys, values = encode_nodes(table, SUBNET_KEY)
            batch("subnet_nodes", keys, values, len(table.nodes))

    def why(self, rules: SocketRules, packet: Dropped) -> str:
        if packet.deny:
            return f"{packet.addr} matches deny {packet.deny}"
        return f"{packet.addr} matches no allow rule ({len(rules.subnets.allow)} allow rules)"


def knock_key(rules: SocketRules) -> str:
    """Names the knock state of sockets with these knock rules: same rules, same state
    (a socket's SPA socket's too: the one opens what the other reads).  Clients' own
    keys are left out: adding or revoking one closes no other client's door."""
    assert rules.knock is not None
    text = repr(as_tuple(replace(rules.knock, verifier=False, spa_keys=()))).encode()
    return f"knock-{cachedir.sha256(text).hexdigest()[:16]}"


# Single-packet authorization (spa.c, KNOCK_SPA; the datagram: policy/spa.py).
SPA_VERDICTS = ("accepted", "malformed", "bad_mac", "stale", "replayed", "busy")
SPA_SEEN = 65536  # knock_spa_seen's slots (a power of two): 512 KiB
# The datagrams one key may have taken in a window (knock_spa_quota): a slot stays live
# for at most four windows after its taking (a window ahead, the widest window, and two
# seconds), so one key, the shared secret's included, holds at most 4 * 64 = 256 slots,
# 0.4 % of the table: another key's datagram finds its slot busy 1 time in 256 at most.
SPA_QUOTA = 64
SPA_QUOTA_KEYS = 4 * 1024  # knock_spa_quota's entries (LRU), the service's keys
# The folder of the service's SPA replay table, beside its knock folders (and named as
# they are, for gc): one for all its SPA sockets, whatever their knock rules, so that a
# datagram is taken once by the service, whichever of its SPA sockets it reaches and
# whatever a reload changes.
SPA_TABLE = "knock-spa"


def knock_folders(rules: SocketRules) -> list[str]:
    """The folders of its service's pinned state that a socket with these rules uses:
    its knock state's, and an SPA socket's the service's replay table too."""
    if rules.knock is None:
        return []
    return [knock_key(rules), *([SPA_TABLE] if rules.knock.verifier else [])]


class Knocking(Part):
    name = reason = "knocking"
    source = "knocking.c"
    condition = "knock_pass(skb, &pkt)"
    ports = True

    def used(self, rules: SocketRules, pins: Pins | None) -> bool:
        return rules.knock is not None

    def plan(self, rules: SocketRules, pins: Pins | None) -> PartPlan:
        assert rules.knock is not None
        from alfwrapper.policy import knocking  # noqa: PLC0415  (a knocking start's alone)

        knock = knocking.plan_knock(rules.knock)
        mode = (2 if rules.knock.verifier else 1) if rules.knock.spa else 0
        defines: tuple[tuple[str, str], ...] = (
            ("KNOCK_ROWS", str(knock.rows)),
            ("KNOCK_SOURCES", str(rules.knock.sources)),
            ("KNOCK_SECRET", "1" if rules.knock.secret and not mode else "0"),
            ("KNOCK_MAX_STEPS", str(knocking.MAX_STEPS)),
            ("KNOCK_SPA", str(mode)),
        )
        if mode == 2:
            from alfwrapper.policy import spa  # noqa: PLC0415

            defines += (
                ("KNOCK_SPA_SEEN", str(SPA_SEEN)),
                ("KNOCK_SPA_BYTES", str(spa.DATAGRAM.size)),
                ("KNOCK_SPA_MAGIC1", f"{spa.MAGIC_WORDS[spa.SHARED]:#x}ULL"),
                ("KNOCK_SPA_MAGIC2", f"{spa.MAGIC_WORDS[spa.VERSION]:#x}ULL"),
                ("KNOCK_SPA_KEYS", str(len(spa.keys(rules.knock.secret, rules.knock.spa_keys)))),
                ("KNOCK_SPA_QUOTA", str(SPA_QUOTA)),
                ("KNOCK_SPA_QUOTA_KEYS", str(SPA_QUOTA_KEYS)),
                ("KNOCK_SPA_REASONS", str(len(SPA_VERDICTS))),
                *((f"KNOCK_SPA_{v.upper()}", str(i)) for i, v in enumerate(SPA_VERDICTS)),
            )
        pinned: tuple[tuple[str, str], ...] = ()
        if pins is not None:
            folder = f"{pins.service_dir}/{knock_key(rules)}"
            pinned = (("knock_state", f"{folder}/state"), ("knock_used", f"{folder}/used"))
            if mode == 2:  # what was seen outlives a restart, as what opened does
                table = f"{pins.service_dir}/{SPA_TABLE}"
                pinned += (
                    ("knock_spa_seen", f"{table}/spa_seen"),
                    ("knock_spa_since", f"{table}/spa_since"),
                    ("knock_spa_quota", f"{table}/spa_quota"),
                    ("knock_spa_counts", pins.path("spa")),
                )
        if mode == 2:  # the SPA socket: its verifier, which uses knocking.c's maps
            return PartPlan(
                self, defines, "", knock, pinned, more=("spa.c",), condition="knock_spa(skb, &pkt)"
            )
        return PartPlan(self, defines, "", knock, pinned)

    def fill(self, tables: Tables, plan: PartPlan, rules: SocketRules, env: FillEnv) -> None:
        assert rules.knock is not None
        from alfwrapper.policy import knocking  # noqa: PLC0415

        knock: knocking.KnockPlan = plan.data
        config = tables[b"knock_config"]
        leaf = config.Leaf()
        leaf.step_timeout_ns = int(rules.knock.timeout * 1e9)
        leaf.open_ns = int(rules.knock.open_for * 1e9)
        leaf.window_ns = rules.knock.window * 1_000_000_000
        leaf.tai_to_utc_ns = knocking.tai_to_utc_ns()
        leaf.first_window = knock.first_window
        leaf.steps = knock.steps
        leaf.rows = knock.rows
        if rules.knock.spa:
            leaf.spa_sender = int(rules.knock.spa_sender)
        if rules.knock.spa and rules.knock.verifier:
            from alfwrapper.policy import spa  # noqa: PLC0415

            if rules.knock.secret:  # version 1 datagrams are under it
                leaf.spa_shared = (1 << 32) | spa.key_id(rules.knock.secret)
            keys = tables[b"knock_spa_keys"]
            for ident, key in spa.keys(rules.knock.secret, rules.knock.spa_keys).items():
                words = keys.Leaf()
                words.k0, words.k1 = (int.from_bytes(key[i : i + 8], "little") for i in (0, 8))
                keys[keys.Key(ident)] = words
        config[config.Key(0)] = leaf
        if rules.knock.spa and rules.knock.verifier:
            pinned = dict(plan.pinned).get("knock_spa_since")
            with _spa_table_held(os.path.dirname(pinned) if pinned else None):
                _spa_table_takes(tables[b"knock_spa_since"], rules.knock.window)
        width = knocking.MAX_STEPS
        ports = [0] * (knock.rows * width)
        for row, sequence in enumerate(knock.ports):
            ports[row * width : row * width + len(sequence)] = sequence
        update_batch(
            tables[b"knock_ports"], u32s(range(len(ports))), u32s(ports), len(ports), "knock_ports"
        )

    def why(self, rules: SocketRules, packet: Dropped) -> str:
        if rules.knock and rules.knock.verifier:
            return "an SPA socket delivers nothing: a sound datagram opens, the rest is dropped"
        if rules.knock and rules.knock.spa:
            return f"{packet.addr} is not open: no sound SPA datagram opened it"
        return f"{packet.addr} has not knocked"


def _spa_table_takes(since: Table, window: int) -> None:
    """Before a program with this window can take a datagram (knock_spa_since: [0] since
    when the table takes datagrams, [1] the widest window, [2] when it was made).

    Slots stay live for the widest window of any program using the table: a datagram
    one takes must stay seen while another would take it.  A table made now (none kept
    from an earlier start) may follow one lost with its state, which may have taken
    datagrams sent up to its window ahead of their taking: none sent before a window,
    the widest, after the table was made is taken here."""
    made = since[since.Key(2)].value or time.time_ns()
    widest = max(since[since.Key(1)].value, window)
    began = max(since[since.Key(0)].value, made + widest * 1_000_000_000)
    since[since.Key(2)] = since.Leaf(made)
    since[since.Key(1)] = since.Leaf(widest)
    since[since.Key(0)] = since.Leaf(began)


@contextmanager
def _spa_table_held(folder: str | None) -> Iterator[None]:
    """flock(2) on the SPA table's folder while its knock_spa_since is read and raised:
    two starts or reloads at once must not lose one's raise (held for microseconds, so
    waited for; None: a table of the program's own, as explain's)."""
    if folder is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Filter(Part):
    """A developer's own filter; its verdict (a length to keep, or 0) is final."""

    name = reason = "filter"
    source = "developer.h"
    condition = ""  # composed specially: its return value is the program's
    ports = True  # a developer's filter may read them, and the transport offset

    def used(self, rules: SocketRules, pins: Pins | None) -> bool:
        return rules.custom is not None

    def plan(self, rules: SocketRules, pins: Pins | None) -> PartPlan:
        return PartPlan(self, (("ALF_L4_CB", str(L4_CB)),))

    def fill(self, tables: Tables, plan: PartPlan, rules: SocketRules, env: FillEnv) -> None:
        apply_settings(tables, rules, env.ifindex_of)

    def why(self, rules: SocketRules, packet: Dropped) -> str:
        return f"{rules.custom.path} returned 0" if rules.custom else "the filter returned 0"


PARTS: tuple[Part, ...] = (Interfaces(), Runtime(), Sets(), Subnets(), Knocking(), Filter())
# The part each drop counter stands for (Runtime's drops count as the subnets part's).
BY_REASON: dict[str, Part] = {p.reason: p for p in PARTS if p.name == p.reason}
SETS = next(p for p in PARTS if isinstance(p, Sets))


# -- filling maps ------------------------------------------------------------------


def update_batch(table: Table, keys: bytes, values: bytes, count: int, name: str) -> None:
    """Fill a map in one BPF_MAP_UPDATE_BATCH call (Linux 5.6) from packed arrays."""
    key_array = (table.Key * count).from_buffer_copy(keys)
    value_array = (table.Leaf * count).from_buffer_copy(values)
    try:
        table.items_update_batch(key_array, value_array)
    except Exception as err:  # noqa: BLE001  (BCC raises bare Exception)
        raise AlfError(
            f"filling map {name}",
            str(err),
            "check `alfwrapper doctor`; kernels before 5.6 lack batch updates",
            EX_OSERR,
        ) from None


def write_mapped_at(map_fd: int, offset: int, data: bytes | memoryview, name: str) -> None:
    """Write ``data`` at byte ``offset`` of an mmapable array (BPF_F_MMAPABLE, Linux
    5.5): no syscall per entry.  Only the pages written are mapped, and only while
    they are written, so a big table never counts whole in this process's memory.
    The array's elements are 8-byte aligned, and so must ``data`` be."""
    if not len(data):
        return
    start = offset - offset % mmap.PAGESIZE
    try:
        with mmap.mmap(
            map_fd,
            offset - start + len(data),
            mmap.MAP_SHARED,
            mmap.PROT_READ | mmap.PROT_WRITE,
            offset=start,
        ) as region:
            region[offset - start :] = data
    except (OSError, ValueError) as err:
        raise AlfError(
            f"filling map {name}",
            str(err),
            "check `alfwrapper doctor` (Linux 5.5 or later)",
            EX_OSERR,
        ) from None


def sieve_header(sieve_fd: int) -> tuple[int, int]:
    """A sieve's word 0, which no program reads: the id of the set's hosts_at it was
    built for (the set it belongs to: a hosts map grown keeps its sieve), and how many
    entries were removed since (sets/content.py)."""
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    raw = bpf_calls.map_lookup(sieve_fd, bytes(4), 8) or bytes(8)
    return int.from_bytes(raw[:4], "little"), int.from_bytes(raw[4:], "little")


def sieve_fits(hosts_at_fd: int, sieve_fd: int) -> bool:
    """Whether a sieve was built for this set (its hosts_at): one made for another (an
    older alfwrapper destroyed and made the set again) lacks bits."""
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    return sieve_header(sieve_fd)[0] == bpf_calls.map_info_id(hosts_at_fd)


def put_shift(shifts_fd: int, index: int, sieve_fd: int) -> None:
    """A set's sieve's shift (sieve_shift, from its size) into a program's
    alf_set_shifts."""
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    shift = sieve_shift(bpf_calls.map_shape(sieve_fd)[3])
    bpf_calls.map_update(shifts_fd, struct.pack("=I", index), struct.pack("=Q", shift))


def bpf_map_put_fd(outer_fd: int, index: int, inner_fd: int) -> None:
    """Put a map in slot ``index`` of an array of maps (OSError if it does not fit)."""
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    bpf_calls.map_update(outer_fd, u32s([index]), u32s([inner_fd]))


def u32s(values: Sequence[int]) -> bytes:
    return array("I", values).tobytes()  # u32s in the host's order, as the maps hold them


def set_interfaces(tables: Tables, allowed: dict[int, str]) -> None:
    """Make iface_allowed hold exactly these indexes (new ones first, then removals), and
    hold them current until the watcher takes over renewing the lease (interfaces.c)."""
    from alfwrapper.host.interfaces import START_LEASE_NS, renew_lease  # noqa: PLC0415

    renew_lease(tables[b"iface_lease"].map_fd, START_LEASE_NS)
    table = tables[b"iface_allowed"]
    for index in allowed:
        table[table.Key(index)] = table.Leaf(1)
    for key in [k.value for k in table.keys()]:
        if key not in allowed:
            del table[table.Key(key)]


def apply_settings(tables: Tables, rules: SocketRules, ifindex_of: map_values.IfindexOf) -> None:
    """--set: each entry parsed by its map's own key and value types."""
    custom = rules.custom
    if custom is None:
        return
    for setting in custom.sets:
        where = f"--set {setting.map}"
        table = None
        if not setting.map.startswith(RESERVED_PREFIXES):
            try:
                table = tables[setting.map.encode()]
            except KeyError:
                pass
        if table is None:
            known = ", ".join(map_names(custom.path)) or "none"
            raise AlfError(
                where, f"{custom.path} has no map {setting.map!r}", f"its maps: {known}", EX_USAGE
            )
        parsed = []
        for what, ctype, text in (
            ("key", table.Key, setting.key),
            ("value", table.Leaf, setting.value),
        ):
            try:
                parsed.append(ctype.from_buffer_copy(map_values.encode(ctype, text, ifindex_of)))
            except ValueError as err:
                raise AlfError(
                    where,
                    f"{what} {excerpt(text)} does not fit {map_values.type_name(ctype)}: {err}",
                    "write the fields comma-separated, in order",
                    EX_USAGE,
                ) from None
        try:
            table[parsed[0]] = parsed[1]
        except Exception as err:  # noqa: BLE001  (BCC raises bare Exception)
            raise AlfError(
                where,
                f"the kernel refused the entry: {err}",
                "is the map full, or an array index out of range?",
                EX_USAGE,
            ) from None


# A BCC map declaration: BPF_TABLE("type", key, leaf, NAME, ...) and its F_ and _PINNED
# forms, or a shorthand such as BPF_HASH(NAME, ...).
_MAP_DECL = re.compile(
    r"\bBPF_(?:(?:F_)?TABLE(?:_PINNED)?\(\s*\"\w+\"\s*,[^,]+,[^,]+,\s*(\w+)"
    r"|(?!(?:F_)?TABLE)[A-Z_]+\(\s*(\w+))"
)


def declared_maps(text: str) -> list[tuple[str, int]]:
    """The maps a filter's text declares, with the line of each."""
    return [
        (m.group(1) or m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in _MAP_DECL.finditer(text)
    ]


def map_names(path: str) -> list[str]:
    """The maps a filter file declares, for error messages."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return []
    return [name for name, _ in declared_maps(text)]
