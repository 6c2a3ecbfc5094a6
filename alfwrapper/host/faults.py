"""Named crash points, for the fault-injection tests: inert unless ALFWRAPPER_CRASH_AT
names one.

Every step that changes the kernel's or the pinned state is followed by
``crash_point(NAME)``.  With ``ALFWRAPPER_CRASH_AT=NAME`` in its environment the
process kills itself there with SIGKILL, as the OOM killer, a `systemctl kill` or a
power cut would: no clean-up runs.  ``NAME@DIR`` crashes only if it can make the
directory DIR (so once), so that a restarted process gets past: systemd keeps a
unit's environment across its restarts, and a sandboxed unit may write nowhere but
the BPF file system.  The tests (tests/netns/test_crash.py,
tests/boot/test_kills.py) kill at each point in turn and check, with real traffic,
that the next start leaves the socket filtered.

``ALFWRAPPER_PAUSE_AT=NAME`` (or ``NAME@DIR``) stops the process there instead
(SIGSTOP, as a stalled machine would hold it), so that a test can send what an
attacker would in that moment and then let it go on (SIGCONT):
tests/netns/test_startup.py.

``ALFWRAPPER_FAIL_AT=NAME`` raises there an OSError (ENOMEM, as the kernel gives when
a map cannot be had), so that a test follows the failure's own clean-up path.
"""

from __future__ import annotations

import errno
import os
import signal

VARIABLE = "ALFWRAPPER_CRASH_AT"
PAUSE_VARIABLE = "ALFWRAPPER_PAUSE_AT"
FAIL_VARIABLE = "ALFWRAPPER_FAIL_AT"

# Every crash point, in the order a start (then a reload, a live rule, gc) meets them.
POINTS = (
    "pinned",  # a new socket's state is pinned; no filter on the socket yet
    "attached",  # the dispatcher is attached and locked; its slot is empty: it drops
    "cache-written",  # a compiled program's cache entry is written, not yet renamed in
    "loaded",  # the program is compiled and loaded, not yet in the slot
    "rule-inherited",  # a restart's new socket has one of the earlier sockets' runtime rules
    "installed",  # the program is in the slot; what was queued is not judged yet
    "judged",  # what was queued is judged; not yet written down
    "bound",  # created sockets are bound
    "described",  # the meta is written; the application is not started yet
    "reload-loaded",  # reload: the new programs are loaded, none in a slot yet
    "reload-installed",  # reload: one socket has its new program
    "rule-flagged",  # a live rule: the socket's "may have rules" flag is set
    "removing",  # gc (or a start): a socket's state is half removed, its dispatcher first
    "set-made",  # set create: the set is whole, pinned under its temporary name, not renamed in
    "set-grown-pinned",  # a set's hosts map grown: its larger copy pinned, not in force
    "set-grown-switched",  # the copy in force for every program; the hosts pin not renamed
    "intercept-taken",  # a daemon's bind or listen: its socket taken, nothing done yet
    "intercept-attached",  # its filter attached, not locked; the call not done
    "early-updated",  # set early: the link runs the new program; its pins still the old's
    "early-named",  # set early: the new sets' names pinned; the maps' pins still the old's
)


def crash_point(name: str) -> None:
    """Die (or stop, or fail) here if the environment says so (tests only)."""
    for variable, signum in ((PAUSE_VARIABLE, signal.SIGSTOP), (VARIABLE, signal.SIGKILL)):
        wanted = os.environ.get(variable)
        if wanted and _here(wanted, name):
            os.kill(os.getpid(), signum)
    failing = os.environ.get(FAIL_VARIABLE)
    if failing and _here(failing, name):
        raise OSError(errno.ENOMEM, f"failed on purpose at {name} ({FAIL_VARIABLE})")


def _here(wanted: str, name: str) -> bool:
    """Whether ``wanted`` (NAME or NAME@DIR) means this point, this time."""
    point, _, once = wanted.partition("@")
    if point != name:
        return False
    if once:
        try:
            os.mkdir(once, 0o700)
        except OSError:
            return False
    return True
