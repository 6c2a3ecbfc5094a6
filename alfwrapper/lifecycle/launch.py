"""A start that goes on (lifecycle/wrapper.py judged any Accept=yes peer): every
kept socket's filter on (kept.py, imported only when a socket is kept: an allowed
Accept=yes connection needs no state, program or BCC), privileges dropped, COMMAND
exec'd.  The order, and why, is in wrapper.py's docstring."""

from __future__ import annotations

from typing import NoReturn

from alfwrapper.lifecycle.handover import check_command, confine_and_exec, load_seccomp
from alfwrapper.lifecycle.sockets import SocketRecord, note_unruled
from alfwrapper.policy.files import Policy


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
    load_seccomp()

    channel = None
    if not records:  # a daemon that binds its own sockets
        from alfwrapper.lifecycle import intercept  # noqa: PLC0415

        channel = intercept.prepare(policy, service, argv)
    elif any(not r.connected for r in records):
        from alfwrapper.lifecycle import kept  # noqa: PLC0415  (the state, programs, BCC)

        kept.filter_kept(records, service, argv)
    else:
        note_unruled(records)  # an Accept=yes connection: judged, nothing to load
    moved = [r for r in records if not r.stdin and not r.spa]
    for record in records:
        if record.stdin:
            record.sock.detach()  # fd 0 (and 1) stay as they are
    sockets, names = [r.sock for r in moved], [r.name for r in moved]
    held = [r.sock for r in records if r.spa]  # open while the application runs, not its
    confine_and_exec(policy.command, keep_capabilities, sockets, names, diverted, held, channel)
