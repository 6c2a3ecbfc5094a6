"""Explain one verdict: build and load the real program for a socket, run it on a packet
from the given source (BPF_PROG_TEST_RUN), and say whether it passed and which part and
rule decided.  The verdict and the deciding part are the kernel's (its per-reason
counters say which part dropped the packet); which rule matched is looked up here."""

from __future__ import annotations

import argparse
import ipaddress
import json

from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import BY_REASON, SETS, Dropped, FillEnv
from alfwrapper.errors import EX_USAGE, AlfError, excerpt
from alfwrapper.host import interfaces
from alfwrapper.host.bpf_calls import prog_test_run
from alfwrapper.host.frames import tcp_syn_frame, udp_frame
from alfwrapper.policy.files import SPA_SUFFIX, Policy, RuleSource
from alfwrapper.policy.prefix_list import PrefixList
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import ListenSpec, SocketRules
from alfwrapper.record import Record

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
        with open(path, encoding="utf-8") as f:  # noqa: PTH123
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
        raise AlfError("--spa-datagram", f"socket {name or 'unknown'} has no knock-spa",
                       "give --knock-spa with --knock-secret", EX_USAGE)  # fmt: skip
    try:
        raw = bytes.fromhex(args.spa_datagram)
    except ValueError:
        raise AlfError("--spa-datagram", "is not hexadecimal", "give the datagram's bytes "
                       "as hexadecimal digits", EX_USAGE) from None  # fmt: skip
    door = policy.rules_for(f"{name}{SPA_SUFFIX}")
    spec = {s.name: s for s in policy.listens}.get(name)
    port = rules.knock.spa_port or args.port or (spec.port if spec else 1)
    fields = spa.read(raw, spa.key_of(rules.knock.secret))
    for text, source in zip(args.sources, sources, strict=True):
        loaded = compiler.load_program(program.plan_program(door), env)
        since = loaded.tables[b"knock_spa_since"]
        since[since.Key(0)] = since.Leaf(0)
        counts = loaded.tables[b"knock_spa_counts"]
        frame = udp_frame(source.family, source.value, raw, args.source_port,
                          _SERVER[source.family], port)  # fmt: skip
        prog_test_run(loaded.fd, frame)
        said = next(v for i, v in enumerate(SPA_VERDICTS) if sum(counts.per_cpu(counts.Key(i))))
        opened = (fields.address or str(source).rsplit("/", 1)[0]) if fields else ""
        rule = f"SPA datagram {said.replace('_', ' ')}" + (
            f": opens {opened} for {rules.knock.open_for:g} s" if said == "accepted" else ""
        )
        verdict = Verdict(False, "knocking", rule)
        print(verdict.json(source=text, spa=said, **where) if args.json else verdict.text())
    return 0
