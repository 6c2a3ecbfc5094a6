"""Explain one verdict: build and load the real program for a socket, run it on a packet
from the given source (BPF_PROG_TEST_RUN), and say whether it passed and which part and
rule decided.  The verdict and the deciding part are the kernel's (its per-reason
counters say which part dropped the packet); which rule matched is looked up here."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import time
from typing import Any

from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import BY_REASON, SETS, Dropped, FillEnv
from alfwrapper.errors import (
    EX_NOPERM,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_USAGE,
    AlfError,
    excerpt,
)
from alfwrapper.host import bpf_calls, interfaces
from alfwrapper.host.bpf_calls import prog_test_run
from alfwrapper.host.frames import tcp_syn_frame, udp_frame
from alfwrapper.policy.files import SPA_SUFFIX, Policy, RuleSource
from alfwrapper.policy.prefix_list import PrefixList
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import ListenSpec, SocketRules
from alfwrapper.record import Record, replace

_SERVER = {4: 0xC0000201, 6: (0x20010DB8 << 96) | 1}  # where the packet goes, if not known


class Verdict(Record):
    passed: bool
    part: str | None  # the part that dropped it, or None
    rule: str  # what decided, in words

    def text(self) -> str:
        if self.passed:
            return f"passed{': ' + self.rule if self.rule else ''}"
        return f"dropped by {self.part}: {self.rule}"

    def json(self, **extra: object) -> str:
        return json.dumps(
            {
                "verdict": "pass" if self.passed else "drop",
                "part": self.part,
                "rule": self.rule,
                **extra,
            }
        )


def parse_source(text: str) -> Prefix:
    """The packet's source: an IPv4 or IPv6 address.  An IPv4-mapped IPv6 address
    (::ffff:a.b.c.d, how applications log IPv4 clients of a dual-stack socket) is
    that IPv4 client."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise AlfError(
            "--from", f"{excerpt(text)} is not an IP address", "give an address", EX_USAGE
        ) from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return parse_prefix(str(address))


def _line_in_file(path: str, prefix: Prefix) -> str:
    """Where in a rule file this CIDR is written: FILE line N."""
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                text = line.split("#", 1)[0].strip()
                if text:
                    try:
                        if parse_prefix(text) == prefix:
                            return f"{path} line {number}"
                    except ValueError:
                        continue
    except OSError:
        pass
    return path


def _origin(source: RuleSource, prefix: Prefix) -> str:
    if source.path:
        return _line_in_file(source.path, prefix)
    where, _, line = source.origin.rpartition(":")
    return f"{where} line {line}" if where and line.isdigit() else source.origin


def _matches(
    sources: tuple[RuleSource, ...], kind: str, address: Prefix
) -> list[tuple[Prefix, str]]:
    """The rules of this kind that cover the address, longest first, with where they are."""
    found = []
    for source in sources:
        if source.kind != kind:
            continue
        for p in PrefixList.of(source.prefixes).covering(address.family, address.value):
            found.append((p, source))
    found.sort(key=lambda item: -item[0].length)
    return [(p, _origin(s, p)) for p, s in found]


def held_by_sets(rules: SocketRules, address: Prefix) -> dict[str, str]:
    """The entry of each named set of the socket's that holds the address, as words."""
    if not (rules.allow_sets or rules.deny_sets):
        return {}
    from alfwrapper import sets  # noqa: PLC0415

    held = {}
    for name in (*rules.deny_sets, *rules.allow_sets):
        found = sets.holding(name, address.family, address.value) if sets.exists(name) else None
        if found is not None:
            entry, expiry = found
            left = max(0.0, (expiry - sets.now_ns()) / 1e9)
            held[name] = f"{entry} in set {name}" + (f", lapsing in {left:.0f} s" if expiry else "")
    return held


def describe(
    rules: SocketRules,
    address: Prefix,
    ingress: str,
    part: str | None,
    passed: bool,
    held: dict[str, str] | None = None,
) -> str:
    addr = str(address).rsplit("/", 1)[0]
    denies = _matches(rules.sources, "deny", address)
    allows = _matches(rules.sources, "allow", address)
    held = held or {}
    if passed:
        if allows:
            return f"{addr} matches allow {allows[0][0]} ({allows[0][1]})"
        member = next((held[n] for n in rules.allow_sets if n in held), "")
        if member:
            return f"{addr} matches allow-set entry {member}"
        if rules.subnets.deny or rules.deny_sets:
            return f"{addr} matches no deny rule"
        return ""
    denied_by = next((held[n] for n in rules.deny_sets if n in held), "")
    if part == "subnets" and denied_by:
        return f"{addr} matches deny-set entry {denied_by}"
    if part == "subnets" and rules.allow_sets and not denies:
        return SETS.why(rules, Dropped(addr, ingress))
    if part in BY_REASON:
        deny = f"{denies[0][0]} ({denies[0][1]})" if denies else ""
        return BY_REASON[part].why(rules, Dropped(addr, ingress, deny))
    return "not an IPv4 or IPv6 packet alfwrapper can read"


def main(policy: Policy, args: argparse.Namespace) -> int:
    specs = {spec.name: spec for spec in policy.listens}
    name = args.socket
    if not name and len(specs) == 1:
        name = next(iter(specs))
    if name and name not in specs and name not in policy.names:
        known = ", ".join(sorted(set(specs) | policy.names)) or "none"
        raise AlfError(
            f"--socket {excerpt(name)}",
            "the policy has no socket of that name",
            f"its sockets: {known}",
            EX_USAGE,
        )
    rules = policy.rules_for(name)
    spec = specs.get(name)
    protocol = args.protocol or (("tcp" if spec.kind == "stream" else "udp") if spec else "tcp")
    port = args.port or (spec.port if spec else 1)
    if not 0 < port < 65536 or not 0 < args.source_port < 65536:
        raise AlfError("explain", "ports are 1 to 65535", "give --port N", EX_USAGE)
    sources = [parse_source(text) for text in args.sources]
    where = {"socket": name or None, "protocol": protocol, "port": port}
    if rules.empty:
        for text in args.sources:
            verdict = Verdict(True, None, "the socket has no rules and is not filtered")
            print(verdict.json(source=text, **where) if args.json else verdict.text())
        return 0
    wanted = list(rules.interfaces)
    if args.ingress and args.ingress not in wanted:
        wanted.append(args.ingress)
    indexes = interfaces.resolve(wanted) if wanted else {}
    env = FillEnv(
        {i: n for n, i in indexes.items() if n in rules.interfaces}, interfaces.link_index
    )
    if rules.allow_sets or rules.deny_sets:
        from alfwrapper import sets  # noqa: PLC0415

        env = sets.check_env(env)
    if args.spa_datagram is not None:
        return _spa(policy, name, rules, env, args, sources, where)
    loaded = compiler.load_program(program.plan_program(rules), env)
    for text, source in zip(args.sources, sources, strict=True):
        verdict = judge(loaded, rules, spec, source, protocol, port, args, indexes)
        print(verdict.json(source=text, **where) if args.json else verdict.text())
    return 0


def judge(
    loaded: compiler.LoadedFilter,
    rules: SocketRules,
    spec: ListenSpec | None,
    source: Prefix,
    protocol: str,
    port: int,
    args: argparse.Namespace,
    indexes: dict[str, int],
) -> Verdict:
    """The kernel's verdict on one packet, and the part whose counter moved."""
    destination = _SERVER[source.family]
    if spec and spec.host not in ("::", "0.0.0.0"):
        host = parse_prefix(spec.host)
        destination = host.value if host.family == source.family else destination
    if protocol == "tcp":
        frame = tcp_syn_frame(source.family, source.value, args.source_port, destination, port)
    else:
        frame = udp_frame(
            source.family,
            source.value,
            b"alfwrapper explain\n",
            args.source_port,
            destination,
            port,
        )
    before = compiler.counters(loaded)
    run = prog_test_run(loaded.fd, frame, ingress_ifindex=indexes.get(args.ingress, 0))
    after = compiler.counters(loaded)
    decided = [reason for reason in after if after[reason] != before[reason]]
    passed = run.retval != 0
    part = None if passed else (decided[0] if decided else "filter")
    held = held_by_sets(rules, source)
    return Verdict(passed, part, describe(rules, source, args.ingress, part, passed, held))


def _spa(
    policy: Policy,
    name: str,
    rules: SocketRules,
    env: FillEnv,
    args: argparse.Namespace,
    sources: list[Prefix],
    where: dict[str, object],
) -> int:
    """--spa-datagram: the verdict of the socket's SPA socket's program on the datagram,
    from each source, each in a program of its own: as a datagram the socket has never
    seen (what it saw before is the service's), at any time (not only after a start)."""
    from alfwrapper.bpf.parts import SPA_VERDICTS  # noqa: PLC0415
    from alfwrapper.policy import spa  # noqa: PLC0415

    if rules.knock is None or not rules.knock.spa:
        raise AlfError(
            "--spa-datagram",
            f"socket {name or 'unknown'} has no knock-spa",
            "give --knock-spa with --knock-secret or --knock-spa-key",
            EX_USAGE,
        )
    try:
        raw = bytes.fromhex(args.spa_datagram)
    except ValueError:
        raise AlfError(
            "--spa-datagram",
            "is not hexadecimal",
            "give the datagram's bytes as hexadecimal digits",
            EX_USAGE,
        ) from None
    door = policy.rules_for(f"{name}{SPA_SUFFIX}")
    spec = {s.name: s for s in policy.listens}.get(name)
    port = rules.knock.spa_port or args.port or (spec.port if spec else 1)
    shared = spa.key_id(rules.knock.secret) if rules.knock.secret else None
    fields = spa.read(raw, spa.keys(rules.knock.secret, rules.knock.spa_keys), shared)
    for text, source in zip(args.sources, sources, strict=True):
        loaded = compiler.load_program(program.plan_program(door), env)
        since = loaded.tables[b"knock_spa_since"]
        since[since.Key(0)] = since.Leaf(0)
        counts = loaded.tables[b"knock_spa_counts"]
        frame = udp_frame(
            source.family, source.value, raw, args.source_port, _SERVER[source.family], port
        )
        prog_test_run(loaded.fd, frame)
        said = next(v for i, v in enumerate(SPA_VERDICTS) if sum(counts.per_cpu(counts.Key(i))))
        opened = (fields.address or str(source).rsplit("/", 1)[0]) if fields else ""
        rule = f"SPA datagram {said.replace('_', ' ')}" + (
            f": opens {opened} for {rules.knock.open_for:g} s" if said == "accepted" else ""
        )
        verdict = Verdict(False, "knocking", rule)
        print(verdict.json(source=text, spa=said, **where) if args.json else verdict.text())
    return 0


# --- explain SERVICE: the verdict of what is in force on a running service's socket ---

# The maps a program borrows from the socket's pinned state to judge as the program in
# force does, which it only reads: its runtime rules.  Its counters, drop log and knock
# state stay its own (a judged packet must move no counter, log no drop, and take no
# knock step); the source's knock state is copied in (running_knock_state).
_BORROWED = ("alf_runtime", "alf_runtime_count")


def main_service(service: str, args: argparse.Namespace, build: Any) -> int:
    """explain SERVICE: for each source, the verdict of the program in force on the
    service's socket that would receive the packet, judged by a program built from the
    very rules in force (checked against the fingerprint the start or reload kept),
    reading the socket's runtime rules, the named sets and the source's knock state as
    they are now."""
    from alfwrapper import state  # noqa: PLC0415
    from alfwrapper.lifecycle import service as running  # noqa: PLC0415

    if args.spa_datagram is not None:
        raise AlfError(
            "--spa-datagram",
            "is for explain --policy",
            "give --policy NAME instead of the service",
            EX_USAGE,
        )
    sources = [parse_source(text) for text in args.sources]
    # Its sockets whose process runs (a socket of a namespace since deleted is not known
    # to be gone, and keeps its rules until collected: not the one in force).
    found = [
        m
        for m in running.members(service, args.socket, gone=False)
        if state.alive(m.meta.get("pid")) and (args.socket or not m.name.endswith(SPA_SUFFIX))
    ]
    if not found:
        raise AlfError(
            f"explaining {service}",
            "none of its sockets' processes runs",
            "is it running? start it",
            EX_USAGE,
        )
    rules = rules_in_force(service, found, build)
    judged: dict[int, tuple[compiler.LoadedFilter, dict[str, int]]] = {}
    for text, source in zip(args.sources, sources, strict=True):
        member = receiver(service, found, source, args)
        protocol = str(member.meta.get("protocol", "tcp"))
        port = int(str(member.meta.get("port", 0)))
        spec = ListenSpec(
            "stream" if protocol == "tcp" else "datagram",
            str(member.meta.get("address", "::")),
            port,
            member.name,
        )
        socket_rules = rules[id(member)]
        where = {
            "service": service,
            "socket": member.name,
            "protocol": protocol,
            "address": spec.host,
            "port": port,
        }
        if socket_rules.empty and not running.runtime_rule_count([member]):
            verdict = Verdict(True, None, "the socket has no rules and is not filtered")
        else:
            if member.pins.cookie not in judged:
                check_in_force(service, member)
                judged[member.pins.cookie] = _load_like(service, member, socket_rules)
            loaded, indexes = judged[member.pins.cookie]
            copy_knock_state(loaded, member, source)
            verdict = judge(loaded, socket_rules, spec, source, protocol, port, args, indexes)
            verdict = _with_runtime(verdict, member, source)
        print(verdict.json(source=text, **where) if args.json else verdict.text())
    return 0


def rules_in_force(service: str, found: list[Any], build: Any) -> dict[int, SocketRules]:
    """Each socket's rules, built again from the options and working directory its start
    or reload kept, and refused unless they are those in force: a policy or rule file
    changed since (or another alfwrapper) would give an answer about other rules."""
    from alfwrapper.lifecycle import service as running  # noqa: PLC0415

    options = running.stored_options(service, found)
    cwd = str(found[0].meta.get("cwd", "/"))
    here = os.getcwd()
    try:
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths in the stored options meant that folder
        policy = build(options)
    finally:
        os.chdir(here)
    rules = {id(m): policy.rules_for(m.name) for m in found}
    for m in found:
        kept = m.meta.get("fingerprint")
        # As the start took it (rule files by identity where all were settled, else by
        # their contents), or by contents now (a file that settled since).
        if kept not in (rules[id(m)].fingerprint(), rules[id(m)].fingerprint(cheap=False)):
            since = m.meta.get("reloaded") or m.meta.get("started") or 0
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(str(since))))
            raise AlfError(
                f"explaining {service}",
                f"the rules of socket {m.title()} are not those its start or reload at "
                f"{when} put in force"
                + ("" if kept else " (it keeps no fingerprint: an older alfwrapper)")
                + ": its policy or rule files changed since",
                f"`alfwrapper reload {service}` puts the files in force; `alfwrapper "
                "explain --policy ...` says what the files would do",
                EX_TEMPFAIL,
            )
    return rules


def receiver(service: str, found: list[Any], source: Prefix, args: argparse.Namespace) -> Any:
    """The socket a packet from ``source`` to --port (and --protocol) would reach: one
    socket name, and of its sockets the first that takes the source's family."""
    chosen = [
        m
        for m in found
        if (not args.port or m.meta.get("port") == args.port)
        and (not args.protocol or m.meta.get("protocol") == args.protocol)
    ]
    names = sorted({m.name for m in chosen})
    if len(names) != 1:
        shown = ", ".join(sorted({m.title() for m in (chosen or found)})) or "none"
        raise AlfError(
            f"explaining {service}",
            f"{'more than one socket' if names else 'no socket'} fits",
            f"name one with --socket NAME or --port P; its sockets: {shown}",
            EX_USAGE,
        )

    def takes(m: Any) -> bool:
        address = str(m.meta.get("address", ""))
        if source.family == 4:
            return ":" not in address or address in ("::", "::ffff:0.0.0.0")
        return ":" in address

    fitting = [m for m in chosen if takes(m)]
    if not fitting:
        raise AlfError(
            f"explaining {service}",
            f"socket {names[0]} takes no IPv{source.family} packets",
            "give an address of the other family",
            EX_USAGE,
        )
    return fitting[0]


def check_in_force(service: str, member: Any) -> None:
    """The program in the socket's slot is the one its meta describes (a start or reload
    under way, or state changed by hand, would be judged by other rules)."""
    from alfwrapper import state  # noqa: PLC0415

    slot = state.open_pin(member.pins, "slot")
    try:
        raw = bpf_calls.map_lookup(slot, b"\0\0\0\0", 4)
    finally:
        os.close(slot)
    running = int.from_bytes(raw, "little") if raw else 0
    if not running or running != member.meta.get("program"):
        raise AlfError(
            f"explaining {service}",
            f"socket {member.title()} runs "
            + (f"program {running}" if running else "no program")
            + f", not the one its start or reload recorded ({member.meta.get('program')})",
            "a start or reload may be under way: try again, or restart the service",
            EX_TEMPFAIL,
        )


def _load_like(
    service: str, member: Any, rules: SocketRules
) -> tuple[compiler.LoadedFilter, dict[str, int]]:
    """A program like the one in force on the socket (the same rules, in its network
    namespace for interface names), borrowing the socket's runtime rules; and the
    interface indexes it knows."""
    from alfwrapper import sets  # noqa: PLC0415
    from alfwrapper.bpf.parts import Pins  # noqa: PLC0415
    from alfwrapper.lifecycle import service as running  # noqa: PLC0415

    plan = program.plan_program(
        replace(rules, log_rate=0),
        Pins(str(member.pins.dir), str(member.pins.service_dir)),
        member.program_label(),
    )
    plan = replace(plan, pinned=tuple(p for p in plan.pinned if p[0] in _BORROWED), borrowed=True)
    app = int(str(member.meta.get("pid", 0)) or 0)
    with running.service_netns(service, member.meta.get("netns"), app):
        indexes = interfaces.resolve(list(rules.interfaces)) if rules.interfaces else {}
        env = FillEnv({i: n for n, i in indexes.items()}, interfaces.link_index)
        env = sets.fill_env(env, [rules]) if rules.allow_sets or rules.deny_sets else env
        loaded = compiler.load_program(plan, env)
    return loaded, indexes


def copy_knock_state(loaded: compiler.LoadedFilter, member: Any, source: Prefix) -> None:
    """The source's knock state as the service's sockets share it (opened by a knock or
    an SPA datagram, or on its way), copied into the judging program's own map."""
    folders = [str(f) for f in member.meta.get("knock") or [] if f != "knock-spa"]
    if b"knock_state" not in loaded.tables or not folders:
        return
    own = loaded.tables[b"knock_state"].map_fd
    _, key_size, value_size, _, _ = bpf_calls.map_shape(own)
    width = 4 if source.family == 4 else 16
    key = bytes([source.family, 0, 0, 0]) + source.value.to_bytes(width, "big").ljust(16, b"\0")
    if len(key) != key_size:  # knocking.c's struct knock_key changed without this
        raise AlfError(
            "explain", f"a knock key of {key_size} bytes", "a bug: report it", EX_SOFTWARE
        )
    path = member.pins.service_dir / folders[0] / "state"
    try:
        shared = bpf_calls.obj_get(str(path), read_only=True)
    except OSError as err:
        raise AlfError(
            f"knock state {path}",
            err.strerror or str(err),
            "is the service running? run as root",
            EX_NOPERM,
        ) from None
    try:
        value = bpf_calls.map_lookup(shared, key, value_size)
    finally:
        os.close(shared)
    if value is not None:
        bpf_calls.map_update(own, key, value)
    else:
        bpf_calls.map_delete(own, key)


def _with_runtime(verdict: Verdict, member: Any, source: Prefix) -> Verdict:
    """Name the runtime rule that decided, when one covers the source (the most specific
    decides, as in runtime.c)."""
    from alfwrapper import state  # noqa: PLC0415
    from alfwrapper.bpf.parts import RUNTIME_DENY  # noqa: PLC0415

    width = 32 if source.family == 4 else 128
    covering = [
        (length, value, said)
        for family, value, length, said in state.runtime_rules(member.pins)
        if family == source.family
        and source.value >> (width - length) << (width - length)
        == value >> (width - length) << (width - length)
    ]
    if not covering:
        return verdict
    length, value, said = max(covering)
    prefix = Prefix(source.family, value, length)
    kind = "deny" if said == RUNTIME_DENY else "allow"
    words = f"{str(source).rsplit('/', 1)[0]} matches runtime {kind} {prefix} (alfwrapper {kind})"
    if not verdict.passed and verdict.part == "subnets" and kind == "deny":
        return Verdict(False, "runtime", words)
    if verdict.passed and kind == "allow":
        return Verdict(True, None, words)
    return verdict
