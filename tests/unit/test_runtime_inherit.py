"""What a new socket takes from its service's earlier sockets (state/runtime.py: inherit_runtime):
the rules of those of its name only, a deny over an allow of the same prefix, nothing
it holds already.  The pinned maps are dicts here; tests/netns/test_live.py and
tests/netns/test_crash.py hold the real ones to real traffic."""

from __future__ import annotations

import pytest

from alfwrapper import state
from alfwrapper.bpf.parts import RUNTIME_ALLOW, RUNTIME_DENY, RUNTIME_KEY
from alfwrapper.policy.prefixes import parse_prefix
from alfwrapper.state import runtime

pytestmark = pytest.mark.unit

Rules = dict[int, dict[bytes, int]]


class Tree:
    """A store of sockets (by cookie) with their names and runtime maps."""

    def __init__(self, names: dict[int, str], rules: Rules) -> None:
        self.names, self.rules = names, rules

    def sockets_of(self, service: str) -> list[state.SocketState]:
        return [state.SocketState(service, c) for c in sorted(self.names)]

    def has_pin(self, where: state.SocketState, name: str) -> bool:
        return where.cookie in self.rules


def key(text: str) -> bytes:
    p = parse_prefix(text)
    return state.runtime_key(p.family, p.value, p.length)


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Tree:
    t = Tree({}, {})

    def rules_of(where: state.SocketState) -> list[tuple[int, int, int, int]]:
        out = []
        for k, verdict in t.rules[where.cookie].items():
            length, family, _, raw = RUNTIME_KEY.unpack(k)
            width = 4 if family == 4 else 16
            out.append((family, int.from_bytes(raw[:width], "big"), length - 32, verdict))
        return out

    def set_rule(where: state.SocketState, k: bytes, verdict: int | None) -> bool:
        assert verdict is not None
        t.rules[where.cookie][k] = verdict
        return True

    monkeypatch.setattr(runtime, "pins_in_use", lambda: t)
    monkeypatch.setattr(runtime, "read_meta", lambda w: {"name": t.names[w.cookie]})
    monkeypatch.setattr(runtime, "runtime_rules", rules_of)
    monkeypatch.setattr(runtime, "set_runtime", set_rule)
    return t


def test_a_new_socket_takes_its_names_rules_and_a_deny_wins(tree: Tree) -> None:
    tree.names.update({1: "web", 2: "web", 3: "dns", 4: "web"})
    tree.rules.update(
        {
            1: {key("192.0.2.7/32"): RUNTIME_DENY, key("2001:db8::/48"): RUNTIME_ALLOW},
            2: {key("2001:db8::/48"): RUNTIME_DENY, key("198.51.100.0/24"): RUNTIME_ALLOW},
            3: {key("203.0.113.9/32"): RUNTIME_DENY},
            4: {key("198.51.100.0/24"): RUNTIME_ALLOW},
        }
    )
    given = state.inherit_runtime(state.SocketState("svc", 4), "web")
    assert tree.rules[4] == {
        key("192.0.2.7/32"): RUNTIME_DENY,
        key("2001:db8::/48"): RUNTIME_DENY,  # allowed by one, denied by another
        key("198.51.100.0/24"): RUNTIME_ALLOW,
    }
    assert given == 2  # the allow it held already is not given again
    assert key("203.0.113.9/32") not in tree.rules[4]  # another name's


def test_a_socket_keeps_its_own_deny_over_an_inherited_allow(tree: Tree) -> None:
    tree.names.update({1: "web", 2: "web"})
    tree.rules.update(
        {1: {key("192.0.2.7/32"): RUNTIME_ALLOW}, 2: {key("192.0.2.7/32"): RUNTIME_DENY}}
    )
    assert state.inherit_runtime(state.SocketState("svc", 2), "web") == 0
    assert tree.rules[2] == {key("192.0.2.7/32"): RUNTIME_DENY}
