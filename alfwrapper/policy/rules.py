"""The rules of one socket as frozen data, each field declared once (its Rule: how it
travels to the loader, the policy key that sets it), and the parsers of one value
(listen addresses, ports, socket names).

Pure Python: no kernel, no sockets opened.  The parsers raise ``ValueError``
with a message fit for a user, and callers add where the input came from.
Prefixes are prefixes.py's, bounded reads inputs.py's.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Sequence
from typing import Any

from alfwrapper.errors import EX_USAGE, AlfError, excerpt
from alfwrapper.policy.prefix_list import PrefixList
from alfwrapper.policy.prefixes import Prefix
from alfwrapper.record import Record, field, fields

# Named sets one socket may name, allow and deny: each set's sieve and its hosts_at
# (the slot its hosts map grows through) are maps of the program's own (sets.c), and
# the kernel lets one program use 64 maps, of which the other parts use up to 21;
# what is left is for a developer's filter.
MOST_SETS = 16


class Rule(Record, kw_only=True):
    """What a rule field is besides its type and default, said once, beside it.  The
    loader's codec is derived from these (loader/protocol.py), and so are the policy
    keys that set one number or switch, with their option, help and limits
    (policy/files.py: KEYS).  A field with no Rule never leaves the process.

    ``wire``, its kind on the loader's wire: one of protocol.py's READERS, or a record
    class (an object of that record's fields).  A setting (one with a ``key``) travels
    as its default's type: int, float or bool, and the wire takes its default and
    from ``max(low, least)`` to ``high``.  A field is left out of a request while it
    holds its default, and a field left out takes its default: so rules that use no
    newer field travel as the earlier releases wrote them, and an older client's
    request still reads.  The earlier releases' fields are sent ``always``, and some
    are ``required`` in a request.
    """

    wire: Any = ""  # "" for a setting: its default's type
    name: str = ""  # its key on the wire, if not the field's own name
    inline: bool = False  # a record whose fields travel beside this record's own
    always: bool = False  # sent even while it holds its default
    required: bool = False  # sent always, and a request without it is refused
    key: str = ""  # the policy key, and --option, that sets it
    help: str = ""
    low: float = 0
    high: float = 0
    least: float = 0.0  # below this the feature cannot work (a round trip)

    def accepted(self) -> tuple[float, float]:
        """The values it takes, from the least that works to its highest: the one
        statement of these limits (the policy, the loader and `alfwrapper knock`)."""
        return max(self.low, self.least), self.high


class SubnetRules(Record, kw_only=True):
    """Source-subnet rules: deny wins; with no allow rules everything not denied passes.

    Given any sequence of prefixes, each list is kept as a PrefixList (numpy columns).
    """

    allow: Sequence[Prefix] = field(default=(), metadata=Rule(wire="prefixes", always=True))
    deny: Sequence[Prefix] = field(default=(), metadata=Rule(wire="prefixes", always=True))

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", PrefixList.of(self.allow))
        object.__setattr__(self, "deny", PrefixList.of(self.deny))

    def passes(self, family: int, address: int) -> bool:
        """The subnet part's verdict on a source (an IPv4-mapped one given as IPv4, as
        the packet carries it): denied if a deny rule covers it; else passed if an
        allow rule does, or if there are no allow rules.  tests/kernel holds it to
        the compiled program's."""
        deny, allow = PrefixList.of(self.deny), PrefixList.of(self.allow)  # as they are
        if len(deny.covering(family, address)):
            return False
        return not allow or bool(len(allow.covering(family, address)))


class ListenSpec(Record):
    """A socket the wrapper creates: ``kind`` is "stream" (TCP) or "datagram" (UDP)."""

    kind: str
    host: str
    port: int
    name: str = "unknown"

    @property
    def family(self) -> int:
        return 6 if ":" in self.host else 4

    def __str__(self) -> str:
        host = f"[{self.host}]" if self.family == 6 else self.host
        proto = "tcp" if self.kind == "stream" else "udp"
        return f"{proto} {host}:{self.port}"


class KnockRules(Record, kw_only=True):
    """Port knocking: a static sequence of source ports, or one derived from a secret;
    or, with ``spa``, single-packet authorization: one datagram, keyed with the secret,
    to the socket's SPA socket (policy/spa.py, spa.c).

    The fields' order is the knock state's name (bpf/parts.py: knock_key) and the
    wire's: a new field goes last."""

    ports: tuple[int, ...] = field(default=(), metadata=Rule(wire="ports", required=True))
    secret: bytes = field(default=b"", metadata=Rule(wire="hex", required=True))
    steps: int = field(  # length of secret-derived sequences
        default=3,
        metadata=Rule(
            key="knock-steps",
            help="length of secret sequences, 1 to 8 (default 3)",
            low=1,
            high=8,
            required=True,
        ),
    )
    timeout: float = field(  # seconds allowed between two knocks
        default=5.0,
        metadata=Rule(key="knock-timeout", help="most seconds between two knocks (default 5)",
                      low=0, high=3600, least=0.2, required=True),
    )  # fmt: skip
    open_for: float = field(  # seconds a completed knock admits new connections
        default=30.0,
        metadata=Rule(
            key="knock-open-for",
            help="seconds a completed knock admits new connections (default 30)",
            low=0,
            high=86400,
            least=1.0,
            required=True,
        ),
    )
    window: int = field(  # seconds each secret-derived sequence is valid for (SPA: its skew)
        default=30,
        metadata=Rule(
            key="knock-window",
            help="seconds each secret sequence is valid (default 30)",
            low=5,
            high=3600,
            required=True,
        ),
    )
    sources: int = field(  # knock states kept, least recently used evicted
        default=131072,
        metadata=Rule(
            key="knock-sources",
            help="knock states kept, LRU (default 131072)",
            low=1024,
            high=1 << 24,
            required=True,
        ),
    )
    spa: bool = field(  # single-packet authorization instead of sequences
        default=False,
        metadata=Rule(
            key="knock-spa",
            help="single-packet authorization: one datagram keyed "
            "with the --knock-secret, sent to the socket's SPA socket, opens its "
            "sender (or the address it names); no sequences",
            always=True,
        ),
    )
    spa_port: int = field(  # the SPA socket's UDP port (0: the socket's own port number)
        default=0,
        metadata=Rule(
            key="knock-spa-port",
            help="the SPA socket's UDP port (default: the socket's own port number)",
            low=1,
            high=65535,
            always=True,
        ),
    )
    spa_sender: bool = field(  # a datagram naming no address opens the one it came from
        default=False,
        metadata=Rule(
            key="knock-spa-sender",
            help="let an SPA datagram that names no address "
            "open the one it came from (weaker: a datagram copied off the wire "
            "opens its copier)",
            always=True,
        ),
    )
    spa_keys: tuple[bytes, ...] = ()  # clients' own SPA secrets (knock-spa-key), by id
    # The rules of the SPA socket itself (Policy.rules_for(NAME.spa)), which checks
    # datagrams and opens, where the socket's own rules read what it opened; the knock
    # state is the same (knock_key leaves this out).
    verifier: bool = field(default=False, metadata=Rule(wire="bool", always=True))


class MapSetting(Record, kw_only=True):
    """``--set MAP KEY VALUE``: one entry to put in a custom filter's map."""

    map: str
    key: str
    value: str


class CustomFilter(Record, kw_only=True):
    """``--filter FILE.c``: a developer's filter, with its map settings."""

    path: str = field(metadata=Rule(wire="text", name="name", required=True))
    # Its text, when it was read elsewhere: the loader compiles what the user's
    # wrapper read, never a path it was given (program.checked_source).
    source: str = field(default="", metadata=Rule(wire="text", required=True))
    sets: tuple[MapSetting, ...] = field(
        default=(), metadata=Rule(wire="map settings", always=True)
    )


class SocketRules(Record, kw_only=True):
    """Everything that applies to one socket; a packet must pass every part.

    ``sources`` says where the subnet rules were written (policy.files.RuleSource),
    for `explain`; it takes no part in comparisons, so sockets with the same
    rules share a program wherever the rules came from.  The fields' order is the
    wire's (loader/protocol.py).
    """

    subnets: SubnetRules = field(
        default_factory=SubnetRules, metadata=Rule(wire=SubnetRules, inline=True)
    )
    # Named sets, by name (alfwrapper set; sets.c).
    allow_sets: tuple[str, ...] = field(default=(), metadata=Rule(wire="set names"))
    deny_sets: tuple[str, ...] = field(default=(), metadata=Rule(wire="set names"))
    log_rate: int = field(  # dropped packets logged per second, 0 for none
        default=0,
        metadata=Rule(
            key="log-drops",
            help="log dropped packets, at most this many a second (default: no log)",
            low=1,
            high=100_000,
            always=True,
        ),
    )
    interfaces: tuple[str, ...] = field(default=(), metadata=Rule(wire="interfaces"))
    knock: KnockRules | None = field(default=None, metadata=Rule(wire=KnockRules))
    custom: CustomFilter | None = field(
        default=None, metadata=Rule(wire=CustomFilter, name="filter")
    )
    sources: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    @property
    def empty(self) -> bool:
        return not (
            self.subnets.allow
            or self.subnets.deny
            or self.interfaces
            or self.knock
            or self.custom
            or self.allow_sets
            or self.deny_sets
        )

    def guards(self) -> str:
        """What guards the socket, in a few words: a start's and a reload's line."""
        parts = []
        if len(self.subnets.allow) or len(self.subnets.deny):
            parts.append(f"subnets {len(self.subnets.allow)} allow, {len(self.subnets.deny)} deny")
        if self.allow_sets or self.deny_sets:
            named = [f"allow {n}" for n in self.allow_sets] + [f"deny {n}" for n in self.deny_sets]
            parts.append("sets " + ", ".join(named))
        if self.interfaces:
            parts.append("interfaces " + ", ".join(self.interfaces))
        if self.knock is not None:
            parts.append("SPA" if self.knock.spa else "knocking")
        if self.custom is not None:
            parts.append("filter " + self.custom.path.rsplit("/", 1)[-1])
        return " + ".join(parts) or "no rules: every packet passes"

    @property
    def too_many_sets(self) -> bool:
        """More named sets, allow and deny together, than sets.c keeps a bit for."""
        return len(self.allow_sets) + len(self.deny_sets) > MOST_SETS

    @property
    def sets_conflict(self) -> bool:
        """Allow sets beside both allow and deny rules, which sets.c cannot judge: the
        subnet table resolves allow and deny into one verdict, and an allow set's
        entry could not tell which it was (bpf/parts.py: Sets)."""
        return bool(self.allow_sets and len(self.subnets.allow) and len(self.subnets.deny))

    def fingerprint(self, cheap: bool = True) -> str:
        """A name of these rules that a later process computes again from the same
        options and files (`explain SERVICE` checks that the rules it builds are those in
        force): a SHA-256, so the meta keeping it holds no secret.  Rule lists go in by
        PrefixList.fingerprint (``cheap``: settled rule files by their identity, so a
        file touched since is a change), a developer's filter by its text as it is now."""
        from alfwrapper import __version__  # noqa: PLC0415  (another version compiles otherwise)
        from alfwrapper.host.cachedir import sha256  # noqa: PLC0415  (no OpenSSL to load)

        custom: object = None
        if self.custom is not None:
            text = self.custom.source
            if not text:
                try:
                    with open(self.custom.path, "rb") as f:
                        text = sha256(f.read(1 << 24)).hexdigest()
                except OSError:
                    text = "unreadable"
            custom = (self.custom.path, self.custom.sets, text)
        rest = (self.interfaces, self.knock, self.log_rate, self.allow_sets, self.deny_sets)
        material = "\0".join(
            [
                __version__,
                PrefixList.of(self.subnets.allow).fingerprint(cheap),
                PrefixList.of(self.subnets.deny).fingerprint(cheap),
                repr(rest),
                repr(custom),
            ]
        )
        return sha256(material.encode(errors="surrogateescape")).hexdigest()

    def counts(self) -> dict[str, int]:
        """How many rules of each kind (status shows them)."""
        return {
            "allow": len(self.subnets.allow),
            "deny": len(self.subnets.deny),
            "interface": len(self.interfaces),
            "set": len(self.allow_sets) + len(self.deny_sets),
            "knock": int(self.knock is not None),
            "filter": int(self.custom is not None),
            "log-drops": self.log_rate,
        }


def parse_ports(text: str) -> tuple[int, ...]:
    """``P,P,P``: a knock sequence of ports 1..65535, at most 8 long."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and p.isascii() and 0 < int(p) < 65536 for p in parts):
        raise ValueError(f"{excerpt(text)} is not a list of ports 1-65535 such as 7000,8000,9000")
    if not 1 <= len(parts) <= 8:
        raise ValueError(f"{excerpt(text)} has {len(parts)} ports; give 1 to 8")
    return tuple(int(p) for p in parts)


SET_NAME_RULE = "a set's name is 1 to 64 letters, digits, _ and -"


def valid_set_name(name: object) -> bool:
    """A named set's name: its folder's name in bpffs, so no dot (bpffs refuses those)."""
    return isinstance(name, str) and bool(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name))


SOCKET_NAME_RULE = "up to 255 printable ASCII characters without ':' (as FileDescriptorName=)"


def valid_socket_name(name: str) -> bool:
    """A socket's name as systemd allows it in FileDescriptorName= (fdname_is_valid):
    the one rule for --name, a policy's [socket.NAME] and its listen names."""
    return 0 < len(name) <= 255 and name.isascii() and name.isprintable() and ":" not in name


_SERVICE = re.compile(r"^[A-Za-z0-9_.@:\\-]{1,200}$")


def valid_service(name: str) -> bool:
    """A service's name, as its pinned state's folder is named: the one rule for
    --service, a systemd unit's name and the loader's requests."""
    return bool(_SERVICE.match(name)) and not name.startswith(".")


def check_service(name: str) -> str:
    if not valid_service(name):
        raise AlfError(
            f"service {excerpt(name)}",
            "is not a service name",
            "use letters, digits and . _ @ : - (up to 200)",
            EX_USAGE,
        )
    return name


def service_name(explicit: str, unit: str, command: tuple[str, ...]) -> str:
    """--service, else the systemd unit this process runs in, else the command's name."""
    if explicit:
        return check_service(explicit)
    if unit:
        return check_service(unit)
    base = os.path.basename(command[0]) if command else "alfwrapper"
    return check_service(re.sub(r"[^A-Za-z0-9_.@:-]", "_", base) or "alfwrapper")


def parse_listen(kind: str, text: str) -> ListenSpec:
    """Parse ``[ADDR]:PORT``, ``ADDR:PORT``, ``:PORT`` or ``PORT``.

    A missing address means ``::``, dual-stack, so IPv4 clients reach it too.
    """
    option = "--listen" if kind == "stream" else "--listen-datagram"
    host, port_text = "::", text
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise AlfError(
                option, f"{excerpt(text)} is not [ADDR]:PORT", "write e.g. [::]:8080", EX_USAGE
            )
        host, port_text = text[1:close], text[close + 2 :]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise AlfError(
                option,
                f"{excerpt(text)}: put an IPv6 address in brackets",
                "write e.g. [2001:db8::1]:8080",
                EX_USAGE,
            )
        host = host or "::"
    if not port_text.isdigit() or not port_text.isascii() or not 0 < int(port_text) < 65536:
        raise AlfError(
            option, f"{excerpt(text)} has no valid port", "ports are 1 to 65535", EX_USAGE
        )
    try:
        if "%" in host:  # an IPv6 scope id: bind to an interface with --interface instead
            raise ValueError(host)
        ipaddress.ip_address(host)
    except ValueError:
        raise AlfError(
            option,
            f"{excerpt(host)} is not an IP address",
            "give a numeric IPv4 or IPv6 address; host names are not resolved",
            EX_USAGE,
        ) from None
    return ListenSpec(kind=kind, host=host, port=int(port_text))


class Setting(Record, kw_only=True):
    """A rule field that a policy key sets, one number or switch: where it is, and what."""

    record: type[Record]
    name: str
    rule: Rule
    default: Any


def settings() -> dict[str, Setting]:
    """The rule fields a policy key sets, by key, in the order SocketRules declares them
    (a record inside in its place)."""
    found: dict[str, Setting] = {}

    def walk(record: type[Record]) -> None:
        for name, declared in fields(record).items():
            rule = declared.metadata
            if not isinstance(rule, Rule):
                continue
            if rule.key:
                found[rule.key] = Setting(
                    record=record, name=name, rule=rule, default=declared.made()
                )
            if isinstance(rule.wire, type):
                walk(rule.wire)

    walk(SocketRules)
    return found
