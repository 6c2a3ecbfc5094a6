"""A start that goes on (lifecycle/wrapper.py judged any Accept=yes peer): every
kept socket's filter on (kept.py, imported only when a socket is kept: an allowed
Accept=yes connection needs no state, program or BCC), privileges dropped, COMMAND
exec'd.  The order, and why, is in wrapper.py's docstring."""

from __future__ import annotations

import socket
import sys
from typing import NoReturn

from alfwrapper.host.progress import seconds_running, tell_manager
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
    guarded: list[str] = []  # what is in force, said once nothing but exec can fail
    if not records:  # a daemon that binds its own sockets
        from alfwrapper.lifecycle import intercept  # noqa: PLC0415

        tell_manager("alfwrapper: loading the filters for the sockets COMMAND binds")
        channel = intercept.prepare(policy, service, argv)
        scopes = [("every socket it binds", "")] + [(n, n) for n in sorted(policy.names)]
        guarded = [f"{what}: {policy.rules_for(n).guards()}" for what, n in scopes]
    elif any(not r.connected for r in records):
        from alfwrapper.lifecycle import kept  # noqa: PLC0415  (the state, programs, BCC)

        tell_manager(f"alfwrapper: loading the filters of {len(records)} socket(s)")
        kept.filter_kept(records, service, argv)
        guarded = [f"{r.name} ({where(r)}): {r.rules.guards()}" for r in records]
    else:
        note_unruled(records)  # an Accept=yes connection: judged, nothing to load
    moved = [r for r in records if not r.stdin and not r.spa]
    for record in records:
        if record.stdin:
            record.sock.detach()  # fd 0 (and 1) stay as they are
    sockets, names = [r.sock for r in moved], [r.name for r in moved]
    held = [r.sock for r in records if r.spa]  # open while the application runs, not its
    announce = (lambda: in_force(service, guarded)) if guarded else None
    confine_and_exec(
        policy.command, keep_capabilities, sockets, names, diverted, held, channel, announce
    )


def where(record: SocketRecord) -> str:
    """protocol address:port, as status writes it."""
    host, port = record.sock.getsockname()[:2]
    kind = "tcp" if record.sock.type == socket.SOCK_STREAM else "udp"
    return f"{kind} [{host}]:{port}" if ":" in host else f"{kind} {host}:{port}"


def in_force(service: str, guarded: list[str]) -> None:
    """One line, to the journal under systemd, and STATUS=: what is in force, by now."""
    line = f"filters in force for {service} after {seconds_running():.1f} s: " + "; ".join(guarded)
    print(f"alfwrapper: {line}", file=sys.stderr, flush=True)
    tell_manager(f"alfwrapper: {line}"[:400])
