"""A start's kept sockets (listening, or datagram; not an Accept=yes connection):
their state taken, their programs in, what was queued on them judged, created ones
bound, the companions started, and what status and reload need written.  Imported
(with the state, the programs and BCC's side) only by a start that keeps a socket:
launch.py, after every Accept=yes peer was judged."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from alfwrapper import state
from alfwrapper.bpf import compiler
from alfwrapper.bpf.parts import knock_folders
from alfwrapper.errors import EX_USAGE, AlfError
from alfwrapper.host import companion
from alfwrapper.host.faults import crash_point
from alfwrapper.lifecycle import companions, programs
from alfwrapper.lifecycle.sockets import SocketRecord, bind_socket, note_unruled


def describe_sockets(
    records: list[SocketRecord],
    service: str,
    argv: list[str],
    watcher: int,
    forwarder: int,
    pid: int = 0,
    intercepted: bool = False,
) -> None:
    """What status and reload need to know, in each socket's pinned meta.  ``pid``: the
    process that holds the sockets (default: this one, which becomes the application);
    ``intercepted``: the daemon bound them (lifecycle/intercept.py)."""
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
                "made": record.spec is not None,  # not inherited: a reload keeps its port
                "pid": pid or os.getpid(),
                "watcher": watcher,
                "forwarder": forwarder,
                "rules": record.rules.counts(),
                "fingerprint": record.rules.fingerprint(),  # explain SERVICE checks it
                "netns": state.netns_cookie(),
                "argv": argv,
                "cwd": os.getcwd(),
                "knock": knock_folders(record.rules),
                "deny_sets": list(record.rules.deny_sets),  # lifecycle/cut.py: set add
                "started": int(time.time()),
                "program": compiler.prog_id(record.loaded) if record.loaded else 0,
                "judged": True,
                **({"intercepted": True} if intercepted else {}),
            },
        )
        # A deny made since the first inherit_runtime (programs.filter_sockets) found
        # the earlier sockets alone, not this one, which it could not name yet.
        state.inherit_runtime(record.pins, record.name)


def refresh_early(narrow: dict[int, Sequence[str]] | None = None) -> None:
    """Early drop told of the sockets' deny sets (sets/early.py), where this network
    namespace has it: after a start, an intercepted bind, and around a reload."""
    if state.early_in(state.netns_cookie()):
        from alfwrapper.sets import early  # noqa: PLC0415  (early drop's, only)

        early.refresh_for_services(narrow)


def state_available() -> str:
    """Why this wrapper cannot keep pinned state, or "" if it can.  Without it, each
    socket gets its program directly, which no restart or reload can replace."""
    try:
        state.store_in_use().root(create=True)
        return ""
    except AlfError as err:
        return f"{err.what}: {err.why}"


def collect_stale_state() -> None:
    """Forget what sockets of this namespace that are gone left behind, once the
    programs are in (host/sockdiag.py: a dump of every socket, only if some socket's
    process is gone)."""
    try:
        state.store_in_use().gc()
    except (AlfError, OSError) as err:
        print(
            f"alfwrapper: note: the state of gone sockets was not removed ({err}); "
            "`alfwrapper gc` removes it",
            file=sys.stderr,
        )


def filter_kept(records: list[SocketRecord], service: str, argv: list[str]) -> None:
    """Every kept socket's filter on, what was queued judged, created sockets bound (the
    order: wrapper.py's docstring), companions started, each socket's meta written."""
    state.check_meta_room(argv, os.getcwd())
    if any(r.rules.interfaces or r.rules.log_rate for r in records):
        companion.check_libraries()  # of the watcher and the forwarder
    refuse_what_the_loader_cannot_make(records)
    unpinned = state_available()  # some socket is kept, or this module would not run
    pinned = not unpinned
    spa = next((r for r in records if r.spa), None)
    if spa is not None and unpinned:
        raise AlfError(
            f"knock-spa ({spa.name})",
            f"its SPA socket opens what the service's sockets read, in pinned state, which "
            f"this start cannot keep ({unpinned})",
            "mount the BPF file system at /sys/fs/bpf (man alfwrapper: PINNED STATE)",
            EX_USAGE,
        )
    loaded = attach_judge_and_bind(records, service, pinned)
    if unpinned:
        print(
            f"alfwrapper: note: no pinned state ({unpinned}): the filters cannot be "
            "reloaded, and a restart cannot re-filter an inherited socket",
            file=sys.stderr,
        )
    note_unruled(records)
    watcher = companions.start_watcher(loaded, service)
    forwarder = companions.start_forwarder(
        [(r.name, r.pins) for r in records if r.pins is not None and r.rules.log_rate],
        service,
    )
    describe_sockets(records, service, argv, watcher, forwarder)
    crash_point("described")
    refresh_early()
    if pinned:  # after the meta names this start's knock state: a gc keeps what is named
        collect_stale_state()


def refuse_what_the_loader_cannot_make(records: list[SocketRecord]) -> None:
    """Without CAP_BPF the loader makes the programs (loader/): refuse, before anything
    is attached, the rules it cannot serve (SPA sockets, interface rules)."""
    from alfwrapper.loader import client  # noqa: PLC0415

    if client.use_if_needed():
        spa = next((r for r in records if r.spa), None)
        if spa is not None:
            raise AlfError(
                f"knock-spa ({spa.name})",
                "without CAP_BPF, filters come from the loader, which does not make SPA "
                "sockets' programs",
                "use port sequences (--knock-secret alone), or give the service CAP_BPF",
                EX_USAGE,
            )
        following = sorted({i for r in records for i in r.rules.interfaces})
        if following:
            raise AlfError(
                f"--interface {following[0]}",
                "without CAP_BPF, filters come from the loader, which cannot follow "
                "interface renames for you",
                "use subnet rules, or give the service CAP_BPF",
                EX_USAGE,
            )


def attach_judge_and_bind(
    records: list[SocketRecord], service: str, pinned: bool
) -> list[compiler.LoadedFilter]:
    """The programs in (programs.filter_sockets), then what was queued on inherited
    sockets judged and marked so, then created sockets bound: in this order, with a
    crash point after each.  On a failure, created sockets' state goes with them."""
    try:
        loaded = programs.filter_sockets(records, service, pinned)
        for record in records:
            if record.inherited and not record.judged and record.loaded is not None:
                from alfwrapper.lifecycle import backlog  # noqa: PLC0415  (inherited only)

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
                state.store_in_use().remove(record.pins)
        raise
    return loaded
