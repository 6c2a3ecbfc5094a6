"""``main``: the subcommands' table, ``alfwrapper help``, and the one place that turns
errors into a message and an exit code.  Each subcommand lives in its group's module
(cli/__init__.py lists them); this one only dispatches."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from alfwrapper.cli.knock import knock_main, knock_parser
from alfwrapper.cli.observe import (
    doctor_main,
    doctor_parser,
    log_main,
    log_parser,
    status_main,
    status_parser,
)
from alfwrapper.cli.parser import Parser
from alfwrapper.cli.policy import check_main, check_parser, explain_main, explain_parser
from alfwrapper.cli.service import (
    CHANGES,
    change_main,
    change_parser,
    gc_main,
    gc_parser,
    reload_main,
    reload_parser,
    show_main,
    show_parser,
)
from alfwrapper.cli.sets import crowdsec_main, crowdsec_parser, set_main, set_parser
from alfwrapper.cli.systemd import generator_main, generator_parser, loader_main, loader_parser
from alfwrapper.cli.wrapper import wrapper_main, wrapper_parser
from alfwrapper.errors import (
    EX_PIPE_CLOSED,
    EX_USAGE,
    AlfError,
    excerpt,
    internal,
    missing_library,
    report,
)
from alfwrapper.host import activation
from alfwrapper.record import Record


class Subcommand(Record):
    parser: Callable[[], Parser]
    run: Callable[[Sequence[str]], int]


SUBCOMMANDS: dict[str, Subcommand] = {
    "check": Subcommand(check_parser, check_main),
    "explain": Subcommand(explain_parser, explain_main),
    "reload": Subcommand(reload_parser, reload_main),
    **{verb: Subcommand(change_parser(verb), change_main(verb)) for verb in CHANGES},
    "show": Subcommand(show_parser, show_main),
    "status": Subcommand(status_parser, status_main),
    "log": Subcommand(log_parser, log_main),
    "gc": Subcommand(gc_parser, gc_main),
    "doctor": Subcommand(doctor_parser, doctor_main),
    "knock": Subcommand(knock_parser, knock_main),
    "set": Subcommand(set_parser, set_main),
    "crowdsec": Subcommand(crowdsec_parser, crowdsec_main),
    "loader": Subcommand(loader_parser, loader_main),
    "generator": Subcommand(generator_parser, generator_main),
}


def parser_of(name: str) -> Parser:
    """The parser of a subcommand, or the wrapper's for ""."""
    return SUBCOMMANDS[name].parser() if name else wrapper_parser(SUBCOMMANDS)


def completion_parser() -> Parser:
    """The whole command line as one parser, for shell completion (`make completion`
    hands it to shtab): the wrapper's options, and each subcommand's own."""
    top = wrapper_parser(SUBCOMMANDS)
    subs = top.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    for name, sub in SUBCOMMANDS.items():
        parser = sub.parser()
        subs.add_parser(
            name,
            parents=[parser],
            add_help=False,
            help=parser.description,
            description=parser.description,
        )
    return top


def stdout_closed() -> bool:
    """Whether standard output's reader is gone (a pipe's last reader closed it, or a
    socket's peer): poll(2) says POLLERR (or POLLHUP) then, for any file."""
    import select  # noqa: PLC0415  (built in; only for this rare path)

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no stdout, or not a real file
        return False


def quit_closed_pipe() -> int:
    """End quietly, as `ls | head` does: the reader of standard output has left (Python
    ignores SIGPIPE, so a write raised EPIPE instead of ending the process).  Standard
    output is pointed at /dev/null first, so that the interpreter's flush at exit, of
    what is still buffered, does not raise again (Python's documented recipe, in the
    signal module's notes on SIGPIPE); the status is the one a shell reports for a
    process the closed pipe killed (man/alfwrapper.1, EXIT STATUS)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EX_PIPE_CLOSED


def commands() -> str:
    """What a bare `alfwrapper` and `alfwrapper help` print: each way to run it, a line."""
    import re  # noqa: PLC0415  (not for a start)

    lines = [
        "usage: alfwrapper [RULES] [SOCKETS] -- COMMAND [ARG...]   (alfwrapper --help)",
        "       alfwrapper SUBCOMMAND ...   (alfwrapper help SUBCOMMAND)",
        "",
        "subcommands:",
    ]
    for name, sub in SUBCOMMANDS.items():
        about = re.split(r"[:;.(]|, ", sub.parser().description or "", maxsplit=1)[0].strip()
        lines.append(f"  {name:10} {about if len(about) <= 66 else about[:63] + '...'}")
    lines += ["", "man alfwrapper; guides in /usr/share/doc/alfwrapper"]
    return "\n".join(lines)


def help_main(argv: Sequence[str]) -> int:
    """`alfwrapper help [SUBCOMMAND]`, and a bare `alfwrapper`: the list, or its --help."""
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]].run(["--help"])
    if argv:
        raise AlfError(
            "help", f"no subcommand {excerpt(argv[0])}", "alfwrapper help lists them", EX_USAGE
        )
    print(commands())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] == "help":
        argv = ["help", *argv[1:]]
    activation.own_environment(os.environ)  # before numpy loads
    options = argv[: argv.index("--")] if "--" in argv else argv
    verbose = "-v" in options or "--verbose" in options
    try:
        command = SUBCOMMANDS.get(argv[0]) if argv else None
        if argv[0] == "help":
            code = help_main(argv[1:])
        else:
            code = command.run(argv[1:]) if command is not None else wrapper_main(argv, SUBCOMMANDS)
        if sys.stdout is not None:
            sys.stdout.flush()  # a reader that left shows here, not at the exit's flush
        return code
    except AlfError as err:
        return report(err, verbose)
    except KeyboardInterrupt:
        return 130
    except ImportError as err:
        missing = missing_library(err)
        if missing is None:
            raise
        print(missing.line(), file=sys.stderr)
        return missing.exit_code
    except Exception as err:  # noqa: BLE001  (never a traceback unless asked for)
        if isinstance(err, BrokenPipeError) and stdout_closed():  # not the loader's pipe
            return quit_closed_pipe()
        code = internal(err)
        if verbose:
            import traceback  # noqa: PLC0415  (not for a start)

            traceback.print_exc()
        return code
