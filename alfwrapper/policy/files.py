"""The one policy model: the sockets to create and every socket's rules, from argv, files, or both.

Pure Python, no kernel.  Rules arrive as entries (a key such as "allow", an
optional socket name, a value, and where it was written), from the command
line and from TOML policy files alike; ``build_policy`` is the one place that
turns entries into a ``Policy``.  The wrapper, ``check`` and ``explain`` all
start from a Policy; none parses rule options on its own.

Layers: a policy file, then its drop-ins in name order, then the command
line.  List keys add up across layers, and an empty list in a later layer
clears what earlier layers gave (like an empty assignment in a systemd
drop-in).  Single keys (a knock rule, a filter) and knock settings are
replaced by a later layer; twice in one layer is an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from alfwrapper.errors import EX_CONFIG, EX_NOINPUT, EX_USAGE, AlfError, excerpt
from alfwrapper.policy.inputs import look, read_input
from alfwrapper.policy.prefix_list import PrefixList, read_rule_file
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import (
    MOST_SETS,
    SET_NAME_RULE,
    SOCKET_NAME_RULE,
    CustomFilter,
    KnockRules,
    ListenSpec,
    MapSetting,
    Setting,
    SocketRules,
    SubnetRules,
    parse_listen,
    parse_ports,
    settings,
    valid_set_name,
    valid_socket_name,
)
from alfwrapper.record import Record, replace

# Where `--policy NAME` looks, first match wins (the administrator's, then a
# local install's, then a package's); ALFWRAPPER_POLICY_PATH replaces the list.
POLICY_DIRS = (
    "/etc/alfwrapper/policy",
    "/usr/local/lib/alfwrapper/policy",
    "/usr/lib/alfwrapper/policy",
)
POLICY_LIMIT = 1 << 20
_NAME = re.compile(r"^[A-Za-z0-9_.@-]+$")
SCOPE = "@scope"  # an entry that only names a socket: a [socket.NAME] table


class Key(Record):
    """One rule key: how it combines across layers, and its range if it is a setting."""

    kind: str  # "list", "single" (one per scope and layer), "setting" or "switch"
    help: str
    slot: str = ""  # single keys that exclude each other share a slot
    number: type = float
    low: float = 0.0
    high: float = 0.0
    least: float = 0.0  # below this the feature cannot work (a round trip)


# The rule fields a key sets, one number or switch each: declared on their records.
SETTINGS = settings()


def _setting_key(setting: Setting) -> Key:
    """A setting's key, as its field's Rule declares it: a switch, or a number."""
    rule = setting.rule
    if isinstance(setting.default, bool):
        return Key("switch", rule.help)
    return Key("setting", rule.help, number=type(setting.default), low=rule.low,
               high=rule.high, least=rule.least)  # fmt: skip


# Every rule option of the command line, by its long name: its key in a policy file too.
# The keys written here are filled by build_policy's own code; the settings follow
# from their fields' declarations (policy/rules.py: Rule).
KEYS: dict[str, Key] = {
    "allow": Key("list", "pass packets from this subnet (CIDR)"),
    "deny": Key("list", "drop packets from this subnet (deny wins)"),
    "allow-file": Key("list", "--allow for each CIDR in FILE (one per line, # comments)"),
    "deny-file": Key("list", "--deny for each CIDR in FILE"),
    "allow-set": Key("list", "pass packets from the entries of the host's named set NAME"),
    "deny-set": Key("list", "drop packets from the entries of the named set NAME (deny wins)"),
    "interface": Key("list", "pass only packets that arrived on this interface"),
    "knock": Key("single", "port knocking: the source ports of the sequence", slot="knock"),
    "knock-secret": Key(
        "single", "port knocking with sequences derived from a secret", slot="knock"
    ),
    "filter": Key("single", "a developer's filter: restricted C, entry `int filter(...)`"),
    "set": Key("list", "put KEY -> VALUE in the filter's map MAP"),
    **{key: _setting_key(setting) for key, setting in SETTINGS.items()},
    "knock-spa-key": Key(
        "list",
        "a client's own SPA secret (FILE, made as --knock-secret's): it opens for that "
        "client alone, takes no more than its share of the replay table, and goes with "
        "its line",
    ),
}
SWITCHES = {"yes": True, "true": True, "on": True, "1": True,
            "no": False, "false": False, "off": False, "0": False}  # fmt: skip
SPA_SUFFIX = ".spa"  # the SPA socket of the socket NAME is NAME.spa


def accepted(key: str) -> tuple[float, float]:
    """The values setting ``key`` takes, from the least that works to its highest (the
    loader and `alfwrapper knock` check by it)."""
    return SETTINGS[key].rule.accepted()


class Entry(Record):
    """One rule as written: ``--allow web=192.0.2.0/24``, or ``allow = [...]`` in a file."""

    key: str
    scope: str | None
    value: Any  # str, or a tuple for `set`; () clears a list key (files only)
    origin: str  # "--allow", or "FILE:LINE"
    layer: int = 0
    base: str = ""  # the folder relative paths in it resolve against

    def error(self, why: str, hint: str, code: int = 0) -> AlfError:
        return AlfError(self.origin, why, hint, code or self.exit_code)

    @property
    def exit_code(self) -> int:
        """Command-line mistakes are usage errors; policy-file ones configuration errors."""
        return EX_USAGE if self.origin.startswith("--") else EX_CONFIG

    def path(self, text: str) -> str:
        return text if os.path.isabs(text) or not self.base else os.path.join(self.base, text)


class RuleSource(Record):
    """Where a group of subnet rules came from, for `explain`."""

    kind: str  # "allow" or "deny"
    origin: str  # "--deny", "web.toml:4", or a rule file's path
    prefixes: Sequence[Prefix]
    path: str = ""  # a rule file: its own lines say where each CIDR is


class ScopeRules(Record):
    """The rules written for one scope (every socket, or one name), before resolution."""

    allow: Sequence[Prefix] = ()
    deny: Sequence[Prefix] = ()
    interfaces: tuple[str, ...] = ()
    knock_ports: tuple[int, ...] = ()
    knock_secret: bytes = b""
    spa_keys: tuple[bytes, ...] = ()
    settings: tuple[tuple[str, float], ...] = ()
    filter: str = ""
    sets: tuple[MapSetting, ...] = ()
    allow_sets: tuple[str, ...] = ()  # named sets, by name (alfwrapper/sets/)
    deny_sets: tuple[str, ...] = ()
    sources: tuple[RuleSource, ...] = ()
    origins: tuple[tuple[str, str], ...] = ()  # (key, origin) of what was given


class Policy(Record):
    """Everything the wrapper needs, parsed and checked."""

    listens: tuple[ListenSpec, ...] = ()
    scopes: tuple[tuple[str | None, ScopeRules], ...] = ()
    command: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # the policy files read, in order
    scope_origins: tuple[tuple[str, str], ...] = ()  # (name, where it was first named)

    @property
    def names(self) -> set[str]:
        """The socket names the rules are scoped to."""
        return {scope for scope, _ in self.scopes if scope is not None}

    def scope(self, name: str | None) -> ScopeRules:
        return next((r for s, r in self.scopes if s == name), ScopeRules())

    def origin_of_name(self, name: str) -> str:
        return dict(self.scope_origins).get(name, "rules")

    def check_names(self, names: Sequence[str]) -> None:
        """Every name the rules are scoped to must be one of these sockets' names."""
        unknown = sorted(self.names - set(names))
        if unknown:
            origin = self.origin_of_name(unknown[0])
            raise AlfError(
                f"{origin}: rules for {unknown[0]}",
                "no socket has that name",
                f"socket names: {', '.join(sorted(set(names)))}; name created sockets with "
                "--name, inherited ones with FileDescriptorName=",
                EX_USAGE if origin.startswith("--") else EX_CONFIG,
            )

    def rules_for(self, name: str) -> SocketRules:
        """The rules of the socket named ``name``: those for every socket plus its own.

        Lists add up; a knock rule or filter for the name replaces the one for
        every socket; knock settings for the name override those for every
        socket; map settings add up.
        """
        if name.endswith(SPA_SUFFIX):
            guarded = self.rules_for(name[: -len(SPA_SUFFIX)])
            if guarded.knock is not None and guarded.knock.spa:
                # The SPA socket: the same rules up to knocking, which checks datagrams
                # there; no developer's filter (nothing passes it to one).
                return replace(guarded, knock=replace(guarded.knock, verifier=True), custom=None)
        every, own = self.scope(None), self.scope(name)
        chosen = (every, own) if name in self.names else (every,)
        allow: list[Sequence[Prefix]] = []
        deny: list[Sequence[Prefix]] = []
        interfaces: tuple[str, ...] = ()
        sets: tuple[MapSetting, ...] = ()
        allow_sets: tuple[str, ...] = ()
        deny_sets: tuple[str, ...] = ()
        sources: tuple[RuleSource, ...] = ()
        settings: dict[str, float] = {}
        ports: tuple[int, ...] = ()
        secret = b""
        spa_keys: tuple[bytes, ...] = ()
        path = ""
        for r in chosen:
            allow.append(r.allow)
            deny.append(r.deny)
            interfaces += r.interfaces
            sets += r.sets
            allow_sets += r.allow_sets
            deny_sets += r.deny_sets
            sources += r.sources
            settings.update(r.settings)
            if r.knock_ports or r.knock_secret:
                ports, secret = r.knock_ports, r.knock_secret
            spa_keys += r.spa_keys
            path = r.filter or path
        given: dict[type[Record], dict[str, Any]] = {SocketRules: {}, KnockRules: {}}
        for key, value in settings.items():  # each in its field, as its default's type
            setting = SETTINGS[key]
            given[setting.record][setting.name] = type(setting.default)(value)
        knock = None
        if ports or secret or spa_keys:
            spa_keys = tuple(dict.fromkeys(spa_keys))
            knock = KnockRules(ports=ports, secret=secret, spa_keys=spa_keys, **given[KnockRules])
        return SocketRules(
            subnets=SubnetRules(allow=PrefixList.concat(allow), deny=PrefixList.concat(deny)),
            interfaces=tuple(dict.fromkeys(interfaces)),
            knock=knock,
            custom=CustomFilter(path=path, sets=sets) if path else None,
            allow_sets=tuple(dict.fromkeys(allow_sets)),
            deny_sets=tuple(dict.fromkeys(deny_sets)),
            sources=sources,
            **given[SocketRules],
        )


# -- entries to a policy -------------------------------------------------------


def _check_scope(entry: Entry) -> None:
    name = entry.scope
    if name is not None and not valid_socket_name(name):
        raise entry.error(f"{excerpt(name)} is not a socket name", SOCKET_NAME_RULE)


def _number(entry: Entry) -> float:
    spec = KEYS[entry.key]
    value: Any = entry.value
    try:
        if isinstance(value, bool):
            raise ValueError
        number = spec.number(value) if isinstance(value, str) else value
        if spec.number is int and (not isinstance(number, int) or isinstance(number, bool)):
            raise ValueError
        number = float(number) if spec.number is float else number
    except (TypeError, ValueError):
        kind = "a whole number" if spec.number is int else "a number"
        raise entry.error(
            f"{excerpt(str(value))} is not {kind}",
            f"give --{entry.key} a value between {spec.low:g} and {spec.high:g}",
        ) from None
    if not (
        spec.low < number <= spec.high if spec.number is float else spec.low <= number <= spec.high
    ):
        raise entry.error("out of range", f"give a value between {spec.low:g} and {spec.high:g}")
    if number < spec.least:
        what = "the next knock" if entry.key == "knock-timeout" else "the connection"
        raise entry.error(
            f"{number:g} s is shorter than a round trip: {what} would arrive after the door "
            "has closed",
            f"give at least {spec.least:g} seconds",
        )
    return number


def _switch(entry: Entry) -> bool:
    """A switch: true or false in a file; on the command line the bare option, or yes
    or no (and NAME=yes for one socket)."""
    value = entry.value
    if isinstance(value, str) and value.lower() in SWITCHES:
        return SWITCHES[value.lower()]
    if isinstance(value, bool):
        return value
    raise entry.error(
        f"{excerpt(str(value))} is not yes or no", f"write {entry.key} = true (or false)"
    )


def _prefix(entry: Entry, text: str) -> Prefix:
    try:
        return parse_prefix(text)
    except ValueError as err:
        raise entry.error(str(err), "give a CIDR such as 192.0.2.0/24 or 2001:db8::/32") from None


def _layered(entries: Sequence[Entry]) -> dict[tuple[str | None, str], list[Entry]]:
    """Entries by (scope, key), after clearing and replacing across layers."""
    found: dict[tuple[str | None, str], list[Entry]] = {}
    for entry in entries:
        if entry.key == SCOPE:
            continue
        spec = KEYS[entry.key]
        slot = (entry.scope, spec.slot or entry.key)
        if spec.kind == "list":
            if entry.value == ():
                found[slot] = []  # an empty list clears what came before
            else:
                found.setdefault(slot, []).append(entry)
            continue
        earlier = found.get(slot, [])
        same_layer = [e for e in earlier if e.layer == entry.layer]
        if same_layer and spec.kind == "single":
            where = f" for {entry.scope}" if entry.scope else ""
            raise entry.error(
                f"more than one {spec.slot or entry.key} rule{where}",
                "give one per socket (a later drop-in or the command line replaces it)",
            )
        found[slot] = [entry]
    return found


def build_policy(
    entries: Sequence[Entry],
    listens: Sequence[ListenSpec] = (),
    command: Sequence[str] = (),
    files: Sequence[str] = (),
) -> Policy:
    """The policy these entries describe; every value is parsed and checked here."""
    for entry in entries:
        _check_scope(entry)
    by_scope: dict[str | None, dict[str, list[Entry]]] = {
        e.scope: {} for e in entries if e.key == SCOPE
    }
    for (scope, key), group in _layered(entries).items():
        by_scope.setdefault(scope, {})[key] = group
    scope_origins: dict[str, str] = {}
    for entry in entries:
        if entry.scope is not None:
            scope_origins.setdefault(entry.scope, entry.origin)
    policy = Policy(
        listens=tuple(listens),
        scopes=tuple((scope, _scope_rules(keys)) for scope, keys in by_scope.items()),
        command=tuple(command),
        files=tuple(files),
        scope_origins=tuple(scope_origins.items()),
    )
    _check_sets_have_filter(policy, entries)
    _check_named_sets(policy, entries)
    _check_spa(policy, entries)
    return policy


def _scope_rules(keys: dict[str, list[Entry]]) -> ScopeRules:
    """The rules written for one scope, each value parsed and checked."""
    allow, deny, sources = _subnets(keys)
    ports, secret, spa_keys = _knock(keys)
    path = ""
    for entry in keys.get("filter", []):
        path = entry.path(entry.value)
    named = {kind: tuple(_set_name(e) for e in keys.get(kind, [])) for kind in SET_KEYS}
    settings = tuple(
        (key, _switch(group[-1]) if KEYS[key].kind == "switch" else _number(group[-1]))
        for key, group in keys.items()
        if KEYS[key].kind in ("setting", "switch") and group
    )
    return ScopeRules(
        allow=PrefixList.concat(allow),
        deny=PrefixList.concat(deny),
        interfaces=tuple(_interface(e) for e in keys.get("interface", [])),
        knock_ports=ports,
        knock_secret=secret,
        spa_keys=spa_keys,
        settings=settings,
        filter=path,
        sets=tuple(MapSetting(map=m, key=k, value=v) for m, k, v in _given(keys, "set")),
        allow_sets=named["allow-set"],
        deny_sets=named["deny-set"],
        sources=sources,
        origins=tuple((e.key, e.origin) for group in keys.values() for e in group),
    )


def _given(keys: dict[str, list[Entry]], key: str) -> list[Any]:
    return [entry.value for entry in keys.get(key, [])]


def _subnets(
    keys: dict[str, list[Entry]],
) -> tuple[list[Sequence[Prefix]], list[Sequence[Prefix]], tuple[RuleSource, ...]]:
    """The allow and deny rules of a scope, as written and from rule files, and where
    each group came from."""
    allow: list[Sequence[Prefix]] = []
    deny: list[Sequence[Prefix]] = []
    sources: list[RuleSource] = []
    for kind, target in (("allow", allow), ("deny", deny)):
        for entry in keys.get(kind, []):
            prefix = _prefix(entry, entry.value)
            target.append((prefix,))
            sources.append(RuleSource(kind, entry.origin, (prefix,)))
        for entry in keys.get(f"{kind}-file", []):
            path = entry.path(entry.value)
            prefixes = read_rule_file(path)
            target.append(prefixes)
            sources.append(RuleSource(kind, path, prefixes, path=path))
    return allow, deny, tuple(sources)


def _interface(entry: Entry) -> str:
    name = entry.value
    if not name or len(name) > 15 or "/" in name or name.isspace() or ":" in name:
        raise entry.error(
            f"{excerpt(name)} is not an interface name", "give a name such as eth0 or wg0"
        )
    return str(name)


def _knock(keys: dict[str, list[Entry]]) -> tuple[tuple[int, ...], bytes, tuple[bytes, ...]]:
    """A scope's knock rule (a sequence of ports, or a secret: they share a slot), and
    its clients' own SPA secrets."""
    from alfwrapper.policy.knocking import read_secret  # noqa: PLC0415

    ports: tuple[int, ...] = ()
    secret = b""
    for entry in keys.get("knock", []):
        if entry.key == "knock":
            try:
                ports = parse_ports(entry.value)
            except ValueError as err:
                raise entry.error(str(err), "give source ports in knock order") from None
            _check_sequence(entry, ports)
        else:
            secret = read_secret(entry.path(entry.value))
    spa_keys = tuple(read_secret(e.path(e.value)) for e in keys.get("knock-spa-key", []))
    return ports, secret, spa_keys


def _check_spa(policy: Policy, entries: Sequence[Entry]) -> None:
    """SPA is a way of knocking with a secret: it needs one, excludes sequences, and its
    settings mean nothing without it."""
    for name in [None, *sorted(policy.names)]:
        knock = policy.rules_for(name or "").knock
        spa = knock is not None and knock.spa
        for entry in entries:
            if not entry.key.startswith("knock-spa") or entry.scope not in (None, name):
                continue
            if entry.key == "knock-spa" and _switch(entry) and (knock is None or knock.ports):
                raise entry.error(
                    "SPA needs a secret to key its datagrams with",
                    "give --knock-secret FILE or --knock-spa-key FILE (not --knock, a "
                    "sequence of ports)",
                )
            if entry.key != "knock-spa" and not spa:
                raise entry.error(f"{entry.key} without knock-spa", "add --knock-spa")
        if spa and knock is not None:
            from alfwrapper.policy import spa as datagrams  # noqa: PLC0415

            datagrams.keys(knock.secret, knock.spa_keys)  # ids told apart, at most MOST_KEYS


SET_KEYS = ("allow-set", "deny-set")


def _set_name(entry: Entry) -> str:
    if not valid_set_name(entry.value):
        raise entry.error(f"{excerpt(str(entry.value))} is not a set name", SET_NAME_RULE)
    return str(entry.value)


def _check_sequence(entry: Entry, ports: tuple[int, ...]) -> None:
    for a, b in zip(ports, ports[1:], strict=False):
        if a == b:
            raise entry.error(
                f"port {a} follows itself",
                "consecutive knocks must use different ports (a repeat is taken for a "
                "retransmission)",
            )


def _check_sets_have_filter(policy: Policy, entries: Sequence[Entry]) -> None:
    for entry in entries:
        if entry.key != "set":
            continue
        targets = [entry.scope] if entry.scope else [None, *sorted(policy.names)]
        for name in targets:
            if not policy.rules_for(name or "").custom:
                raise entry.error(
                    f"no --filter for {'socket ' + name if name else 'it'}",
                    "--set fills the maps of a --filter",
                )


def _check_named_sets(policy: Policy, entries: Sequence[Entry]) -> None:
    for name in [None, *sorted(policy.names)]:
        if policy.rules_for(name or "").too_many_sets:
            entry = next(e for e in entries if e.key.endswith("-set") and e.scope in (None, name))
            raise entry.error(
                f"more than {MOST_SETS} named sets for "
                f"{'socket ' + name if name else 'the service'}, allow and deny together",
                "merge sets: one set may hold any number of prefixes",
            )
        if policy.rules_for(name or "").sets_conflict:
            entry = next(e for e in entries if e.key == "allow-set" and e.scope in (None, name))
            raise entry.error(
                f"set {entry.value}: a socket with allow sets may have allow rules or "
                "deny rules, not both",
                "put the deny rules in a named set (deny-set), or the allow rules in one",
            )


# -- policy files ----------------------------------------------------------------


def policy_dirs(environ: Mapping[str, str]) -> list[Path]:
    path = environ.get("ALFWRAPPER_POLICY_PATH")
    return [Path(p) for p in (path.split(":") if path else POLICY_DIRS) if p]


def find_policy(name: str, environ: Mapping[str, str]) -> list[Path]:
    """The policy file for NAME or PATH, then its drop-ins in name order.

    A bare NAME is NAME.toml in the first of policy_dirs() that has it; its
    drop-ins are NAME.toml.d/*.toml in all of them (for the same file name, the
    earlier directory's wins).  A PATH's drop-ins are PATH.d/*.toml.
    """
    if "/" in name or name.endswith(".toml"):
        main = Path(name)
        dropin_dirs = [Path(f"{name}.d")]
        if look(str(main)) is None:
            raise AlfError(f"policy {name}", "no such file", "check the path", EX_NOINPUT)
    else:
        if not _NAME.match(name):
            raise AlfError(
                f"--policy {excerpt(name)}",
                "is neither a policy name nor a path",
                "give a name (letters, digits, . _ @ -) or a path to a .toml file",
                EX_USAGE,
            )
        dirs = policy_dirs(environ)
        found = [d / f"{name}.toml" for d in dirs if look(str(d / f"{name}.toml"))]
        if not found:
            raise AlfError(
                f"policy {name}",
                f"no {name}.toml in {', '.join(map(str, dirs))}",
                "install the policy, or give its path",
                EX_NOINPUT,
            )
        main = found[0]
        dropin_dirs = [d / f"{name}.toml.d" for d in dirs]
    dropins: dict[str, Path] = {}
    for folder in dropin_dirs:
        look(str(folder))  # a drop-in added or removed changes its folder
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                dropins.setdefault(path.name, path)
    return [main, *(dropins[n] for n in sorted(dropins))]


class _Lines:
    """Where keys sit in a TOML text: tomllib keeps no positions, so find them by scanning."""

    _HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
    _KEY = re.compile(
        r'^\s*((?:[A-Za-z0-9_-]+|"[^"]*")(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"))*)\s*='
    )

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.where: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        arrays: dict[tuple[str, ...], int] = {}
        for number, line in enumerate(self.lines, 1):
            header = self._HEADER.match(line)
            if header:
                table = self._split(header.group(2))
                if header.group(1) == "[[":
                    arrays[table] = arrays.get(table, -1) + 1
                    table = (*table, str(arrays[table]))
                self.where.setdefault(table, number)
                continue
            key = self._KEY.match(line)
            if key:
                self.where.setdefault((*table, *self._split(key.group(1))), number)

    @staticmethod
    def _split(dotted: str) -> tuple[str, ...]:
        return tuple(part.strip().strip('"') for part in dotted.split("."))

    def line(self, *path: str) -> int:
        for end in range(len(path), 0, -1):
            if path[:end] in self.where:
                return self.where[path[:end]]
        return 1

    def value_line(self, path: tuple[str, ...], value: str) -> int:
        """The line of a list element: the first line from its key on that quotes it."""
        start = self.line(*path)
        quoted = (f'"{value}"', f"'{value}'")
        for number in range(start, min(len(self.lines), start + 10000) + 1):
            if any(q in self.lines[number - 1] for q in quoted):
                return number
        return start


def read_policy_file(path: Path, layer: int) -> tuple[list[Entry], list[ListenSpec]]:
    """The entries and sockets of one policy file (or drop-in)."""
    text, data = _read_toml(path)
    base = str(path.resolve().parent)  # the folder relative paths in it resolve against
    where = _PolicyText(path=path, lines=_Lines(text), layer=layer, base=base)
    top = {k: v for k, v in data.items() if k not in ("socket", "listen", "listen-datagram")}
    entries = where.entries(top, None, ())
    sockets = data.get("socket", {})
    if not isinstance(sockets, dict):
        raise where.fail(
            ("socket",), "socket must be a table of named sockets", "write [socket.NAME]"
        )
    for name, table in sockets.items():
        if not isinstance(table, dict):
            raise where.fail(
                ("socket", name), f"socket.{name} must be a table", f"write [socket.{name}]"
            )
        # The table names the socket, rules or not; errors about the name point here.
        entries.append(Entry(SCOPE, name, "", where.origin("socket", name), layer))
        entries += where.entries(table, name, ("socket", name))
    listens = [spec for kind in ("listen", "listen-datagram") for spec in where.listens(data, kind)]
    return entries, listens


def _read_toml(path: Path) -> tuple[str, dict[str, Any]]:
    raw = read_input(str(path), "policy", POLICY_LIMIT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise AlfError(
            f"{path}", f"not UTF-8 text (byte {err.start})", "write TOML", EX_CONFIG
        ) from None
    import tomllib  # noqa: PLC0415  (only policy files are TOML: a start without one skips it)

    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        match = re.search(r"\(at line (\d+), column \d+\)", str(err))
        where = f"{path}:{match.group(1)}" if match else str(path)
        why = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(err)) or "not valid TOML"
        raise AlfError(where, why, "fix the TOML syntax", EX_CONFIG) from None


class _PolicyText(Record, kw_only=True):
    """A policy file being read: where its keys sit, for entries' origins and errors."""

    path: Path
    lines: _Lines
    layer: int
    base: str

    def origin(self, *keys: str) -> str:
        return f"{self.path}:{self.lines.line(*keys)}"

    def fail(self, keys: tuple[str, ...], why: str, hint: str) -> AlfError:
        return AlfError(self.origin(*keys), why, hint, EX_CONFIG)

    def entries(
        self, table: Mapping[str, Any], scope: str | None, keys: tuple[str, ...]
    ) -> list[Entry]:
        """The rules of a table: the file's top level, or a [socket.NAME]."""
        found = []
        for key, value in table.items():
            if key not in KEYS:
                known = ", ".join(sorted(KEYS))
                raise self.fail((*keys, key), f"unknown key {excerpt(key)}", f"known keys: {known}")
            for item in _values(
                key, value, lambda why, k=key: self.fail((*keys, k), why, _hint(k))
            ):
                line = (
                    self.lines.value_line((*keys, key), str(item))
                    if isinstance(item, str)
                    else self.lines.line(*keys, key)
                )
                found.append(Entry(key, scope, item, f"{self.path}:{line}", self.layer, self.base))
        return found

    def listens(self, data: Mapping[str, Any], kind: str) -> list[ListenSpec]:
        """The sockets to create of one kind: [[listen]] or [[listen-datagram]] tables."""
        tables = data.get(kind, [])
        if not isinstance(tables, list):
            raise self.fail((kind,), f"{kind} must be an array of tables", f"write [[{kind}]]")
        found = []
        for index, table in enumerate(tables):
            keys = (kind, str(index))
            if not isinstance(table, dict) or set(table) - {"address", "name"}:
                extra = sorted(set(table) - {"address", "name"}) if isinstance(table, dict) else []
                raise self.fail(
                    (*keys, *extra[:1]),
                    f"unknown key {excerpt(extra[0])}" if extra else f"{kind} must be a table",
                    "a socket to create has address and name",
                )
            address, name = table.get("address"), table.get("name", "unknown")
            if not isinstance(address, str) or not isinstance(name, str):
                raise self.fail(
                    keys, "address and name must be strings", 'write address = "[::]:8080"'
                )
            try:
                spec = parse_listen("stream" if kind == "listen" else "datagram", address)
            except AlfError as err:
                raise AlfError(
                    self.origin(*keys, "address"), err.why, err.hint, EX_CONFIG
                ) from None
            if not valid_socket_name(name):
                raise self.fail(
                    (*keys, "name"), f"{excerpt(name)} is not a socket name", SOCKET_NAME_RULE
                )
            found.append(ListenSpec(kind=spec.kind, host=spec.host, port=spec.port, name=name))
        return found


def _hint(key: str) -> str:
    spec = KEYS[key]
    if key == "set":
        return 'write set = [["MAP", "KEY", "VALUE"], ...]'
    if key == "knock":
        return "write knock = [7001, 7002, 7003]"
    if spec.kind == "list":
        return f'write {key} = ["...", ...]'
    if spec.kind == "setting":
        return f"write {key} = a number"
    if spec.kind == "switch":
        return f"write {key} = true"
    return f'write {key} = "..."'


def _values(key: str, value: Any, fail: Any) -> list[Any]:  # noqa: C901
    """A TOML value as the entries' values: one per list element, () for an empty list."""
    spec = KEYS[key]
    if key == "set":
        if not isinstance(value, list):
            raise fail("must be a list of [map, key, value]")
        out = []
        for item in value:
            if (
                not isinstance(item, list)
                or len(item) != 3
                or not all(isinstance(x, str | int) and not isinstance(x, bool) for x in item)
            ):
                raise fail("each element must be [map, key, value]")
            out.append(tuple(str(x) for x in item))
        return out or [()]
    if key == "knock":
        if (
            isinstance(value, list)
            and value
            and all(isinstance(p, int) and not isinstance(p, bool) for p in value)
        ):
            return [",".join(map(str, value))]
        if isinstance(value, str):
            return [value]
        raise fail("must be a list of ports")
    if spec.kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise fail("must be a list of strings")
        return list(value) or [()]
    if spec.kind == "setting":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail("must be a number")
        return [value]
    if spec.kind == "switch":
        if not isinstance(value, bool):
            raise fail("must be true or false")
        return [value]
    if not isinstance(value, str):
        raise fail("must be a string")
    return [value]


def read_policy(
    name: str, environ: Mapping[str, str]
) -> tuple[list[Entry], list[ListenSpec], list[str]]:
    """A policy and its drop-ins: entries, sockets to create, and the files read."""
    entries: list[Entry] = []
    listens: list[ListenSpec] = []
    files = find_policy(name, environ)
    for layer, path in enumerate(files):
        more, sockets = read_policy_file(path, layer)
        entries += more
        listens += sockets
    return entries, listens, [str(p) for p in files]


def cli_entry(key: str, text: str, layer: int) -> Entry:
    """An entry from the command line: ``--KEY VALUE`` or ``--KEY NAME=VALUE``."""
    scope, value = split_scope(text)
    return Entry(key, scope, value, f"--{key}", layer, "")


def split_scope(text: str) -> tuple[str | None, str]:
    """``NAME=VALUE`` applies to the sockets named NAME; a bare VALUE to every socket."""
    name, sep, value = text.partition("=")
    if sep and name and ":" not in name and "/" not in name:
        return name, value
    return None, text
