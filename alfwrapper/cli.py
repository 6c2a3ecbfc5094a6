"""Command line: ``alfwrapper [OPTIONS] -- COMMAND [ARG...]`` and ``alfwrapper doctor``.

``main`` is the only place that turns errors into a message and an exit code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import traceback
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from alfwrapper import (
    __version__,
    activation,
    attach,
    backlog,
    compiler,
    doctor,
    interfaces,
    knocking,
    privileges,
    program,
    sockets,
)
from alfwrapper.errors import (
    EX_CONFIG,
    EX_NOINPUT,
    EX_NOPERM,
    EX_OSERR,
    EX_SOFTWARE,
    EX_USAGE,
    AlfError,
    excerpt,
)
from alfwrapper.rules import (
    Config,
    CustomFilter,
    KnockRules,
    ListenSpec,
    MapSetting,
    SocketRules,
    SubnetRules,
    parse_listen,
    parse_option_prefix,
    parse_ports,
    read_rule_file,
    split_scope,
)

USAGE = (
    "alfwrapper [OPTIONS] -- COMMAND [ARG...]\n       alfwrapper doctor\n"
    "       alfwrapper knock HOST PORT (--sequence P,P,P | --secret FILE)"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise AlfError("usage", message, "see alfwrapper --help or man alfwrapper", EX_USAGE)


class _ListenAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind = "stream" if option_string == "--listen" else "datagram"
        namespace.listens = [*namespace.listens, parse_listen(kind, str(values))]


class _NameAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        name = str(values)
        if not namespace.listens:
            raise AlfError(
                "--name",
                f"{excerpt(name)} follows no --listen or --listen-datagram",
                "put --name NAME right after the socket it names",
                EX_USAGE,
            )
        if not name or ":" in name or len(name) > 255 or not name.isprintable():
            raise AlfError(
                "--name",
                f"{excerpt(name)} is not a valid socket name",
                "use up to 255 printable characters without ':'",
                EX_USAGE,
            )
        last = namespace.listens[-1]
        if last.name != activation.DEFAULT_NAME:
            raise AlfError(
                "--name",
                f"{last} is already named {last.name!r}",
                "give one --name per socket",
                EX_USAGE,
            )
        namespace.listens = [
            *namespace.listens[:-1],
            ListenSpec(last.kind, last.host, last.port, name),
        ]


def _parser() -> _Parser:
    p = _Parser(
        prog="alfwrapper",
        usage=USAGE,
        description="Attach eBPF filters to a service's listening sockets, then exec "
        "the service with them (sd_listen_fds).  Rule options take NAME=VALUE to apply "
        "to the sockets named NAME only.",
    )
    p.add_argument("--version", action="version", version=f"alfwrapper {__version__}")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="on errors, show details: compiler output, verifier log",
    )
    s = p.add_argument_group("sockets (inherited per sd_listen_fds, and/or created)")
    s.add_argument(
        "--listen",
        action=_ListenAction,
        metavar="[ADDR]:PORT",
        dest="listens",
        default=[],
        help="create a TCP listener; [::]:PORT is dual-stack",
    )
    s.add_argument(
        "--listen-datagram",
        action=_ListenAction,
        metavar="[ADDR]:PORT",
        dest="listens",
        help="create a UDP socket",
    )
    s.add_argument(
        "--name",
        action=_NameAction,
        metavar="NAME",
        help="name the socket created by the previous --listen* (LISTEN_FDNAMES)",
    )
    r = p.add_argument_group("rules ([NAME=]VALUE; a packet must pass every kind given)")
    add = r.add_argument
    add(
        "--allow", action="append", default=[], metavar="CIDR", help="pass packets from this subnet"
    )
    add(
        "--deny",
        action="append",
        default=[],
        metavar="CIDR",
        help="drop packets from this subnet (deny wins)",
    )
    add(
        "--allow-file",
        action="append",
        default=[],
        metavar="FILE",
        help="--allow for each CIDR in FILE (one per line, # comments)",
    )
    add(
        "--deny-file",
        action="append",
        default=[],
        metavar="FILE",
        help="--deny for each CIDR in FILE",
    )
    add(
        "--interface",
        action="append",
        default=[],
        metavar="IFNAME",
        help="pass only packets that arrived on this interface (follows the name)",
    )
    add(
        "--knock",
        action="append",
        default=[],
        metavar="PORT,PORT,...",
        help="port knocking: the source ports of the knock sequence",
    )
    add(
        "--knock-secret",
        action="append",
        default=[],
        metavar="FILE",
        help="port knocking with sequences derived from this secret and the time",
    )
    add(
        "--filter",
        action="append",
        default=[],
        metavar="FILE.c",
        help="a developer's filter: restricted C with an entry `int filter(struct __sk_buff *)`",
    )
    add(
        "--set",
        action="append",
        default=[],
        nargs=3,
        metavar=("MAP", "KEY", "VALUE"),
        help="put KEY -> VALUE in the --filter's map MAP before attaching",
    )
    k = p.add_argument_group("knock settings (for every knock rule)")
    k.add_argument(
        "--knock-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="most time between two knocks (default 5)",
    )
    k.add_argument(
        "--knock-open-for",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a completed knock admits new connections (default 30)",
    )
    k.add_argument(
        "--knock-window",
        type=int,
        default=30,
        metavar="SECONDS",
        help="how long each secret-derived sequence is valid (default 30)",
    )
    k.add_argument(
        "--knock-steps",
        type=int,
        default=3,
        metavar="N",
        help="length of secret-derived sequences, 1 to 8 (default 3)",
    )
    k.add_argument(
        "--knock-sources",
        type=int,
        default=131072,
        metavar="N",
        help="knock states kept, least recently used evicted (default 131072)",
    )
    p.add_argument(
        "--print-filter",
        action="store_true",
        help="print each program's C source as compiled, and exit",
    )
    return p


# Below these, a knock cannot work over a real network: the next knock, or the
# connection that follows the last one, arrives after the door has closed.
MIN_KNOCK_TIMEOUT = 0.2
MIN_KNOCK_OPEN_FOR = 1.0


def _knock_settings(args: argparse.Namespace) -> KnockRules:
    checks = (
        (0 < args.knock_timeout <= 3600, "--knock-timeout", "between 0 and 3600 seconds"),
        (0 < args.knock_open_for <= 86400, "--knock-open-for", "between 0 and 86400 seconds"),
        (5 <= args.knock_window <= 3600, "--knock-window", "between 5 and 3600 seconds"),
        (1 <= args.knock_steps <= 8, "--knock-steps", "between 1 and 8"),
        (1024 <= args.knock_sources <= 1 << 24, "--knock-sources", "between 1024 and 16777216"),
    )
    for ok, option, hint in checks:
        if not ok:
            raise AlfError(option, "out of range", f"give a value {hint}", EX_USAGE)
    short = (
        (args.knock_timeout, MIN_KNOCK_TIMEOUT, "--knock-timeout", "the next knock"),
        (args.knock_open_for, MIN_KNOCK_OPEN_FOR, "--knock-open-for", "the connection"),
    )
    for value, least, option, what in short:
        if value < least:
            raise AlfError(
                option,
                f"{value:g} s is shorter than a round trip: {what} would arrive after the "
                "door has closed",
                f"give at least {least:g} seconds",
                EX_USAGE,
            )
    return KnockRules(
        timeout=args.knock_timeout,
        open_for=args.knock_open_for,
        window=args.knock_window,
        steps=args.knock_steps,
        sources=args.knock_sources,
    )


def _scoped_rules(args: argparse.Namespace) -> tuple[tuple[str | None, SocketRules], ...]:
    """Turn the rule options into (scope, rules) pairs, one per scope."""
    found: dict[str | None, dict[str, list[Any]]] = {}

    def put(option: str, texts: list[str]) -> None:
        for text in texts:
            scope, value = split_scope(text)
            found.setdefault(scope, {}).setdefault(option, []).append(value)

    for option in (
        "allow",
        "deny",
        "allow_file",
        "deny_file",
        "interface",
        "knock",
        "knock_secret",
        "filter",
    ):
        put(option, getattr(args, option))
    for map_name, key, value in args.set:
        scope, name = split_scope(map_name)
        found.setdefault(scope, {}).setdefault("set", []).append(MapSetting(name, key, value))

    settings = _knock_settings(args)
    out = []
    for scope, opts in found.items():
        where = f" for {scope}" if scope else ""
        allow = [parse_option_prefix("--allow", c) for c in opts.get("allow", [])]
        deny = [parse_option_prefix("--deny", c) for c in opts.get("deny", [])]
        for path in opts.get("allow_file", []):
            allow += read_rule_file(path)
        for path in opts.get("deny_file", []):
            deny += read_rule_file(path)
        knocks, secrets = opts.get("knock", []), opts.get("knock_secret", [])
        if len(knocks) + len(secrets) > 1:
            raise AlfError(
                "--knock",
                f"more than one knock rule{where}",
                "give one --knock or --knock-secret per socket",
                EX_USAGE,
            )
        knock = None
        if knocks:
            try:
                ports = parse_ports(knocks[0])
            except ValueError as err:
                raise AlfError(
                    "--knock", str(err), "give source ports in knock order", EX_USAGE
                ) from None
            knock = replace(settings, ports=ports)
        elif secrets:
            knock = replace(settings, secret=knocking.read_secret(secrets[0]))
        filters = opts.get("filter", [])
        if len(filters) > 1:
            raise AlfError(
                "--filter",
                f"more than one filter{where}",
                "compose the logic in one C file",
                EX_USAGE,
            )
        sets = tuple(opts.get("set", []))
        custom = CustomFilter(filters[0] if filters else "", sets) if filters or sets else None
        interfaces = tuple(opts.get("interface", []))
        for name in interfaces:
            if not name or len(name) > 15 or "/" in name or name.isspace():
                raise AlfError(
                    "--interface",
                    f"{excerpt(name)} is not an interface name",
                    "give a name such as eth0 or wg0",
                    EX_USAGE,
                )
        out.append(
            (scope, SocketRules(SubnetRules(tuple(allow), tuple(deny)), interfaces, knock, custom))
        )
    return tuple(out)


def parse_config(argv: Sequence[str]) -> tuple[Config, argparse.Namespace]:
    """Parse the wrapper's arguments; COMMAND is everything after the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
    else:
        options, command = argv, []
    args = _parser().parse_args(options)
    config = Config(listens=tuple(args.listens), rules=_scoped_rules(args), command=tuple(command))
    return config, args


def _check_sets_have_filter(config: Config, names: Sequence[str]) -> None:
    for scope, rules in config.rules:
        if rules.custom and rules.custom.sets and not rules.custom.path:
            targets = [scope] if scope else (names or [""])
            for name in targets:
                if config.rules_for(name).custom is None:
                    raise AlfError(
                        "--set",
                        f"no --filter for {'socket ' + name if name else 'it'}",
                        "--set fills the maps of a --filter",
                        EX_USAGE,
                    )


def print_programs(config: Config) -> int:
    _check_sets_have_filter(config, sorted(config.scopes))
    targets: list[str | None] = [None, *sorted(config.scopes)]
    for scope in targets:
        rules = config.rules_for(scope or "")
        header = f"sockets named {scope}" if scope else "every socket"
        if rules.empty:
            sys.stdout.write(f"/* {header}: no rules, no filter */\n")
            continue
        sys.stdout.write(f"/* ===== {header} ===== */\n")
        sys.stdout.write(program.render(program.plan_program(rules)))
    return 0


def run_wrapper(config: Config, print_filter: bool) -> int:
    """Sockets in, filters on, exec.  Returns only on --print-filter."""
    if print_filter:
        return print_programs(config)
    if not config.command:
        raise AlfError("usage", "no COMMAND given", "put the program to run after --", EX_USAGE)
    if shutil.which(config.command[0]) is None:
        raise AlfError(
            f"COMMAND {config.command[0]}",
            "not found or not executable",
            "give a path or a program on PATH",
            EX_NOINPUT,
        )
    inherited, stored = activation.inherit_sockets(os.environ, os.getpid())
    created = [(sockets.open_socket(spec), spec) for spec in config.listens]
    if not inherited and not created:
        raise AlfError(
            "sockets",
            "none inherited (LISTEN_FDS unset) and none to create",
            "add --listen [::]:PORT, or start from a socket unit",
            EX_USAGE,
        )
    all_sockets: list[socket.socket] = [s for s, _ in inherited] + [s for s, _ in created]
    names = [n for _, n in inherited] + [spec.name for _, spec in created]
    unknown = config.scopes - set(names)
    if unknown:
        raise AlfError(
            f"rules for {sorted(unknown)[0]}",
            "no socket has that name",
            f"socket names: {', '.join(sorted(set(names)))}; name created "
            "sockets with --name, inherited ones with FileDescriptorName=",
            EX_USAGE,
        )
    _check_sets_have_filter(config, names)
    # Which program each socket gets: (rules, with the restart hook?), or None.
    # Sockets systemd keeps across restarts (inherited, not Accept=yes) get the
    # hook where the fd store can keep its map; on a restart, the map comes back
    # and the new program goes into it instead of onto the (locked) socket.
    under_systemd = bool(os.environ.get("NOTIFY_SOCKET"))
    handles: dict[int, int] = {}
    for sock, _ in inherited:
        if not activation.is_connected_stream(sock):
            handle = stored.get(store_key(sock))
            if handle is not None:
                handles[id(sock)] = handle
    kept = {id(s) for s, _ in inherited if not activation.is_connected_stream(s)}
    wants: dict[int, tuple[SocketRules, bool] | None] = {}
    for sock, name in zip(all_sockets, names, strict=True):
        rules = config.rules_for(name)
        if id(sock) in handles:
            wants[id(sock)] = (rules, False)  # empty rules: a pass-all program
        elif rules.empty:
            wants[id(sock)] = None
        else:
            wants[id(sock)] = (rules, id(sock) in kept and under_systemd)
    plans = {key: program.plan_program(*key) for key in set(wants.values()) if key}
    wanted = sorted({i for plan in plans.values() for i in plan.rules.interfaces})
    indexes = interfaces.resolve(wanted) if wanted else {}

    def ifindex_of(text: str) -> int | None:
        return interfaces.link_index(text)

    loaded = {
        key: compiler.load_program(plan, {indexes[n]: n for n in key[0].interfaces}, ifindex_of)
        for key, plan in plans.items()
    }
    # The knock part tells a listener's handshake from an accepted connection's
    # traffic by the socket's cookie: it must know its listeners before any
    # packet reaches them.
    listeners: dict[Any, list[int]] = {}
    for sock in all_sockets:
        key = wants[id(sock)]
        if key and key[0].knock and sock.type == socket.SOCK_STREAM:
            listeners.setdefault(key, []).append(attach.socket_cookie(sock))
    for key, cookies in listeners.items():
        compiler.set_knock_listeners(loaded[key].bpf, cookies)
    unfiltered = []
    for sock, name in zip(all_sockets, names, strict=True):
        key = wants[id(sock)]
        if key is None:
            unfiltered.append((sock, name))
        elif id(sock) in handles:
            compiler.set_next(handles[id(sock)], loaded[key].fd)
        else:
            attach_kept_aware(sock, loaded[key], id(sock) in kept)
    for sock, _ in inherited:
        key = wants[id(sock)]
        if (
            key
            and not key[0].empty
            and not check_backlog(sock, key[0], loaded[key].fd, config.command[0])
        ):
            return 0
    for sock, spec in created:
        sockets.bind_socket(sock, spec)
    for sock, name in unfiltered:
        print(
            f"alfwrapper: note: {attach.describe(sock)} named {excerpt(name)} has no rules and is "
            "not filtered",
            file=sys.stderr,
        )
    following = [lf for lf in loaded.values() if lf.plan.rules.interfaces]
    if following:
        interfaces.start_watcher(
            [
                interfaces.WatchedMap(
                    lf.bpf[b"iface_allowed"].map_fd,
                    lf.plan.rules.interfaces,
                    lf.bpf[b"iface_alive"].map_fd,
                )
                for lf in following
            ],
            os.path.basename(config.command[0]),
        )
    privileges.drop_privileges()
    activation.exec_with_sockets(all_sockets, names, config.command, os.environ)


def store_key(sock: socket.socket) -> str:
    """The fd store name of a socket's restart hook: the socket's inode identifies it."""
    return f"{activation.STORE_PREFIX}{os.fstat(sock.fileno()).st_ino}"


def attach_kept_aware(sock: socket.socket, loaded: compiler.LoadedFilter, kept: bool) -> None:
    """Attach and lock; for a socket systemd keeps, also store the program's restart hook."""
    try:
        attach.attach_filter(sock, loaded.fd)
    except AlfError as err:
        if not kept or err.exit_code != EX_NOPERM:
            raise
        raise AlfError(
            f"filtering {attach.describe(sock)}",
            "it still carries the locked filter of an earlier start, and systemd no longer "
            "holds that filter's restart hook (the service stopped while its socket stayed)",
            "restart the socket unit (systemctl restart NAME.socket); the old rules stay in "
            "force until then",
            EX_CONFIG,
        ) from None
    if loaded.plan.hook:
        activation.store_fd(loaded.bpf[b"alf_next"].map_fd, store_key(sock), os.environ)


def check_backlog(sock: socket.socket, rules: SocketRules, prog_fd: int, command: str) -> bool:
    """Judge what reached an inherited socket before its filter (backlog.py).

    Returns False when the socket is a denied Accept=yes connection: it has
    been reset and COMMAND must not start.
    """
    where = attach.describe(sock)
    judge = backlog.program_judge(prog_fd, bool(rules.interfaces))
    if activation.is_connected_stream(sock):
        if rules.knock or rules.interfaces:
            kind = "knocking" if rules.knock else "--interface"
            raise AlfError(
                f"{where}",
                f"{kind} cannot check a connection handed over already accepted (Accept=yes)",
                "use Accept=no for this socket, or leave that rule out",
                EX_CONFIG,
            )
        try:
            peer = sock.getpeername()[0]
        except OSError:
            peer = "a peer that has already reset it"
        if backlog.connected_peer_allowed(sock, judge):
            return True
        backlog.reset(sock)
        print(
            f"alfwrapper: note: connection from {peer} denied and reset; {command} not started",
            file=sys.stderr,
        )
        return False
    try:
        if sock.type == socket.SOCK_STREAM:
            report = backlog.purge_listener(sock, judge)
        else:
            report = backlog.purge_datagrams(sock, judge)
    except OSError as err:
        raise AlfError(
            f"checking what reached {where} before its filter",
            err.strerror or str(err),
            "run `alfwrapper doctor`",
            EX_OSERR,
        ) from None
    if report.removed:
        print(f"alfwrapper: note: {where}: {report}", file=sys.stderr)
    return True


def knock_main(argv: Sequence[str]) -> int:
    p = _Parser(
        prog="alfwrapper knock",
        usage="alfwrapper knock HOST PORT (--sequence P,P,P | --secret FILE) [--udp]",
    )
    p.add_argument("host")
    p.add_argument("port", type=int)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sequence", metavar="P,P,P")
    which.add_argument("--secret", metavar="FILE")
    p.add_argument("--steps", type=int, default=3, help="secret sequences' length (default 3)")
    p.add_argument("--window", type=int, default=30, help="secret window seconds (default 30)")
    p.add_argument("--udp", action="store_true", help="knock with UDP datagrams")
    args = p.parse_args(argv)
    if not 0 < args.port < 65536:
        raise AlfError(
            "knock", f"port {args.port} is out of range", "ports are 1 to 65535", EX_USAGE
        )
    if not 5 <= args.window <= 3600 or not 1 <= args.steps <= 8:
        raise AlfError(
            "knock",
            "--window must be 5 to 3600 and --steps 1 to 8",
            "use the server's --knock-window and --knock-steps",
            EX_USAGE,
        )
    if args.sequence:
        try:
            ports = parse_ports(args.sequence)
        except ValueError as err:
            raise AlfError(
                "--sequence", str(err), "give source ports in knock order", EX_USAGE
            ) from None
    else:
        secret = knocking.read_secret(args.secret)
        ports = knocking.secret_ports(secret, knocking.utc_window(args.window), args.steps)
    knocking.send_knocks(args.host, args.port, ports, udp=args.udp)
    print(f"knocked on {args.host} port {args.port} from ports {','.join(map(str, ports))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    options = argv[: argv.index("--")] if "--" in argv else argv
    verbose = "-v" in options or "--verbose" in options
    try:
        if argv[:1] == ["doctor"]:
            return doctor.main(argv[1:])
        if argv[:1] == ["knock"]:
            return knock_main(argv[1:])
        config, args = parse_config(argv)
        return run_wrapper(config, args.print_filter)
    except AlfError as err:
        print(err.line(), file=sys.stderr)
        if verbose and err.details:
            print(err.details.rstrip(), file=sys.stderr)
        if err.exit_now:
            sys.stderr.flush()
            os._exit(err.exit_code)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # never a traceback unless asked for
        print(
            f"alfwrapper: internal error: {type(err).__name__}: {err} "
            "(please report it with the output of -v)",
            file=sys.stderr,
        )
        if verbose:
            traceback.print_exc()
        return EX_SOFTWARE
