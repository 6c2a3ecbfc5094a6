"""A start that goes on (lifecycle/wrapper.py judged any Accept=yes peer): every
kept socket's filter on (kept.py, imported only when a socket is kept: an allowed
Accept=yes connection needs no state, program or BCC), privileges dropped, COMMAND
exec'd.  The order, and why, is in wrapper.py's docstring."""

from __future__ import annotations

import os
import shutil
import sys
from typing import NoReturn

from alfwrapper.errors import EX_NOINPUT, AlfError
from alfwrapper.host import activation, privileges
from alfwrapper.lifecycle.sockets import SocketRecord, note_unruled
from alfwrapper.policy.files import Policy


def check_command(program: str) -> None:
    if shutil.which(program) is None:
        raise AlfError(
            f"COMMAND {program}",
            "not found or not executable",
            "give a path or a program on PATH",
            EX_NOINPUT,
        )


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
    import seccomp  # noqa: F401, PLC0415  (before any work: privileges.deny_bpf_syscall needs it)

    if any(not r.connected for r in records):
        from alfwrapper.lifecycle import kept  # noqa: PLC0415  (the state, programs, BCC)

        kept.filter_kept(records, service, argv)
    else:
        note_unruled(records)  # an Accept=yes connection: judged, nothing to load
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
