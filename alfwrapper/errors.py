"""The one error type of alfwrapper and the sysexits codes it exits with."""

from __future__ import annotations

import os
import sys

# Not sysexits: the status LLVM ends the process with (exit(1)) on an error it returns
# to no one, which alfwrapper cannot change; a child says why (compiler._exit_witness).
EX_COMPILER_ENDED = 1
# Not sysexits: 128 + SIGPIPE, what a shell reports for `ls | head` when ls is killed by
# the closed pipe; alfwrapper (Python ignores SIGPIPE) ends with it quietly instead.
EX_PIPE_CLOSED = 141
# sysexits.h
EX_USAGE = 64
EX_DATAERR = 65
EX_NOINPUT = 66
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_OSERR = 71
EX_CANTCREAT = 73
EX_TEMPFAIL = 75
EX_PROTOCOL = 76
EX_NOPERM = 77
EX_CONFIG = 78


def excerpt(text: str, limit: int = 40, quote: bool = True) -> str:
    """At most ``limit`` characters of user input, for an error message (quoted, unless
    it is a path or a name that reads better bare)."""
    shown = text if len(text) <= limit else text[:limit] + "..."
    return repr(shown) if quote else shown


class AlfError(Exception):
    """An error a user can act on: what failed, why, and what to do.

    Raised anywhere; printed only by ``cli.main`` as
    ``alfwrapper: <what>: <why> (<hint>)``.  ``details`` is shown with -v.
    """

    def __init__(
        self,
        what: str,
        why: str,
        hint: str = "",
        exit_code: int = EX_SOFTWARE,
        details: str = "",
        exit_now: bool = False,
    ) -> None:
        super().__init__(what, why, hint, exit_code)
        # After the point of no return (fds closed for exec): main() exits at
        # once, without the interpreter's clean-up.
        self.exit_now = exit_now
        self.what = what
        self.why = why
        self.hint = hint
        self.exit_code = exit_code
        self.details = details

    def __str__(self) -> str:
        return f"{self.what}: {self.why}"

    def line(self) -> str:
        text = f"alfwrapper: {self.what}: {self.why}"
        if self.hint:
            text += f" ({self.hint})"
        # One line, always: multi-line causes (compiler output) go to details.
        return " ".join(text.split("\n"))


# The libraries alfwrapper imports (none at start-up: each where it is used), and the
# Debian package that has each.  BCC's bindings are not on PyPI: Debian's are built
# for /usr/bin/python3.
LIBRARIES = {
    "bcc": "python3-bpfcc",
    "numpy": "python3-numpy",
    "pyroute2": "python3-pyroute2",
    "requests": "python3-requests",
    "seccomp": "python3-seccomp",
    "setproctitle": "python3-setproctitle",
    "siphashc": "python3-siphashc",
    "systemd": "python3-systemd",
}


def missing_library(err: ImportError) -> AlfError | None:
    """The one line for an import of one of LIBRARIES that failed, or None."""
    name = (err.name or "").split(".")[0]
    if name not in LIBRARIES:
        return None
    return AlfError(
        f"Python module {name}",
        "is not installed",
        f"apt-get install {LIBRARIES[name]}, and run alfwrapper with /usr/bin/python3 "
        "(or a venv made from it with --system-site-packages); `alfwrapper doctor` checks",
        EX_UNAVAILABLE,
    )


def report(err: AlfError, verbose: bool) -> int:
    """Print an AlfError as its one line (and its details, if verbose), and give its
    exit code; after the point of no return (exit_now), exit at once."""
    print(err.line(), file=sys.stderr)
    if verbose and err.details:
        print(err.details.rstrip(), file=sys.stderr)
    if err.exit_now:
        sys.stderr.flush()
        os._exit(err.exit_code)
    return err.exit_code


def internal(err: Exception) -> int:
    """An error alfwrapper did not foresee: one line, never a traceback unless asked."""
    print(
        f"alfwrapper: internal error: {type(err).__name__}: {err} "
        "(please report it with the output of -v)",
        file=sys.stderr,
    )
    return EX_SOFTWARE
