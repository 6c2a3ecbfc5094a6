"""The wrapper's life, one socket record each: sockets, state, programs, backlog, exec.

    Policy -> sockets (inherited, created: sockets.py) -> an Accept=yes peer judged
      by its rules (backlog.py), a denied one reset before anything else is done
      -> (launch.py, kept.py) each kept socket taken: its pinned state found by cookie or
      made, and the fixed dispatcher attached and locked (Store.take; its empty
      slot drops) -> programs (planned, loaded, filled) -> into each socket's slot
      (programs.py) -> judge what was queued on inherited sockets not judged yet
      (backlog.py) -> bind created sockets -> interface watcher, drop log forwarder
      (companions.py) -> drop privileges -> exec COMMAND

A denied Accept=yes peer costs what this module imports and no more: launch.py
is imported only for a start that goes on, and the state, the programs and BCC's
side (kept.py) only for one that keeps a socket (not an allowed peer's), so that
a flood of denied connections, each one a wrapper started by systemd or inetd,
costs as little as it can (docs/benchmarks.md has the figure).  Once its verdict
is kept (verdicts.py), the next denied peer with the same command line and files
is reset before even this module is imported.

Created sockets are bound only after their filter is attached, so no packet
reaches them unfiltered.  Inherited sockets may hold connections and
datagrams that arrived before; backlog.py judges them.  A socket an earlier
start filtered (a restart, an idle exit and a new activation) keeps its
dispatcher: the new program takes over the slot in one update.  Each step that
changes the kernel's or the pinned state is a crash point (faults.py): a start
killed anywhere leaves a state the next start settles (state.Store.take).
"""

from __future__ import annotations

from typing import NoReturn

from alfwrapper.errors import EX_USAGE, AlfError
from alfwrapper.lifecycle import verdicts
from alfwrapper.lifecycle.sockets import gather_sockets
from alfwrapper.policy.files import Policy
from alfwrapper.policy.inputs import CONSULTED


def run(
    policy: Policy,
    service: str,
    argv: list[str],
    keep_capabilities: bool = True,
    diverted: dict[int, int] | None = None,
) -> int | NoReturn:
    """Sockets in, filters on, exec.  Returns (0) only when an Accept=yes peer was denied.

    ``service`` names the pinned state; ``argv`` (the rule options) is kept in
    it so that `alfwrapper reload` can build the policy again.  The application
    keeps the capabilities the unit gave, but those that reach its filter,
    unless not ``keep_capabilities`` (privileges.py).  ``diverted``: the
    streams activation.divert_inetd_streams kept off an inetd peer, for the application."""
    if not policy.command:
        raise AlfError("usage", "no COMMAND given", "put the program to run after --", EX_USAGE)
    records = gather_sockets(policy)
    for record in records:
        if record.connected:
            from alfwrapper.lifecycle import backlog  # noqa: PLC0415  (a connection's alone)

            on_fd_0 = record.stdin  # before the judge: a reset closes the socket
            allowed = backlog.judge_connection(record, policy.command[0], service)
            if len(records) == 1 and verdicts.PENDING is not None:
                subnets = record.rules.subnets  # judged by these alone: kept for the next
                # An allowed peer's COMMAND may start from the kept verdict where all
                # launch.py does for it is confine and exec: one socket, on fd 0, ruled.
                run = {"command": list(policy.command), "capabilities": keep_capabilities}
                verdicts.keep(
                    subnets.allow,
                    subnets.deny,
                    list(policy.command),
                    CONSULTED,
                    run if on_fd_0 and not record.rules.empty else None,
                    service,
                )
            if not allowed:
                return 0  # nothing more is looked at, not even whether COMMAND exists
    from alfwrapper.lifecycle import launch  # noqa: PLC0415  (not for a denied peer)

    return launch.filter_and_exec(policy, records, service, argv, keep_capabilities, diverted)
