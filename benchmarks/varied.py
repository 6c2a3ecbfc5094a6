"""Varied sources, measured in the kernel: the cost of a lookup when every packet comes
from a different address, as in a flood or on a busy public service.

One BPF_PROG_TEST_RUN call runs a program `repeat` times; each run takes the next
source address from an array (a per-CPU counter walks it), so no system call sits
between packets and each run looks up a different source.  Measured side by side, with
the same sources: the floor (the same walk, no lookup), alfwrapper's subnet lookup (the
real filter's code and maps, filled as the wrapper fills them), a plain BPF LPM trie,
and a pointer chase over as much memory as alfwrapper's maps take (one dependent cache
miss per run: the memory-latency limit for that working set).

    python benchmarks/varied.py [--smoke]      (as root; bench.py runs it too)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ["ALFWRAPPER_CACHE"] = "off"  # its extra functions are loaded through BCC's own module

from alfwrapper.bpf import compiler, program  # noqa: E402
from alfwrapper.host import bpf_calls  # noqa: E402
from alfwrapper.host.bpf_calls import prog_test_run  # noqa: E402
from alfwrapper.host.frames import udp_frame  # noqa: E402
from alfwrapper.policy.prefixes import Prefix  # noqa: E402
from alfwrapper.policy.rules import SocketRules, SubnetRules  # noqa: E402
from alfwrapper.record import replace  # noqa: E402

# The source walk, shared by every program measured here.
WALK = r"""
struct bench_source {
    u32 family;
    u8 addr[16];
};
BPF_ARRAY(bench_sources, struct bench_source, BENCH_SOURCES);
BPF_PERCPU_ARRAY(bench_next, u32, 1);

static __always_inline struct bench_source *bench_source(void)
{
    u32 zero = 0;
    u32 *next = bench_next.lookup(&zero);
    if (!next)
        return 0;
    u32 i = *next & (BENCH_SOURCES - 1);
    *next = i + 1;
    return bench_sources.lookup(&i);
}

int bench_floor(struct __sk_buff *skb)
{
    struct bench_source *s = bench_source();
    return s ? 1 + s->addr[15] : 0;
}
"""

OURS = r"""
int bench_lookup(struct __sk_buff *skb)
{
    struct bench_source *s = bench_source();
    return s ? subnets_pass(s->family, s->addr) : 0;
}
"""

LPM = r"""
#include "common.h"
struct lpm_key4 {
    u32 prefixlen;
    u8 addr[4];
};
struct lpm_key6 {
    u32 prefixlen;
    u8 addr[16];
};
BPF_LPM_TRIE(lpm4, struct lpm_key4, u32, LPM_SIZE);
BPF_LPM_TRIE(lpm6, struct lpm_key6, u32, LPM_SIZE);

int bench_lookup(struct __sk_buff *skb)
{
    struct bench_source *s = bench_source();
    if (!s)
        return 0;
    if (s->family == 4) {
        struct lpm_key4 key = {.prefixlen = 32};
        __builtin_memcpy(key.addr, s->addr, 4);
        return lpm4.lookup(&key) ? 1 : 0;
    }
    struct lpm_key6 key = {.prefixlen = 128};
    __builtin_memcpy(key.addr, s->addr, 16);
    return lpm6.lookup(&key) ? 1 : 0;
}
"""

# One cache line per element; the elements form one random cycle (Sattolo's algorithm),
# so each run's read depends on the last and nothing can be prefetched.
CHASE = r"""
struct chase_line {
    u32 next;
    u32 pad[15];
};
BPF_ARRAY(chase, struct chase_line, CHASE_LINES);
BPF_PERCPU_ARRAY(chase_at, u32, 1);

int bench_lookup(struct __sk_buff *skb)
{
    u32 zero = 0;
    u32 *at = chase_at.lookup(&zero);
    if (!at)
        return 0;
    struct chase_line *line = chase.lookup(at);
    if (!line)
        return 0;
    *at = line->next;
    return 1;
}
"""


@dataclasses.dataclass
class Row:
    family: int
    rules: int
    floor: float  # ns per run: the walk alone
    ours: float
    lpm: float
    chase: float  # one dependent miss over ours_memory bytes
    ours_memory: int
    lpm_memory: int


def rule_set(family: int, count: int, rng: random.Random) -> list[Prefix]:
    """IPv4: half /24, half /32 (the issue's mix); IPv6: /64s in 2001:db8::/32."""
    found: dict[tuple[int, int], Prefix] = {}
    while len(found) < count:
        if family == 4:
            value = rng.getrandbits(32)
            if value >> 24 in (0, 127) or value >> 28 >= 14:
                continue
            length = 24 if len(found) % 2 else 32
            value = value >> (32 - length) << (32 - length)
        else:
            value, length = (0x20010DB8 << 96) | (rng.getrandbits(32) << 64), 64
        found[(value, length)] = Prefix(family, value, length)
    return list(found.values())


def sources(prefixes: list[Prefix], count: int, rng: random.Random) -> list[tuple[int, int]]:
    """count (family, address) pairs, each inside a rule picked at random."""
    out = []
    for _ in range(count):
        p = prefixes[rng.randrange(len(prefixes))]
        width = 32 if p.family == 4 else 128
        out.append((p.family, p.value | rng.getrandbits(width - p.length)))
    return out


def fill_sources(bpf: Any, walk: list[tuple[int, int]]) -> None:
    table = bpf[b"bench_sources"]
    chunk = 1 << 16
    for start in range(0, len(walk), chunk):
        part = walk[start : start + chunk]
        keys = (table.Key * len(part))(*range(start, start + len(part)))
        leaves = (table.Leaf * len(part))()
        for leaf, (family, address) in zip(leaves, part, strict=True):
            leaf.family = family
            raw = address.to_bytes(4 if family == 4 else 16, "big")
            for j, byte in enumerate(raw):
                leaf.addr[j] = byte
        table.items_update_batch(keys, leaves)


def load_text(
    text: str, defines: tuple[tuple[str, str], ...] = (), entry: str = program.ENTRY
) -> compiler.LoadedFilter:
    """Compile and load C of our own (no rules), with the filters' headers at hand."""
    plan = program.ProgramPlan(
        rules=SocketRules(),
        text=text,
        defines=defines,
        include_dirs=(str(program.filter_dir()),),
        parts=(),
        entry=entry,
    )
    return compiler.compile_and_load(plan)


def map_memory(loaded: compiler.LoadedFilter, prefix: str) -> int:
    """Kernel memory charged to the program's maps whose names start with ``prefix``
    (memlock in /proc/self/fdinfo)."""
    maps = loaded.tables.fds()
    return sum(bpf_calls.fd_memlock(fd) for name, fd in maps.items() if name.startswith(prefix))


def chase_program(memory: int, rng: random.Random) -> compiler.LoadedFilter:
    """The pointer chase over at least ``memory`` bytes: one dependent miss a run."""
    lines = 1 << max(10, (memory // 64 - 1).bit_length())  # a power of two at least
    chase = load_text(CHASE, (("CHASE_LINES", str(lines)),), "bench_lookup")
    order = list(range(lines))
    for i in range(lines - 1, 0, -1):  # Sattolo: one cycle through every line
        j = rng.randrange(i)
        order[i], order[j] = order[j], order[i]
    cycle = chase.tables[b"chase"]
    chunk = min(lines, 1 << 16)  # both powers of two
    for start in range(0, lines, chunk):
        keys = (cycle.Key * chunk)(*range(start, start + chunk))
        lines_out = (cycle.Leaf * chunk)()
        for k in range(chunk):
            lines_out[k].next = order[start + k]
        cycle.items_update_batch(keys, lines_out)
    return chase


def run_cost(fd: int, repeat: int, rounds: int) -> float:
    frame = udp_frame(4, 0xC0000202)  # not read: the source comes from the walk
    return statistics.median(prog_test_run(fd, frame, repeat).duration_ns for _ in range(rounds))


def measure(family: int, count: int, walk_size: int, repeat: int, rounds: int) -> Row:
    rng = random.Random(count * 10 + family)
    prefixes = rule_set(family, count, rng)
    walk = sources(prefixes, walk_size, rng)
    walk_define = (("BENCH_SOURCES", str(walk_size)),)

    plan = program.plan_program(SocketRules(subnets=SubnetRules(allow=tuple(prefixes))))
    plan = replace(plan, text=plan.text + WALK + OURS, defines=plan.defines + walk_define)
    ours = compiler.load_program(plan)
    fill_sources(ours.tables, walk)
    from bcc import BPF  # noqa: PLC0415

    lookup = ours.tables.owner.keep.load_func(b"bench_lookup", BPF.SOCKET_FILTER)
    floor = ours.tables.owner.keep.load_func(b"bench_floor", BPF.SOCKET_FILTER)
    # Every source is inside a rule: every run must pass, the last included.
    assert prog_test_run(lookup.fd, udp_frame(4, 0), walk_size).retval == 1
    ours_memory = map_memory(ours, "subnet_")

    lpm = load_text(WALK + LPM, (("LPM_SIZE", str(count)), *walk_define), "bench_lookup")
    fill_sources(lpm.tables, walk)
    table = lpm.tables[b"lpm4" if family == 4 else b"lpm6"]
    keys = (table.Key * count)()
    for key, p in zip(keys, prefixes, strict=True):
        key.prefixlen = p.length
        for j, byte in enumerate(p.value.to_bytes(4 if family == 4 else 16, "big")):
            key.addr[j] = byte
    leaves = (table.Leaf * count)(*([1] * count))
    table.items_update_batch(keys, leaves)
    assert prog_test_run(lpm.fd, udp_frame(4, 0), walk_size).retval == 1
    lpm_memory = map_memory(lpm, "lpm4" if family == 4 else "lpm6")

    chase = chase_program(ours_memory, rng)

    figures: dict[str, list[float]] = {"floor": [], "ours": [], "lpm": [], "chase": []}
    for _ in range(rounds):  # interleaved, so that drift hits all alike
        figures["floor"].append(run_cost(floor.fd, repeat, 1))
        figures["ours"].append(run_cost(lookup.fd, repeat, 1))
        figures["lpm"].append(run_cost(lpm.fd, repeat, 1))
        figures["chase"].append(run_cost(chase.fd, repeat, 1))
    m = {k: statistics.median(v) for k, v in figures.items()}
    return Row(family, count, m["floor"], m["ours"], m["lpm"], m["chase"], ours_memory, lpm_memory)


def run(smoke: bool) -> list[Row]:
    sizes = [100] if smoke else [1_000, 1_000_000]
    walk_size = 1 << (10 if smoke else 20)
    repeat = 1 << (12 if smoke else 20)
    rounds = 2 if smoke else 5
    return [measure(f, n, walk_size, repeat, rounds) for f in (4, 6) for n in sizes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, figures meaningless")
    args = parser.parse_args()
    print("family rules  floor  alfwrapper  LPM-trie  chase  (ns per packet)  maps")
    for r in run(args.smoke):
        maps = f"{r.ours_memory / 2**20:.1f} / {r.lpm_memory / 2**20:.1f} MiB"
        print(
            f"IPv{r.family} {r.rules:>9,} {r.floor:6.0f} {r.ours:10.0f} {r.lpm:9.0f} "
            f"{r.chase:6.0f}  {maps}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
