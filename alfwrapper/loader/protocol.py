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
from collections.abc import Sequence
from typing import Any

from alfwrapper.errors import (
    EX_DATAERR,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_USAGE,
    AlfError,
)
from alfwrapper.host import bpf_calls
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.policy.rules import (
    MOST_SETS,
    SET_NAME_RULE,
    CustomFilter,
    KnockRules,
    MapSetting,
    SocketRules,
    SubnetRules,
    valid_set_name,
)

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
                raise AlfError(f"the loader ({path})", "its queue stayed full",
                               "try again", EX_TEMPFAIL) from None  # fmt: skip
            time.sleep(0.01)


def send(conn: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """One request or answer, its SocketRules values in their wire form (encode_rules)."""
    data = json.dumps(message, default=_on_wire).encode()
    if len(data) > REQUEST_LIMIT:
        raise AlfError("a request to the loader", f"is {len(data) >> 20} MiB, more than the "
                       f"{REQUEST_LIMIT >> 20} MiB it takes", "use fewer rules, or run "
                       "the service with CAP_BPF", EX_DATAERR)  # fmt: skip
    frame = LENGTH.pack(len(data)) + data
    sent = socket.send_fds(conn, [frame[:65536]], list(fds))
    conn.sendall(frame[sent:])


def receive(  # noqa: C901
    conn: socket.socket, limit: int, seconds: float, max_fds: int
) -> tuple[dict[str, Any], list[int]]:
    """One message and the fds beside it, within ``limit`` bytes and ``seconds``."""
    deadline = time.monotonic() + seconds
    fds: list[int] = []
    data = b""
    try:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        data, fds, flags, _ = socket.recv_fds(conn, 65536, max_fds)
        if not data:
            raise AlfError("the loader", "closed the connection without an answer",
                           "see journalctl -u alfwrapper-loader", EX_SOFTWARE)  # fmt: skip
        if flags & socket.MSG_CTRUNC:
            raise bad_request("too many file descriptors")
        if len(data) < LENGTH.size:
            raise bad_request("a message must start with its length")
        (length,) = LENGTH.unpack(data[: LENGTH.size])
        if length > limit:
            raise bad_request(f"{length} bytes is more than the limit of {limit}")
        body = bytearray(data[LENGTH.size :])
        while len(body) < length:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Late("loader request", f"not all of it arrived within {seconds:.0f} s",
                           "", EX_DATAERR)  # fmt: skip
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
        return message, fds
    except TimeoutError:
        for fd in fds:
            os.close(fd)
        raise Late("loader request", f"nothing complete arrived within {seconds:.0f} s", "",
                   EX_DATAERR) from None  # fmt: skip
    except (ValueError, UnicodeDecodeError) as err:
        for fd in fds:
            os.close(fd)
        raise bad_request(f"it is not JSON ({err})") from None
    except AlfError:
        for fd in fds:
            os.close(fd)
        raise


def bad_request(why: str) -> AlfError:
    return AlfError("loader request", why, "", EX_DATAERR)


class Late(AlfError):
    """A message that did not arrive whole in time: the loader says so to a slow
    client; a client says the loader did not answer (client.Broker)."""


def encode_rules(rules: SocketRules) -> dict[str, Any]:
    """Rules as the loader takes them: everything already read (a filter's text, a
    knock secret), nothing for the loader to open."""
    from alfwrapper.policy.prefix_list import PrefixList  # noqa: PLC0415

    refused = sets_beside_a_filter(rules)
    if refused is not None:
        raise refused
    out: dict[str, Any] = {
        key: {"packed": base64.b64encode(PrefixList.of(prefixes).packed()).decode()}
        for key, prefixes in (("allow", rules.subnets.allow), ("deny", rules.subnets.deny))
    }
    # Named sets by name: the loader opens root's, read-only (loader/server.py).
    for key, names in (("allow_sets", rules.allow_sets), ("deny_sets", rules.deny_sets)):
        if names:
            out[key] = list(names)
    out["log_rate"] = rules.log_rate
    if rules.interfaces:
        out["interfaces"] = list(rules.interfaces)
    if rules.knock:
        k = rules.knock
        out["knock"] = {
            "ports": list(k.ports),
            "secret": k.secret.hex(),
            "steps": k.steps,
            "timeout": k.timeout,
            "open_for": k.open_for,
            "window": k.window,
            "sources": k.sources,
            "spa": k.spa,
            "spa_port": k.spa_port,
            "spa_sender": k.spa_sender,
            "verifier": k.verifier,
        }
    if rules.custom:
        from alfwrapper.policy.inputs import FILTER_LIMIT, read_text_input  # noqa: PLC0415

        source = rules.custom.source or read_text_input(
            rules.custom.path, "--filter", "give a restricted-C file", FILTER_LIMIT
        )
        out["filter"] = {
            "name": rules.custom.path,
            "source": source,
            "sets": [[m.map, m.key, m.value] for m in rules.custom.sets],
        }
    return out


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


def _prefixes(d: dict[str, Any], key: str) -> Sequence[Prefix]:
    """A rule list: packed (PrefixList.packed, base64; what encode_rules sends) or a
    list of CIDR strings (for hand-written requests), of at most RULES_LIMIT rules."""
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


def decode_rules(d: Any) -> SocketRules:  # noqa: C901
    """The rules of a request, checked as strictly as the command line checks them."""
    from alfwrapper.policy.files import accepted  # noqa: PLC0415

    if not isinstance(d, dict):
        raise bad_request("'rules' must be an object")
    allowed = {"allow", "deny", "allow_sets", "deny_sets", "log_rate", "interfaces", "knock",
               "filter"}  # fmt: skip
    if set(d) - allowed:
        raise bad_request(f"unknown rule keys {sorted(set(d) - allowed)}")
    prefixes: dict[str, Sequence[Prefix]] = {}
    for key in ("allow", "deny"):
        prefixes[key] = _prefixes(d, key)
    if d.get("interfaces"):
        raise AlfError(
            "--interface",
            "the loader cannot follow interface renames for a user's service",
            "use subnet rules, or run the service with CAP_BPF",
            EX_USAGE,
        )
    # 0 is "no log"; the highest is the command line's.
    log_rate = _number(d, "log_rate", int, 0, accepted("log-drops")[1]) if "log_rate" in d else 0
    knock = None
    if "knock" in d:
        k = request_field(d, "knock", dict)
        ports = request_field(k, "ports", list)
        if len(ports) > 8 or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
            raise bad_request("'knock.ports' must be at most 8 ports")
        try:
            secret = bytes.fromhex(request_field(k, "secret", str))
        except ValueError:
            raise bad_request("'knock.secret' must be hex") from None
        if len(secret) > 4096 or bool(secret) == bool(ports):
            raise bad_request("a knock needs ports or a secret of at most 4 KiB, not both")
        knock = KnockRules(
            ports=tuple(ports),
            secret=secret,
            steps=_number(k, "steps", int, *accepted("knock-steps")),
            timeout=_number(k, "timeout", float, *accepted("knock-timeout")),
            open_for=_number(k, "open_for", float, *accepted("knock-open-for")),
            window=_number(k, "window", int, *accepted("knock-window")),
            sources=_number(k, "sources", int, *accepted("knock-sources")),
            spa=request_field(k, "spa", bool, False),
            spa_port=_number(k, "spa_port", int, 0, 65535) if "spa_port" in k else 0,
            spa_sender=request_field(k, "spa_sender", bool, False),
            verifier=request_field(k, "verifier", bool, False),
        )
        if knock.spa or knock.verifier:  # kept.py refuses it before it gets here
            raise bad_request("the loader does not make SPA sockets' programs")
    custom = None
    if "filter" in d:
        f = request_field(d, "filter", dict)
        name, source = request_field(f, "name", str), request_field(f, "source", str)
        sets = request_field(f, "sets", list, [])
        if len(name) > 4096 or not source or len(source) > (1 << 20) or len(sets) > 100_000:
            raise bad_request("'filter' needs a name, and a source of at most 1 MiB")
        if not all(isinstance(s, list) and len(s) == 3 and all(isinstance(x, str) and
                   len(x) < 4096 for x in s) for s in sets):  # fmt: skip
            raise bad_request("'filter.sets' must be [map, key, value] strings")
        custom = CustomFilter(name, tuple(MapSetting(*s) for s in sets), source)
    named = {key: _set_names(d, key) for key in ("allow_sets", "deny_sets")}
    rules = SocketRules(
        SubnetRules(prefixes["allow"], prefixes["deny"]), (), knock, custom, log_rate,
        named["allow_sets"], named["deny_sets"],
    )  # fmt: skip
    if rules.sets_conflict:
        raise bad_request("a socket with allow sets may have allow rules or deny rules, not both")
    if rules.too_many_sets:
        raise bad_request(f"more than {MOST_SETS} named sets, allow and deny together")
    if set(rules.allow_sets) & set(rules.deny_sets):
        raise bad_request("a set is named both to allow and to deny")
    refused = sets_beside_a_filter(rules)
    if refused is not None:
        raise refused
    return rules


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


def _set_names(d: dict[str, Any], key: str) -> tuple[str, ...]:
    names = request_field(d, key, list, [])
    if len(names) > MOST_SETS or not all(valid_set_name(n) for n in names):
        raise bad_request(f"'{key}' must be at most {MOST_SETS} set names ({SET_NAME_RULE})")
    if len(set(names)) != len(names):
        raise bad_request(f"'{key}' names a set twice")
    return tuple(names)


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
