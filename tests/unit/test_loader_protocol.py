"""The loader's request format, both ways: rules survive the trip, and whatever a
hostile client writes instead is refused with an AlfError, never anything else."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest

from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.errors import AlfError
from alfwrapper.loader import protocol
from alfwrapper.policy.files import SETTINGS
from alfwrapper.policy.rules import CustomFilter, KnockRules, MapSetting, SocketRules
from alfwrapper.record import replace

pytestmark = pytest.mark.unit


def test_rules_survive_the_trip(tmp_path: Any) -> None:
    """What a client sends is what the loader reads: send encodes a SocketRules, and
    nothing else that JSON lacks."""
    source = tmp_path / "f.c"
    source.write_text('#include "common.h"\nint filter(struct __sk_buff *skb) { return 1; }\n')
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    policy = parse_policy(
        ["--allow", "192.0.2.0/24", "--deny", "192.0.2.7", "--allow", "2001:db8::/32",
         "--knock-secret", str(secret), "--knock-timeout", "2", "--log-drops", "9",
         "--filter", str(source), "--set", "m", "1", "2", "--", "true"]
    )  # fmt: skip
    rules = policy.rules_for("x")
    a, b = socket.socketpair()
    with a, b:  # a request carries the rules themselves: send puts them in wire form
        protocol.send(a, {"op": "load", "rules": rules})
        message, _ = protocol.receive(b, protocol.REQUEST_LIMIT, 5, 1)
    back = protocol.decode_rules(message["rules"])
    assert back.custom is not None and rules.custom is not None
    assert back.custom.source == source.read_text()  # the text travels, not the path
    assert back == SocketRules(
        subnets=rules.subnets,
        knock=rules.knock,
        log_rate=rules.log_rate,
        custom=CustomFilter(
            path=str(source),
            sets=(MapSetting(map="m", key="1", value="2"),),
            source=source.read_text(),
        ),
    )
    with socket.socket() as unused, pytest.raises(TypeError, match="has no wire form"):
        protocol.send(unused, {"rules": object()})


# What clients and loaders of the releases before the codec was derived from the rule
# records (policy/rules.py: Rule) sent and read, byte for byte but for the packed
# rules, which are zlib's: either end may be a release older than the other.
EARLIER_WIRE = [
    (
        SocketRules(allow_sets=("office",), deny_sets=("crowdsec", "drop"), log_rate=7),
        '{"allow_sets": ["office"], "deny_sets": ["crowdsec", "drop"], "log_rate": 7}',
    ),
    (
        SocketRules(knock=KnockRules(secret=b"k" * 4, steps=4, timeout=2.0, open_for=9.0,
                                     window=10, sources=2048, spa_port=77, spa_sender=True)),
        '{"log_rate": 0, "knock": {"ports": [], "secret": "6b6b6b6b", "steps": 4, '
        '"timeout": 2.0, "open_for": 9.0, "window": 10, "sources": 2048, "spa": false, '
        '"spa_port": 77, "spa_sender": true, "verifier": false}}',
    ),
    (
        SocketRules(knock=KnockRules(ports=(7001, 7002))),
        '{"log_rate": 0, "knock": {"ports": [7001, 7002], "secret": "", "steps": 3, '
        '"timeout": 5.0, "open_for": 30.0, "window": 30, "sources": 131072, "spa": false, '
        '"spa_port": 0, "spa_sender": false, "verifier": false}}',
    ),
    (
        SocketRules(custom=CustomFilter(path="f.c", source="int filter;",
                                        sets=(MapSetting(map="m", key="1", value="2"),))),
        '{"log_rate": 0, "filter": {"name": "f.c", "source": "int filter;", '
        '"sets": [["m", "1", "2"]]}}',
    ),
    (
        SocketRules(interfaces=("lo",)),
        '{"log_rate": 0, "interfaces": ["lo"]}',
    ),
]  # fmt: skip


@pytest.mark.parametrize(("rules", "text"), EARLIER_WIRE)
def test_the_wire_is_the_earlier_releases(rules: SocketRules, text: str) -> None:
    wire = protocol.encode_rules(rules)
    assert list(wire)[:2] == ["allow", "deny"]
    packed = {key: wire.pop(key) for key in ("allow", "deny")}
    assert json.dumps(wire) == text
    if not rules.interfaces:  # the loader refuses those
        assert protocol.decode_rules(json.loads(text) | packed) == rules


TRAVELLING = sorted(key for key, s in SETTINGS.items() if not isinstance(s.default, bool))


def _with(key: str, value: object) -> SocketRules:
    """Rules with the setting ``key`` at ``value``, in a knock the loader takes."""
    setting = SETTINGS[key]
    knock = KnockRules(ports=(7001,))
    if setting.record is KnockRules:
        return SocketRules(knock=replace(knock, **{setting.name: value}))
    return SocketRules(knock=knock, **{setting.name: value})


@pytest.mark.parametrize("key", TRAVELLING)
def test_every_setting_travels_within_its_limits(key: str) -> None:
    """Each number a policy key sets (its Rule in policy/rules.py) reaches the loader
    and back, at its default and at its limits, and is refused past them, as the
    command line refuses it: its limits are stated once."""
    setting = SETTINGS[key]
    low, high = setting.rule.accepted()
    for value in (setting.default, low, high):
        wire = json.loads(json.dumps(protocol.encode_rules(_with(key, value))))
        assert protocol.decode_rules(wire) == _with(key, value)
    step = 1 if isinstance(setting.default, int) else 0.01
    for value in (min(low, setting.default) - step, high + step):
        wire = json.loads(json.dumps(protocol.encode_rules(_with(key, value))))
        with pytest.raises(AlfError, match="must be from"):
            protocol.decode_rules(wire)


def test_a_field_an_older_client_leaves_out_takes_its_default() -> None:
    """A request without the fields that are not required (what a client of an earlier
    release would not send) reads as their defaults; one without a required field is
    refused."""
    wire = json.loads(json.dumps(protocol.encode_rules(_with("knock-spa-port", 9))))
    for key in ("spa", "spa_port", "spa_sender", "verifier"):
        del wire["knock"][key]
    del wire["log_rate"]
    assert protocol.decode_rules(wire) == SocketRules(knock=KnockRules(ports=(7001,)))
    del wire["knock"]["steps"]
    with pytest.raises(AlfError, match="'steps' must be a int"):
        protocol.decode_rules(wire)


HOSTILE: list[Any] = [
    None,
    [],
    "rules",
    {"allow": "192.0.2.0/24"},
    {"allow": [1]},
    {"allow": ["192.0.2.5/24"]},
    {"deny": ["not an address"]},
    {"allow": ["::ffff:0:0/200"]},
    {"unknown": 1},
    {"log_rate": True},
    {"log_rate": 10**9},
    {"log_rate": "5"},
    {"interfaces": ["lo"]},
    {"knock": []},
    {"knock": {"ports": [70000]}},
    {"knock": {"ports": [1, 2], "secret": "zz"}},
    {"knock": {"ports": [1, 2], "secret": "00"}},
    {
        "knock": {
            "ports": [1, 2],
            "secret": "",
            "steps": 3,
            "timeout": 0.01,
            "open_for": 30,
            "window": 30,
            "sources": 131072,
        }
    },
    {"knock": {"ports": [1] * 9, "secret": ""}},
    *(  # SPA: the loader makes neither its socket's programs nor its SPA socket's
        {
            "knock": {
                "ports": [],
                "secret": "00" * 32,
                "steps": 3,
                "timeout": 5.0,
                "open_for": 30.0,
                "window": 30,
                "sources": 131072,
                key: True,
            }
        }
        for key in ("spa", "verifier")
    ),
    {"filter": {"name": "x.c"}},
    {"filter": {"name": "x.c", "source": ""}},
    {"filter": {"name": "x.c", "source": "x" * (2 << 20)}},
    {"filter": {"name": 7, "source": "int filter;"}},
    {"filter": {"name": "x.c", "source": "int filter;", "sets": [["m", "1"]]}},
    {"filter": {"name": "x.c", "source": "int filter;", "sets": [[1, 2, 3]]}},
    {"deny_sets": "crowdsec"},
    {"deny_sets": ["../alfwrapper/x"]},
    {"deny_sets": ["a.b"]},
    {"allow_sets": [""]},
    {"allow_sets": ["x" * 65]},
    {"deny_sets": [7]},
    {"deny_sets": ["a", "a"]},
    {"deny_sets": [f"s{i}" for i in range(33)]},
    {"deny_sets": [f"d{i}" for i in range(16)], "allow_sets": [f"a{i}" for i in range(17)]},
    {"allow_sets": ["a"], "deny_sets": ["a"]},
]


@pytest.mark.parametrize("rules", HOSTILE, ids=[json.dumps(h)[:40] for h in HOSTILE])
def test_hostile_rules_are_refused_cleanly(rules: Any) -> None:
    with pytest.raises(AlfError):
        protocol.decode_rules(rules)


def test_framing_refuses_oversized_and_truncated() -> None:
    for data in (
        protocol.LENGTH.pack(protocol.REQUEST_LIMIT + 1),
        protocol.LENGTH.pack(50) + b"{}",
        b"\x00",
        protocol.LENGTH.pack(2) + b"[]",
    ):
        a, b = socket.socketpair()
        with a, b:
            a.sendall(data)
            a.shutdown(socket.SHUT_WR)
            with pytest.raises(AlfError):
                protocol.receive(b, protocol.REQUEST_LIMIT, 2, 1)
    a, b = socket.socketpair()
    with a, b:
        protocol.send(a, {"op": "services", "x": "y" * 200_000})
        message, fds = protocol.receive(b, protocol.REQUEST_LIMIT, 2, 1)
        assert message["op"] == "services" and len(message["x"]) == 200_000 and fds == []


@pytest.mark.parametrize("sent", [b"", protocol.LENGTH.pack(100) + b"{"])
def test_a_loader_that_does_not_answer_in_time_is_named_as_such(tmp_path: Any, sent: bytes) -> None:
    """A client waits as long as it was told, then says the loader did not answer and
    where to look: not that its own request was bad (the words the loader says to a
    slow client).  The loader's end here answers nothing, or half an answer."""
    from alfwrapper.errors import EX_UNAVAILABLE  # noqa: PLC0415
    from alfwrapper.loader import client  # noqa: PLC0415

    path = str(tmp_path / "loader.sock")
    held: list[socket.socket] = []

    def loader(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.sendall(sent)
        held.append(conn)

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        thread = threading.Thread(target=loader, args=(listener,))
        thread.start()
        try:
            with pytest.raises(AlfError) as err:
                client.Broker(path).request({"op": "limits"}, seconds=1)
        finally:
            thread.join(5)
            for conn in held:
                conn.close()
    assert err.value.exit_code == EX_UNAVAILABLE, err.value.line()
    assert err.value.line() == (
        f"alfwrapper: the loader ({path}): gave no complete answer within 1 s "
        "(check `systemctl status alfwrapper-loader.service`)"
    )


def test_named_sets_travel_by_name() -> None:
    """A user's rules may name root's sets: their names travel (the loader opens the
    sets, read-only), in order, and an allow set beside allow and deny rules is
    refused as the policy refuses it."""
    from alfwrapper.policy.prefixes import parse_prefix  # noqa: PLC0415
    from alfwrapper.policy.rules import SubnetRules  # noqa: PLC0415

    rules = SocketRules(
        subnets=SubnetRules(allow=(parse_prefix("192.0.2.0/24"),)),
        allow_sets=("office",),
        deny_sets=("crowdsec", "drop"),
    )
    wire = protocol.encode_rules(rules)
    assert wire["deny_sets"] == ["crowdsec", "drop"] and wire["allow_sets"] == ["office"]
    assert protocol.decode_rules(json.loads(json.dumps(wire))) == rules
    assert "deny_sets" not in protocol.encode_rules(SocketRules())
    both = dict(wire, deny=wire["allow"])
    with pytest.raises(AlfError, match="allow rules or deny rules, not both"):
        protocol.decode_rules(both)
    # A developer's filter beside root's sets: refused by the client and by the loader.
    custom = SocketRules(
        deny_sets=("crowdsec",), custom=CustomFilter(path="f.c", source="int filter;")
    )
    with pytest.raises(AlfError, match="not compiled beside root's sets") as caught:
        protocol.encode_rules(custom)
    assert caught.value.exit_code == 64
    wire = {"deny_sets": ["crowdsec"], "filter": {"name": "f.c", "source": "int filter;"}}
    with pytest.raises(AlfError, match="not compiled beside root's sets"):
        protocol.decode_rules(wire)


class _Events:
    """A user's memory cgroup's limit events, as cgroups.UserMemory.watch reads them."""

    def __init__(self) -> None:
        self.count = 0
        self.everyone = 0  # the loader's whole cgroup: its unit's MemoryMax=

    def watch(self, uid: int) -> Any:
        return lambda: self.count

    def watch_all(self) -> Any:
        return lambda: self.everyone + self.count  # the counts are hierarchical


@pytest.mark.parametrize(
    ("refused", "error"),
    [
        (True, PermissionError(13, "Permission denied")),
        (False, PermissionError(13, "x")),
        (True, ValueError("not memory")),
    ],
    ids=["limit reached", "no limit", "limit reached, not an allocation's error"],
)
def test_a_failure_while_memory_is_refused_is_the_quota(
    monkeypatch: Any, refused: bool, error: Exception
) -> None:
    """An allocation's error from deep in a load (a PermissionError, as a refused
    allocation surfaced once on Debian's 6.1) is the quota's answer (77) if the user's
    memory cgroup reached its limit meanwhile, else an internal error (70), as is
    any other error: the user's own limit never relabels a bug."""
    from alfwrapper.loader import server  # noqa: PLC0415
    from alfwrapper.loader.quota import Caller, Limits  # noqa: PLC0415

    events = _Events()

    def failing(*args: Any) -> Any:
        events.count += refused
        raise error

    monkeypatch.setattr(server, "handle", failing)
    a, b = socket.socketpair()
    with a, b:
        protocol.send(b, {"op": "limits"})
        server.serve_one(a, Caller(1, 4242, 4242), Limits(memory=events))  # type: ignore[arg-type]
        answer, _ = protocol.receive(b, protocol.REQUEST_LIMIT, 5, 1)
    said = answer["error"]
    if refused and isinstance(error, OSError):
        assert said["code"] == 77 and said["what"] == "loader quota", said
    else:
        assert said == {
            "what": "loader",
            "why": f"internal error: {type(error).__name__}",
            "hint": "report it",
            "code": 70,
        }


def test_memory_refused_for_everyone_is_said_to_be_other_users_load(monkeypatch: Any) -> None:
    """When the loader as a whole reached its unit's MemoryMax= and the caller's own
    quota did not, the failure is other people's load: "busy with other users'
    requests", 75 (try again), never "your quota" nor an internal error."""
    from alfwrapper.loader import server  # noqa: PLC0415
    from alfwrapper.loader.quota import Caller, Limits  # noqa: PLC0415

    events = _Events()

    def failing(*args: Any) -> Any:
        events.everyone += 1
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(server, "handle", failing)
    a, b = socket.socketpair()
    with a, b:
        protocol.send(b, {"op": "limits"})
        server.serve_one(a, Caller(1, 4242, 4242), Limits(memory=events))  # type: ignore[arg-type]
        answer, _ = protocol.receive(b, protocol.REQUEST_LIMIT, 5, 1)
    said = answer["error"]
    assert said["code"] == 75 and said["what"] == "the loader", said
    assert said["why"].startswith("busy with other users' requests"), said
