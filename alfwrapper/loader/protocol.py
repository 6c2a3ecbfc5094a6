"""The loader's wire protocol: framing (a 4-byte big-endian length, a JSON object and at
most two fds beside it), rules both ways (packed, checked as strictly as text), and the
values of "fd" calls."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from alfwrapper.errors import (
    EX_DATAERR,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_USAGE,
    AlfError,
)
from alfwrapper.host import bpf_calls
from alfwrapper.policy.inputs import FILTER_LIMIT, SECRET_LIMIT
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import (
    MOST_SETS,
    SET_NAME_RULE,
    CustomFilter,
    KnockRules,
    MapSetting,
    Rule,
    SocketRules,
    valid_set_name,
)
from alfwrapper.record import Record, fields, replace

SOCKET_PATH = "/run/alfwrapper/loader.sock"


REQUEST_LIMIT = 16 << 20  # packed rules: 5 bytes an IPv4 rule, at most 17 an IPv6 one


RULES_LIMIT = 2_000_000  # allow or deny rules in one request


READ_SECONDS = 10.0


WORK_SECONDS = 120.0
BUSY_SECONDS = 60.0  # how long a client retries while the loader says it is busy


LENGTH = struct.Struct("!I")


FD_VALUE_LIMIT = 1 << 16  # bytes of a key or value, and most ints, in an "fd" request


def socket_path() -> str:
    return os.environ.get("ALFWRAPPER_LOADER", SOCKET_PATH)


def connect(conn: socket.socket, path: str) -> None:
    """Connect, waiting (up to READ_SECONDS) while the listen queue is full: a Unix
    socket with a timeout says EAGAIN at once where a plain one would wait."""
    deadline = time.monotonic() + READ_SECONDS
    while True:
        try:
            conn.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AlfError(
                    f"the loader ({path})", "its queue stayed full", "try again", EX_TEMPFAIL
                ) from None
            time.sleep(0.01)


def send(conn: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One request or answer, its SocketRules values in their wire form (encode_rules)."""
    data = json.dumps(message, default=_on_wire).encode()
    if len(data) > REQUEST_LIMIT:
        raise AlfError(
            "a request to the loader",
            f"is {len(data) >> 20} MiB, more than the {REQUEST_LIMIT >> 20} MiB it takes",
            "use fewer rules, or run the service with CAP_BPF",
            EX_DATAERR,
        )
    frame = LENGTH.pack(len(data)) + data
    sent = socket.send_fds(conn, [frame[:65536]], list(fds))
    conn.sendall(frame[sent:])


def receive(
    conn: socket.socket, limit: int, seconds: float, max_fds: int
) -> tuple[dict[str, Any], list[int]]:
    """One message and the fds beside it, within ``limit`` bytes and ``seconds``."""
    deadline = time.monotonic() + seconds
    fds: list[int] = []
    try:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        data, fds, flags, _ = socket.recv_fds(conn, 65536, max_fds)
        if not data:
            raise AlfError(
                "the loader",
                "closed the connection without an answer",
                "see journalctl -u alfwrapper-loader",
                EX_SOFTWARE,
            )
        if flags & socket.MSG_CTRUNC:
            raise bad_request("too many file descriptors")
        return _message(conn, data, limit, deadline, seconds), fds
    except TimeoutError:
        _close(fds)
        raise Late(
            "loader request", f"nothing complete arrived within {seconds:.0f} s", "", EX_DATAERR
        ) from None
    except (ValueError, UnicodeDecodeError) as err:
        _close(fds)
        raise bad_request(f"it is not JSON ({err})") from None
    except AlfError:
        _close(fds)
        raise


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _message(
    conn: socket.socket, data: bytes, limit: int, deadline: float, seconds: float
) -> dict[str, Any]:
    """The JSON object a message's first bytes start, the rest read within the deadline."""
    if len(data) < LENGTH.size:
        raise bad_request("a message must start with its length")
    (length,) = LENGTH.unpack(data[: LENGTH.size])
    if length > limit:
        raise bad_request(f"{length} bytes is more than the limit of {limit}")
    body = bytearray(data[LENGTH.size :])
    while len(body) < length:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Late(
                "loader request", f"not all of it arrived within {seconds:.0f} s", "", EX_DATAERR
            )
        conn.settimeout(left)
        chunk = conn.recv(min(1 << 20, length - len(body)))
        if not chunk:
            raise bad_request("the connection closed in the middle of it")
        body += chunk
    if len(body) > length:
        raise bad_request("more bytes than its length says")
    try:
        message = json.loads(bytes(body))
    except RecursionError:  # "[[[[..." : Python's decoder recurses per level
        raise bad_request("it nests too deeply") from None
    if not isinstance(message, dict):
        raise bad_request("it is not a JSON object")
    return message


def bad_request(why: str) -> AlfError:
    return AlfError("loader request", why, "", EX_DATAERR)


class Late(AlfError):
    """A message that did not arrive whole in time: the loader says so to a slow
    client; a client says the loader did not answer (client.Broker)."""


def encode_rules(rules: SocketRules) -> dict[str, Any]:
    """Rules as the loader takes them: everything already read (a filter's text, a
    knock secret), nothing for the loader to open.  Each field as its Rule says
    (policy/rules.py), in the order declared; the fields with none stay here."""
    refused = sets_beside_a_filter(rules)
    if refused is not None:
        raise refused
    if rules.custom and not rules.custom.source:
        from alfwrapper.policy.inputs import read_text_input  # noqa: PLC0415

        source = read_text_input(
            rules.custom.path, "--filter", "give a restricted-C file", FILTER_LIMIT
        )
        rules = replace(rules, custom=replace(rules.custom, source=source))
    return _written(rules)


def _written(record: Record) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for slot in _slots(type(record)):
        value = getattr(record, slot.field)
        if slot.inline:
            out.update(_written(value))
        elif slot.always or value != slot.default:
            out[slot.key] = _written(value) if slot.record else WRITERS[slot.kind](value)
    return out


def _packed(prefixes: Sequence[Prefix]) -> dict[str, str]:
    from alfwrapper.policy.prefix_list import PrefixList  # noqa: PLC0415

    return {"packed": base64.b64encode(PrefixList.of(prefixes).packed()).decode()}


def _as_is(value: Any) -> Any:
    return value


# How each kind of rule field is written (encode_rules) and read back (decode_rules):
# a Rule's ``wire``.  Named sets travel by name: the loader opens root's, read-only
# (loader/server.py).
WRITERS: dict[str, Callable[[Any], Any]] = {
    "prefixes": _packed,
    "set names": list,
    "interfaces": list,
    "ports": list,
    "hex": bytes.hex,
    "text": _as_is,
    "int": _as_is,
    "float": _as_is,
    "bool": _as_is,
    "map settings": lambda sets: [[m.map, m.key, m.value] for m in sets],
}


def _on_wire(value: Any) -> Any:
    if isinstance(value, SocketRules):
        return encode_rules(value)
    raise TypeError(f"{type(value).__name__} has no wire form")


def request_field(d: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = d.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise bad_request(f"{key!r} must be a {kind.__name__}")
    return value


def _number(d: dict[str, Any], key: str, kind: type, low: float, high: float) -> Any:
    value = request_field(d, key, kind)
    if not low <= value <= high:
        raise bad_request(f"{key!r} must be from {low} to {high}")
    return value


def _prefixes(d: dict[str, Any], slot: _Slot) -> Sequence[Prefix]:
    """A rule list: packed (PrefixList.packed, base64; what encode_rules sends) or a
    list of CIDR strings (for hand-written requests), of at most RULES_LIMIT rules."""
    key = slot.key
    items = d.get(key, [])
    try:
        if isinstance(items, dict) and set(items) == {"packed"}:
            from alfwrapper.policy.prefix_list import PrefixList  # noqa: PLC0415

            data = base64.b64decode(request_field(items, "packed", str), validate=True)
            return PrefixList.unpacked(data, RULES_LIMIT)
        if (
            not isinstance(items, list)
            or len(items) > RULES_LIMIT
            or not all(isinstance(t, str) for t in items)
        ):
            raise bad_request(f"'{key}' must be packed rules or a list of CIDR strings")
        return tuple(parse_prefix(t) for t in items)
    except (ValueError, TypeError) as err:  # binascii.Error is a ValueError
        raise bad_request(f"'{key}': {err}") from None


def _set_names(d: dict[str, Any], slot: _Slot) -> tuple[str, ...]:
    key = slot.key
    names = request_field(d, key, list, [])
    if len(names) > MOST_SETS or not all(valid_set_name(n) for n in names):
        raise bad_request(f"'{key}' must be at most {MOST_SETS} set names ({SET_NAME_RULE})")
    if len(set(names)) != len(names):
        raise bad_request(f"'{key}' names a set twice")
    return tuple(names)


def _interfaces(d: dict[str, Any], slot: _Slot) -> tuple[str, ...]:
    if d.get(slot.key):
        raise AlfError(
            "--interface",
            "the loader cannot follow interface renames for a user's service",
            "use subnet rules, or run the service with CAP_BPF",
            EX_USAGE,
        )
    return ()


def _ports(d: dict[str, Any], slot: _Slot) -> tuple[int, ...]:
    ports = request_field(d, slot.key, list)
    if len(ports) > 8 or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
        raise bad_request(f"'{slot.where}' must be at most 8 ports")
    return tuple(ports)


def _hex(d: dict[str, Any], slot: _Slot) -> bytes:
    try:
        return bytes.fromhex(request_field(d, slot.key, str))
    except ValueError:
        raise bad_request(f"'{slot.where}' must be hex") from None


def _map_settings(d: dict[str, Any], slot: _Slot) -> tuple[MapSetting, ...]:
    sets = request_field(d, slot.key, list, [])
    if not all(
        isinstance(s, list) and len(s) == 3 and all(isinstance(x, str) and len(x) < 4096 for x in s)
        for s in sets
    ):
        raise bad_request(f"'{slot.where}' must be [map, key, value] strings")
    return tuple(MapSetting(map=m, key=k, value=v) for m, k, v in sets)


READERS: dict[str, Callable[[dict[str, Any], _Slot], Any]] = {
    "prefixes": _prefixes,
    "set names": _set_names,
    "interfaces": _interfaces,
    "ports": _ports,
    "hex": _hex,
    "text": lambda d, slot: request_field(d, slot.key, str),
    "int": lambda d, slot: _number(d, slot.key, int, slot.low, slot.high),
    "float": lambda d, slot: _number(d, slot.key, float, slot.low, slot.high),
    "bool": lambda d, slot: request_field(d, slot.key, bool),
    "map settings": _map_settings,
}


class _Slot(Record, kw_only=True):
    """A rule field as the wire carries it, from its Rule (policy/rules.py)."""

    field: str  # the record's field
    key: str  # its key in the request
    where: str  # its dotted path, for messages: knock.ports
    kind: str  # of WRITERS and READERS, "" for a record
    record: type[Record] | None = None  # a record of its own: an object, or inline
    inline: bool = False
    always: bool = False  # sent even while it holds its default
    required: bool = False
    default: Any = None
    low: float = 0  # a number's range: from its default or Rule.accepted()'s least
    high: float = 0


_SLOTS: dict[tuple[type[Record], str], tuple[_Slot, ...]] = {}


def _slots(record: type[Record], within: str = "") -> tuple[_Slot, ...]:
    """The fields of ``record`` that travel, in order (a Rule says how); ``within``: the
    path of its object in a request, for messages."""
    if (record, within) in _SLOTS:
        return _SLOTS[record, within]
    found = []
    for name, declared in fields(record).items():
        rule = declared.metadata
        if not isinstance(rule, Rule) or not (rule.wire or rule.key):
            continue
        key = rule.name or name
        nested = rule.wire if isinstance(rule.wire, type) else None
        kind = "" if nested else rule.wire or type(declared.made()).__name__
        low, high = 0.0, 0.0
        if kind in ("int", "float"):
            least, high = rule.accepted()
            low = min(declared.made(), least)
        found.append(_Slot(field=name, key=key, where=f"{within}{key}", kind=kind,
                           record=nested, inline=rule.inline,
                           always=rule.always or rule.required, required=rule.required,
                           default=None if rule.required else declared.made(),
                           low=low, high=high))  # fmt: skip
    _SLOTS[record, within] = tuple(found)
    return _SLOTS[record, within]


def _keys(record: type[Record]) -> set[str]:
    """The keys a request's object for ``record`` may hold (inline records' too)."""
    keys = set()
    for slot in _slots(record):
        keys |= _keys(slot.record) if slot.inline and slot.record else {slot.key}
    return keys


def decode_rules(d: Any) -> SocketRules:
    """The rules of a request, checked as strictly as the command line checks them: each
    field as its Rule says, then what the loader refuses of them together."""
    if not isinstance(d, dict):
        raise bad_request("'rules' must be an object")
    unknown = set(d) - _keys(SocketRules)
    if unknown:
        raise bad_request(f"unknown rule keys {sorted(unknown)}")
    return cast(SocketRules, _read(SocketRules, d))


def _read(record: type[Record], d: dict[str, Any], within: str = "") -> Record:
    """A record from its object in a request (keys other than its fields' are passed
    over inside a knock or a filter, as they always were)."""
    values: dict[str, Any] = {}
    for slot in _slots(record, within):
        if slot.inline and slot.record:
            values[slot.field] = _read(slot.record, d, within)
        elif slot.key in d or slot.required:
            if slot.record:
                nested = request_field(d, slot.key, dict)
                values[slot.field] = _read(slot.record, nested, f"{slot.where}.")
            else:
                values[slot.field] = READERS[slot.kind](d, slot)
    made = record(**values)
    check = CHECKS.get(record)
    if check is not None:
        check(made)
    return made


def _check_knock(knock: KnockRules) -> None:
    if len(knock.secret) > SECRET_LIMIT or bool(knock.secret) == bool(knock.ports):
        raise bad_request("a knock needs ports or a secret of at most 4 KiB, not both")
    if knock.spa or knock.verifier:  # kept.py refuses it before it gets here
        raise bad_request("the loader does not make SPA sockets' programs")


def _check_filter(custom: CustomFilter) -> None:
    if (
        len(custom.path) > 4096
        or not custom.source
        or len(custom.source) > FILTER_LIMIT
        or len(custom.sets) > 100_000
    ):
        raise bad_request("'filter' needs a name, and a source of at most 1 MiB")


def _check_rules(rules: SocketRules) -> None:
    if rules.sets_conflict:
        raise bad_request("a socket with allow sets may have allow rules or deny rules, not both")
    if rules.too_many_sets:
        raise bad_request(f"more than {MOST_SETS} named sets, allow and deny together")
    if set(rules.allow_sets) & set(rules.deny_sets):
        raise bad_request("a set is named both to allow and to deny")
    refused = sets_beside_a_filter(rules)
    if refused is not None:
        raise refused


# What the loader refuses of a record's fields together, once each is read.
CHECKS: dict[type[Record], Callable[[Any], None]] = {
    KnockRules: _check_knock,
    CustomFilter: _check_filter,
    SocketRules: _check_rules,
}


def sets_beside_a_filter(rules: SocketRules) -> AlfError | None:
    """Root's sets are opened for a compile of alfwrapper's own C alone: a compiler
    taken over by a user's own C must never hold their descriptors (it could pin one
    in the user's tree and open the pin read-write)."""
    named = (*rules.deny_sets, *rules.allow_sets)
    if not named or rules.custom is None:
        return None
    return AlfError(
        f"named set {named[0]}",
        "a developer's filter is not compiled beside root's sets through the loader",
        "leave out the filter or the sets, or run the service with CAP_BPF",
        EX_USAGE,
    )


def to_wire(value: Any) -> Any:
    """An argument or answer of an "fd" call as JSON."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    if isinstance(value, bpf_calls.TestRun):
        return {"run": [value.retval, value.duration_ns]}
    return value


def from_wire(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"bytes"} and isinstance(value["bytes"], str):
        return bytes.fromhex(value["bytes"])
    if isinstance(value, dict) and set(value) == {"run"}:
        return bpf_calls.TestRun(*(int(x) for x in value["run"]))
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    if isinstance(value, dict):
        raise bad_request("an unknown value")
    return value
