"""The last steps of every start that goes on: COMMAND looked up, the process
confined (host/privileges.py), COMMAND exec'd with the sockets
(host/activation.py).

launch.py comes here once every kept socket's filter is on; verdicts.py comes
here for an allowed Accept=yes peer whose verdict an earlier start kept, before
the command line is parsed.  So this module imports the standard library and
host modules only, and nothing the full start alone needs.
"""

from __future__ import annotations

import os
import sys

from alfwrapper.errors import EX_NOINPUT, AlfError
from alfwrapper.host import activation, privileges

TYPE_CHECKING = False  # typing costs an Accept=yes connection milliseconds
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Sequence
    from typing import NoReturn


def check_command(program: str) -> None:
    import shutil  # noqa: PLC0415  (6 ms, with re: not for an Accept=yes connection's exec)

    if shutil.which(program) is None:
        raise AlfError(
            f"COMMAND {program}",
            "not found or not executable",
            "give a path or a program on PATH",
            EX_NOINPUT,
        )


def load_seccomp() -> None:
    """python3-seccomp, before any work: privileges.deny_bpf_syscall needs it, and a
    missing library must stop the start before it changes anything."""
    import seccomp  # noqa: F401, PLC0415


def confine_and_exec(
    command: Sequence[str],
    keep_capabilities: bool,
    sockets: Sequence[socket.socket],
    names: Sequence[str],
    diverted: dict[int, int] | None,
    held: Sequence[socket.socket] = (),
    intercepted: socket.socket | None = None,
    announce: Callable[[], None] | None = None,
) -> NoReturn:
    """Confine this process for the application (privileges.confine_application),
    then exec COMMAND with the sockets at fd 3 on (a socket on fd 0 stays there), and
    the ``held`` ones (SPA sockets) after them, outside LISTEN_FDS.  ``intercepted``:
    the channel to the bind supervisor (lifecycle/intercept.py), which gets the
    listener of the filters loaded last.  ``announce``: says what is in force, once
    nothing but exec itself can fail (so that a failing confinement's error is the
    start's one line)."""
    note = privileges.confine_application(keep_capabilities, handed_sockets=bool(sockets))
    if note:
        print(f"alfwrapper: note: {note}", file=sys.stderr)
    if intercepted is not None:
        from alfwrapper.lifecycle import intercept  # noqa: PLC0415

        intercept.hand_over(intercepted)
    if announce is not None:
        announce()
    activation.exec_with_sockets(sockets, names, command, os.environ, diverted, held)
