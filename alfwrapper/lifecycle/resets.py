"""The note of an Accept=yes peer denied and reset before COMMAND started, said once,
where operators look: with stderr on the journal, as an entry with the drop log's
fields (ALF_SERVICE, ALF_SRC, ALF_REASON, ALF_PROTOCOL, ALF_PORT) and ALF_VERDICT=reset,
which `alfwrapper status` and its Prometheus output count (observe/status.py); else
the same line on stderr.  Said by the full start (backlog.judge_connection) and by a
kept verdict (verdicts.py) alike.  Standard library only: a denied peer's cost."""

from __future__ import annotations

import sys

from alfwrapper.host import journal

VERDICT = "reset"  # ALF_VERDICT of these entries (the drop log's packets: "drop")


def counted_service(service: str) -> str:
    """The name a reset is counted under: an Accept=yes instance's unit
    (``alfwrapper-sshd@3-192.0.2.2:22-198.51.100.1:41234``) counts under its template's
    name (``alfwrapper-sshd``), as its socket unit is named."""
    return service.split("@", 1)[0] or service


def note(service: str, peer: str, port: int, command: str) -> None:
    """Say that the connection from ``peer`` (written as its packets carry it: IPv4 as
    IPv4) to local ``port`` was denied and reset, and COMMAND not started."""
    text = f"alfwrapper: note: connection from {peer} denied and reset; {command} not started"
    fields = {
        "MESSAGE": text,
        "PRIORITY": "5",  # notice, as the drop log's
        "SYSLOG_IDENTIFIER": "alfwrapper",
        "ALF_SERVICE": counted_service(service),
        "ALF_SRC": peer,
        "ALF_VERDICT": VERDICT,
        "ALF_REASON": "subnets",
        "ALF_PROTOCOL": "tcp",
        "ALF_PORT": str(port),
    }
    try:
        if journal.stderr_is_journal() and journal.send(fields):
            return
        print(text, file=sys.stderr)
    except Exception:  # noqa: BLE001  (reset already: nothing more is done)
        pass
