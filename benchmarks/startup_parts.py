"""Where the start-up time and memory of a big rule file go, stage by stage.

    startup_parts.py [RULES] [--json]

Writes RULES (default 1,000,000) IPv4 rules (half /24, half /32, as `make
bench` does) to a file (from a child process), then, in this process, times
each stage of the wrapper's start-up on it and the peak RSS after each:
parsing the options and the file into the policy, planning the program
(which lays out the lookup tables), compiling and loading it with BCC, and
building the tables into its maps.  One size per run, so that peaks do not
mix.  Needs root (BCC).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ["ALFWRAPPER_CACHE"] = "off"  # the stages of a compiling start

from bench import rule_set  # noqa: E402

from alfwrapper.bpf import compiler, program  # noqa: E402
from alfwrapper.bpf.parts import FillEnv  # noqa: E402
from alfwrapper.cli.wrapper import parse_policy  # noqa: E402


def peak_mib() -> float:
    """This process's peak RSS (VmHWM: its own memory's, unlike ru_maxrss, which also
    counts what the parent held when it forked us)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stages(path: Path) -> list[tuple[str, float, float]]:
    out = []
    begin = time.monotonic()
    policy = parse_policy(["--listen", "127.0.0.1:9", "--allow-file", str(path), "--", "true"])
    rules = policy.rules_for(policy.listens[0].name)
    out.append(("parse the options and the file", time.monotonic() - begin, peak_mib()))
    begin = time.monotonic()
    plan = program.plan_program(rules)  # the subnet part resolves the rules into tables
    out.append(("plan: lay out the lookup tables", time.monotonic() - begin, peak_mib()))
    begin = time.monotonic()
    loaded = compiler.compile_and_load(plan)
    out.append(("compile and load (BCC)", time.monotonic() - begin, peak_mib()))
    begin = time.monotonic()
    for part_plan in plan.parts:
        part_plan.part.fill(loaded.tables, part_plan, plan.rules, FillEnv())
    out.append(("build the tables into the maps", time.monotonic() - begin, peak_mib()))
    return out


def write_rules(path: Path, count: int) -> None:
    prefixes, _, _ = rule_set(count, random.Random(count))
    path.write_text("\n".join(str(p) for p in prefixes) + "\n")


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--json"]
    count = int(args[0]) if args else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{count}.rules"
        # Written by a child, so that the peaks below are the wrapper's stages alone.
        writer = multiprocessing.get_context("fork").Process(target=write_rules, args=(path, count))
        writer.start()
        writer.join()
        rows = stages(path)
    if "--json" in sys.argv:
        print(json.dumps(rows))
        return 0
    print(f"{count:,} rules")
    for what, seconds, peak in rows:
        print(f"  {what:34} {seconds:6.2f} s   peak RSS {peak:5.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
