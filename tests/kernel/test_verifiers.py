"""The kernel tier: every program alfwrapper generates (cases.py), recorded from the
real wrapper on this host, loads in the verifier of each kernel the README names:
Debian 12's own 6.1 and Debian 13's own 6.12 (each booted in qemu, guest_kernel.py)
and this host's; as
root, as the shipped units load it (CAP_BPF, no CAP_PERFMON) and as the loader does."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import cases, guest_kernel
from helpers.support import bpf_problem, require

pytestmark = pytest.mark.kernel

KERNELS = (*guest_kernel.RELEASES, "host")
# Instructions a verifier may process for one program (its limit is 1,000,000). The
# programs need at most about 21,000 (6.1, CAP_BPF alone, a million mixed rules with
# knocking and a developer's filter); indexing a map value by pointer, or testing
# again what the verifier knows, multiplies that (composed: 858,000, next to failing).
VERIFIER_BUDGET = 50_000
# The most named sets a socket may name (32) beside every other part: linear in the
# sets (each one's ways to a verdict meet the knock part's code), about 116,000 on
# 6.1 as the units load it; before sets.c kept its paths linear, twelve sets alone
# took 745,000 and sixteen passed the limit.
BUDGETS = {"sets-most-composed": 200_000}


@pytest.fixture(scope="module")
def recordings() -> Iterator[Path]:
    problem = bpf_problem()
    require(not problem, problem)
    for tool, package in (
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("gcc", "gcc"),
        ("cpio", "cpio"),
    ):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: `make setup` installs {package}")
    recorder, _ = guest_kernel.build_tools()
    out = guest_kernel.BUILD / "recordings"
    failures = cases.record(recorder, out, guest_kernel.BUILD / "rules")
    assert not failures, f"the wrapper failed on this host: {failures}"
    yield out


@pytest.fixture(scope="module")
def replayed(recordings: Path) -> dict[str, tuple[str, list[guest_kernel.Outcome]]]:
    found = {
        name: guest_kernel.replay_in_debian(recordings, name) for name in guest_kernel.RELEASES
    }
    return {**found, "host": guest_kernel.replay_here(recordings)}


def report(failed: list[guest_kernel.Outcome]) -> str:
    lines = []
    for o in failed[:6]:
        lines.append(f"{o.mode} {o.case} #{o.index} {o.name}: {o.detail}")
        lines += [f"    {line}" for line in o.log[-12:]]
    return "\n".join(lines)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_program_loads_in_every_mode(
    kernel: str, recordings: Path, replayed: dict[str, tuple[str, list[guest_kernel.Outcome]]]
) -> None:
    release, outcomes = replayed[kernel]
    if kernel in guest_kernel.RELEASES:
        assert release.startswith(guest_kernel.RELEASES[kernel]), release
    else:
        assert release == os.uname().release
    # Every case was recorded both ways, and each of its programs replayed in each mode
    # (libbpf's feature probes aside).
    recorded = {p.stem for p in recordings.glob("*.rec")}
    wanted = (
        {f"{c.name}.check" for c in cases.CASES if c.check}
        | {f"{c.name}.wrapper" for c in cases.CASES if c.wrapper}
        | {f"{cases.EARLY}.early"}
    )
    assert wanted <= recorded, wanted - recorded
    ours = [o for o in outcomes if o.name not in ("-", "libbpf_nametest")]
    for mode in guest_kernel.MODES:
        loaded = {o.case for o in ours if o.mode == mode.name}
        # Early drop's XDP programs need CAP_NET_ADMIN: root's alone (replay_bpf.c).
        expected = recorded if mode.unit is None else recorded - {f"{cases.EARLY}.early"}
        assert loaded == expected, (mode.name, expected ^ loaded)
    failed = [o for o in outcomes if not o.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} loads refused on {release}:\n" + report(
        failed
    )
    costly = [o for o in ours if processed(o) > BUDGETS.get(o.case.split(".")[0], VERIFIER_BUDGET)]
    assert not costly, [(o.mode, o.case, o.name, processed(o)) for o in costly]
    for mode in guest_kernel.MODES:
        loads = [o for o in ours if o.mode == mode.name]
        most = max(loads, key=processed)
        print(
            f"{release} {mode.name}: {len(loads)} programs, at most {processed(most)} "
            f"instructions processed ({most.case})"
        )


def processed(outcome: guest_kernel.Outcome) -> int:
    """The instructions the verifier processed ("N insns, M processed")."""
    words = outcome.detail.replace(",", "").split()
    return int(words[words.index("processed") - 1]) if "processed" in words else 0
