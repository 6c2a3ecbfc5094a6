"""Named sets and the CrowdSec bouncer, measured: what sharing one set saves, what a
set costs a packet, and how fast changes go in.

- memory: one set of a million entries (half IPv4 /32, half IPv6 /128) named by 1
  and by 50 services' programs: the kernel memory of the set's maps plus every
  program's own maps (fdinfo memlock), beside one service holding the same
  million as its own deny rules;
- per packet, varied sources walked in the kernel (varied.py's walk): a service's
  own rules (a million, varied.py's mix) alone, and with two deny sets of a
  million entries each, side by side with the walk alone and a pointer chase over
  the same memory (one dependent cache miss), in 61 rounds of 65,536 packets each,
  the extra cost taken in each round's misses, then its median;
- the bouncer: 100,000 decisions (90% IPv4, 10% IPv6 addresses) applied from the
  moment the LAPI's answer has arrived (a startup answer on an empty set, then a
  delta answer of as many new ones, then a delta of SMALL_DELTA more, which costs
  what it changes and not what the book holds), timed as the bouncer times itself
  (Counters.apply_seconds: until the set holds them), in a process of its own as
  the bouncer's unit runs it (not in this one, which has just held a million-entry
  set's worth of objects), five times: the median, and the least and most;
- one `set add` of one address (the update, not the command's start).

    python benchmarks/named_sets.py [--smoke] [--json]      (as root; bench.py runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ["ALFWRAPPER_CACHE"] = "off"

import varied  # noqa: E402

from alfwrapper import sets  # noqa: E402
from alfwrapper.bpf import compiler, program  # noqa: E402
from alfwrapper.bpf.parts import SET_ROLES, FillEnv  # noqa: E402
from alfwrapper.host import bpf_calls  # noqa: E402
from alfwrapper.host.bpf_calls import prog_test_run  # noqa: E402
from alfwrapper.host.frames import udp_frame  # noqa: E402
from alfwrapper.lifecycle import bouncer  # noqa: E402
from alfwrapper.policy.crowdsec import Book  # noqa: E402
from alfwrapper.policy.prefixes import Prefix  # noqa: E402
from alfwrapper.policy.rules import SocketRules, SubnetRules  # noqa: E402
from alfwrapper.record import replace  # noqa: E402
from alfwrapper.sets import content  # noqa: E402

ENV = FillEnv(open_set=sets.open_role)

# The walk's packet through the sets part and the subnet part, as the composed
# program runs them (program.py), for varied sources.
WITH_SETS = r"""
int bench_lookup(struct __sk_buff *skb)
{
    struct bench_source *s = bench_source();
    if (!s)
        return 0;
    struct alf_packet pkt = {};
    pkt.family = s->family;
    __builtin_memcpy(pkt.addr, s->addr, 16);
    if (sets_verdict(&pkt, 0) == ALF_SET_DENY)
        return 0;
    return subnets_pass(s->family, s->addr);
}
"""


def addresses(count: int, rng: random.Random, v6_share: float) -> list[Prefix]:
    found: set[Prefix] = set()
    while len(found) < count:
        if rng.random() < v6_share:
            found.add(Prefix(6, (0x20010DB8 << 96) | rng.getrandbits(96), 128))
        else:
            value = rng.getrandbits(32)
            if value >> 24 not in (0, 127) and value >> 28 < 14:
                found.add(Prefix(4, value, 32))
    return list(found)


def fresh_set(name: str, entries: list[Prefix], size: int) -> None:
    sets.destroy(name)
    sets.create(name, (), size)
    sets.hold(name, dict.fromkeys(entries, 0))


def set_memory(name: str) -> int:
    total = 0
    for role in SET_ROLES:  # the sieve too
        fd = sets.open_role(name, role)
        try:
            total += bpf_calls.fd_memlock(fd)
        finally:
            os.close(fd)
    return total


def own_maps(loaded: compiler.LoadedFilter) -> int:
    return sum(bpf_calls.fd_memlock(fd) for fd in loaded.tables.fds().values())


def memory(count: int, services: int, rng: random.Random) -> dict[str, Any]:
    name = "bench-shared"
    fresh_set(name, addresses(count, rng, 0.5), max(count, 1024))
    rules = SocketRules(deny_sets=(name,))
    loaded = [compiler.load_program(program.plan_program(rules), ENV) for _ in range(services)]
    shared = set_memory(name)
    one = shared + own_maps(loaded[0])
    many = shared + sum(own_maps(x) for x in loaded)
    copies = SocketRules(subnets=SubnetRules(deny=addresses(count, random.Random(9), 0.5)))
    copy = compiler.load_program(program.plan_program(copies))
    per_service_copy = own_maps(copy)
    del loaded, copy
    sets.destroy(name)
    return {"entries": count, "services": services, "set": shared, "one": one, "many": many,
            "copy_each": per_service_copy}  # fmt: skip


def per_packet(count: int, walk_size: int, repeat: int, rounds: int) -> list[dict[str, Any]]:
    from bcc import BPF  # noqa: PLC0415

    out = []
    rng = random.Random(27)
    names = ("bench-a", "bench-b")
    for index, name in enumerate(names):  # two deny sets, the sources in neither
        fresh_set(name, addresses(count, random.Random(index), 0.5), count)
    for family in (4, 6):
        prefixes = varied.rule_set(family, count, rng)
        walk = varied.sources(prefixes, walk_size, rng)
        define = (("BENCH_SOURCES", str(walk_size)),)
        figures: dict[str, int] = {}  # each program's fd
        loaded = {}
        for label, rules, body in (
            ("own", SocketRules(subnets=SubnetRules(allow=tuple(prefixes))), varied.OURS),
            (
                "sets",
                SocketRules(subnets=SubnetRules(allow=tuple(prefixes)), deny_sets=names),
                WITH_SETS,
            ),
        ):
            plan = program.plan_program(rules)
            # bench_lookup loaded as the program's entry, so that the sets are bound
            # into it as into a service's (compiler.bind_parts).
            plan = replace(
                plan,
                text=plan.text + varied.WALK + body,
                defines=plan.defines + define,
                entry="bench_lookup",
            )
            lf = compiler.load_program(plan, ENV)
            varied.fill_sources(lf.tables, walk)
            loaded[label] = lf
            figures[label] = lf.fd
            assert prog_test_run(lf.fd, udp_frame(4, 0), walk_size).retval == 1
        keep = loaded["own"].tables.owner.keep  # BCC's module: the walk alone, no sets
        figures["floor"] = keep.load_func(b"bench_floor", BPF.SOCKET_FILTER).fd
        memory_bytes = own_maps(loaded["own"]) + sum(set_memory(n) for n in names)
        chase = varied.chase_program(memory_bytes, rng)
        taken: dict[str, list[float]] = {"floor": [], "own": [], "sets": [], "chase": []}
        for _ in range(rounds):  # interleaved
            for label in ("floor", "own", "sets"):
                taken[label].append(varied.run_cost(figures[label], repeat, 1))
            taken["chase"].append(varied.run_cost(chase.fd, repeat, 1))
        m = {k: statistics.median(v) for k, v in taken.items()}
        # Each round's extra cost in that round's misses: the machine's memory latency
        # drifts by half within a run (the chase seen at 278 and at 482 ns), so a
        # difference is taken between runs a few milliseconds apart, then the median.
        extra = [
            (taken["sets"][r] - taken["own"][r]) / (taken["chase"][r] - taken["floor"][r])
            for r in range(rounds)
        ]
        out.append({"family": family, "rules": count, "set_entries": count, **m,
                    "extra_misses": statistics.median(extra), "rounds": rounds,
                    "repeat": repeat})  # fmt: skip
        del loaded, figures, chase
    for name in names:
        sets.destroy(name)
    return out


class _Answer:
    """requests' streamed response, holding a body that has already arrived."""

    status_code = 200

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __enter__(self) -> _Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def iter_content(self, size: int) -> list[bytes]:
        return [self.body]


class _Session:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def get(self, *args: object, **kwargs: object) -> _Answer:
        return _Answer(self.body)


def decisions(pool: list[Prefix], first_id: int, rng: random.Random) -> bytes:
    new = [
        {"id": first_id + i, "origin": "crowdsec", "type": "ban",
         "scope": "Ip", "value": str(p).split("/")[0],
         "duration": f"{rng.randrange(3600, 86400)}h{rng.randrange(60)}m1.123456789s",
         "scenario": "crowdsecurity/ssh-bf"}
        for i, p in enumerate(pool)
    ]  # fmt: skip
    return json.dumps({"new": new, "deleted": None}).encode()


SMALL_DELTA = 10


def bouncer_apply(count: int) -> dict[str, Any]:
    name = "bench-crowdsec"
    sets.destroy(name)
    sets.create(name, (), 1 << 20)
    config = bouncer.Config(set=name, interval=1)
    book, counts = Book.empty(), bouncer.Counters()
    rng = random.Random(76)
    pool = addresses(2 * count + SMALL_DELTA, rng, 0.1)  # three answers, no address in two
    startup, delta = (
        decisions(pool[:count], 1, rng),
        decisions(pool[count:-SMALL_DELTA], count + 1, rng),
    )
    small = decisions(pool[-SMALL_DELTA:], 2 * count + 1, rng)
    sets.load_bulk()  # as bouncer.run does, before its first poll
    took = []
    for answer, synced in ((startup, False), (delta, True), (small, True)):
        bouncer.poll_once(_Session(answer), config, book, synced, counts)  # type: ignore[arg-type]
        took.append(counts.apply_seconds)
    held = len(sets.entries(name))
    sets.destroy(name)
    assert held == 2 * count + SMALL_DELTA, held
    return {
        "decisions": count,
        "startup_seconds": took[0],
        "delta_seconds": took[1],
        "small_delta_seconds": took[2],
        "answer_bytes": len(startup),
    }


def growth(count: int) -> dict[str, Any]:
    """A bouncer's first answer of ``count`` Ip bans (the set made at its default size,
    as `crowdsec --prepare` makes it), which grows the set as it goes (each growth,
    content._grow, timed here), then an answer of one ban more: the time from each
    answer's arrival until the set holds its entries, and the growths'."""
    name = "bench-grow"
    sets.destroy(name)
    sets.create(name)
    grows: list[float] = []
    real = content._grow

    def timed(*args: Any) -> None:
        start = time.perf_counter()
        real(*args)
        grows.append(time.perf_counter() - start)

    content._grow = timed  # type: ignore[assignment]
    try:
        config = bouncer.Config(set=name, interval=1)
        book, counts = Book.empty(), bouncer.Counters()
        rng = random.Random(78)
        pool = addresses(count + 1, rng, 0.1)
        sets.load_bulk()
        first = decisions(pool[:count], 1, rng)
        bouncer.poll_once(_Session(first), config, book, False, counts)  # type: ignore[arg-type]
        applied = counts.apply_seconds
        one = decisions(pool[count:], count + 1, rng)
        bouncer.poll_once(_Session(one), config, book, True, counts)  # type: ignore[arg-type]
        held = len(sets.entries(name))
        fd = sets.open_role(name, "hosts")
        try:
            room = bpf_calls.map_shape(fd)[3]
        finally:
            os.close(fd)
    finally:
        content._grow = real  # type: ignore[assignment]
        sets.destroy(name)
    assert held == count + 1, held
    return {"bans": count, "apply_seconds": applied, "one_more_seconds": counts.apply_seconds,
            "grows": len(grows), "grow_seconds": sum(grows), "last_grow_seconds": grows[-1],
            "room": room}  # fmt: skip


def bouncer_runs(count: int, runs: int) -> dict[str, Any]:
    """bouncer_apply in ``runs`` processes of its own, one after another."""
    import subprocess  # noqa: PLC0415

    got = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, __file__, "--bouncer", str(count)],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        got.append(json.loads(out.stdout))
    result: dict[str, Any] = {
        "decisions": count,
        "runs": runs,
        "answer_bytes": got[0]["answer_bytes"],
        "small_delta": SMALL_DELTA,
    }
    for key in ("startup_seconds", "delta_seconds", "small_delta_seconds"):
        values = sorted(g[key] for g in got)
        result[key] = statistics.median(values)
        result[key.replace("seconds", "range")] = [values[0], values[-1]]
    return result


def one_add(rounds: int) -> dict[str, float]:
    name = "bench-add"
    sets.destroy(name)
    sets.create(name)
    rng = random.Random(1)
    times, raw = [], []
    for prefix in addresses(rounds, rng, 0.5):
        start = time.perf_counter()
        sets.add(name, [prefix])
        times.append(time.perf_counter() - start)
    fd = sets.open_role(name, "hosts")
    try:
        for prefix in addresses(rounds, random.Random(2), 0.5):
            key = content._key(prefix)[1]
            start = time.perf_counter()
            bpf_calls.map_update(fd, key, b"\0" * 8)
            raw.append(time.perf_counter() - start)
    finally:
        os.close(fd)
    sets.destroy(name)
    return {"add_ms": statistics.median(times) * 1e3, "map_update_ms": statistics.median(raw) * 1e3}


def run(smoke: bool) -> dict[str, Any]:
    count = 1000 if smoke else 1_000_000
    return {
        "memory": memory(count, 3 if smoke else 50, random.Random(5)),
        "per_packet": per_packet(
            count, 1 << (10 if smoke else 20), 1 << (12 if smoke else 16), 2 if smoke else 61
        ),
        "bouncer": bouncer_runs(1000 if smoke else 100_000, 3 if smoke else 5),
        "add": one_add(100 if smoke else 1000),
        "growth": growth(100_000 if smoke else 1_000_000),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, figures meaningless")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--bouncer",
        type=int,
        metavar="N",
        help="only the bouncer's N decisions, as JSON (bouncer_runs)",
    )
    args = parser.parse_args()
    if args.bouncer:
        print(json.dumps(bouncer_apply(args.bouncer)))
        return 0
    result = run(args.smoke)
    if args.json:
        print(json.dumps(result))
        return 0
    m = result["memory"]
    mib = {k: m[k] / 2**20 for k in ("set", "one", "many", "copy_each")}
    print(
        f"one set of {m['entries']:,}: {mib['set']:.1f} MiB; with 1 service "
        f"{mib['one']:.1f} MiB, with {m['services']} {mib['many']:.1f} MiB "
        f"({m['many'] / m['one']:.2f}x); a copy each {mib['copy_each']:.1f} MiB"
    )
    for row in result["per_packet"]:
        print(
            f"IPv{row['family']}: floor {row['floor']:.0f}, own rules {row['own']:.0f}, "
            f"+2 sets {row['sets']:.0f}, chase {row['chase']:.0f} ns: "
            f"{row['extra_misses']:.2f} extra misses"
        )
    b = result["bouncer"]
    low, high = b["startup_range"]
    print(
        f"{b['decisions']:,} decisions, median of {b['runs']}: startup "
        f"{b['startup_seconds']:.3f} s ({low:.3f}-{high:.3f}), ",
        end="",
    )
    low, high = b["delta_range"]
    print(f"delta {b['delta_seconds']:.3f} s ({low:.3f}-{high:.3f}); ", end="")
    low, high = b["small_delta_range"]
    print(
        f"then {SMALL_DELTA} more: {b['small_delta_seconds'] * 1e3:.1f} ms "
        f"({low * 1e3:.1f}-{high * 1e3:.1f})"
    )
    a = result["add"]
    print(f"one set add: {a['add_ms']:.3f} ms (map update {a['map_update_ms']:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
