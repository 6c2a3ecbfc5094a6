"""A start that goes on (lifecycle/wrapper.py judged any Accept=yes peer): every
kept socket's filter on, what was queued before judged, created sockets bound,
companions started, privileges dropped, COMMAND exec'd.  The order, and why,
is in wrapper.py's docstring."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import NoReturn

from alfwrapper import state
from alfwrapper.bpf import compiler
from alfwrapper.bpf.parts import knock_key
from alfwrapper.errors import EX_NOINPUT, EX_USAGE, AlfError, excerpt
from alfwrapper.host import activation, attach, companion, privileges
from alfwrapper.host.faults import crash_point
from alfwrapper.lifecycle import backlog, companions, programs
from alfwrapper.lifecycle.sockets import SocketRecord, bind_socket
from alfwrapper.policy.files import Policy


def describe_sockets(
    records: list[SocketRecord], service: str, argv: list[str], watcher: int, forwarder: int
) -> None:
    """What status and reload need to know, in each socket's pinned meta."""
    for record in records:
        if record.pins is None:
            continue
        host, port = record.sock.getsockname()[:2]
        state.write_meta(
            record.pins,
            {
                "service": service,
                "name": record.name,
                "protocol": record.protocol,
                "address": host,
                "port": port,
                "pid": os.getpid(),
                "watcher": watcher,
                "forwarder": forwarder,
                "rules": record.rules.counts(),
                "netns": state.netns_cookie(),
                "argv": argv,
                "cwd": os.getcwd(),
                "knock": knock_key(record.rules) if record.rules.knock else "",
                "started": int(time.time()),
                "program": compiler.prog_id(record.loaded) if record.loaded else 0,
                "judged": True,
            },
        )


def check_command(program: str) -> None:
    if shutil.which(program) is None:
        raise AlfError(
            f"COMMAND {program}",
            "not found or not executable",
            "give a path or a program on PATH",
            EX_NOINPUT,
        )


def state_available() -> str:
    """Why this wrapper cannot keep pinned state, or "" if it can.  Without it, each
    socket gets its program directly, which no restart or reload can replace."""
    try:
        state.store().root(create=True)
        return ""
    except AlfError as err:
        return f"{err.what}: {err.why}"


def collect_stale_state() -> None:
    """Forget what sockets of this namespace that are gone left behind, once the
    programs are in (host/sockdiag.py: a dump of every socket, only if some socket's
    process is gone)."""
    try:
        state.store().gc()
    except (AlfError, OSError) as err:
        print(f"alfwrapper: note: the state of gone sockets was not removed ({err}); "
              "`alfwrapper gc` removes it", file=sys.stderr)  # fmt: skip


def filter_and_exec(
    policy: Policy,
    records: list[SocketRecord],
    service: str,
    argv: list[str],
    keep_capabilities: bool,
    diverted: dict[int, int] | None,
) -> NoReturn:
    """wrapper.run's, from where its Accept=yes peers are judged and allowed."""
    check_command(policy.command[0])
    state.check_meta_room(argv, os.getcwd())
    import seccomp  # noqa: F401, PLC0415  (before any work: privileges.deny_bpf_syscall needs it)

    if any(r.rules.interfaces or r.rules.log_rate for r in records):
        companion.check_libraries()  # of the watcher and the forwarder
    from alfwrapper.loader import client  # noqa: PLC0415

    if client.use_if_needed():
        following = sorted({i for r in records for i in r.rules.interfaces})
        if following:
            raise AlfError(
                f"--interface {following[0]}",
                "without CAP_BPF, filters come from the loader, which cannot follow "
                "interface renames for you",
                "use subnet rules, or give the service CAP_BPF",
                EX_USAGE,
            )
    unpinned = state_available() if any(not r.connected for r in records) else ""
    pinned = any(not r.connected for r in records) and not unpinned
    try:
        loaded = programs.filter_sockets(records, service, pinned)
        for record in records:
            if record.inherited and not record.judged and record.loaded is not None:
                backlog.judge_backlog(record)  # a connected one has no program: judged
        crash_point("judged")
        for record in records:
            if record.pins is not None and not record.judged:
                state.mark_judged(record.pins)
        for record in records:
            if record.spec is not None:
                bind_socket(record.sock, record.spec)
        crash_point("bound")
    except BaseException:
        # A created socket dies with this process, and its state is of no use; an
        # inherited one keeps its state (its dispatcher is attached: the next start
        # takes it from there).
        for record in records:
            if record.made and record.spec is not None and record.pins is not None:
                state.store().remove(record.pins)
        raise
    if pinned:
        collect_stale_state()
    if unpinned:
        print(
            f"alfwrapper: note: no pinned state ({unpinned}): the filters cannot be "
            "reloaded, and a restart cannot re-filter an inherited socket",
            file=sys.stderr,
        )
    for record in records:
        if record.rules.empty:
            what = (
                "every packet passes until a reload gives it rules"
                if record.pins
                else "it is not filtered"
            )  # fmt: skip
            print(
                f"alfwrapper: note: {attach.describe(record.sock)} named "
                f"{excerpt(record.name)} has no rules: {what}",
                file=sys.stderr,
            )
    watcher = companions.start_watcher(loaded, service)
    forwarder = companions.start_forwarder(
        [(r.name, r.pins) for r in records if r.pins is not None and r.rules.log_rate],
        service,
    )
    describe_sockets(records, service, argv, watcher, forwarder)
    crash_point("described")
    note = privileges.confine_application(keep_capabilities)
    if note:
        print(f"alfwrapper: note: {note}", file=sys.stderr)
    moved = [r for r in records if not r.stdin]
    for record in records:
        if record.stdin:
            record.sock.detach()  # fd 0 (and 1) stay as they are
    activation.exec_with_sockets(
        [r.sock for r in moved], [r.name for r in moved], policy.command, os.environ, diverted
    )
