"""The subnet table gives every address the verdict the rules mean."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import passes, probe_addresses, random_rules

from alfwrapper.rules import SubnetRules, parse_prefix
from alfwrapper.subnet_table import (
    MAX_NODES,
    NODE_DESCEND,
    NODE_PASS,
    ROOT_ENTRIES,
    build_subnet_table,
    lookup,
)


def rules_of(allow: list[str] = (), deny: list[str] = ()) -> SubnetRules:  # type: ignore[assignment]
    return SubnetRules(allow=tuple(map(parse_prefix, allow)), deny=tuple(map(parse_prefix, deny)))


def check(rules: SubnetRules, addresses: list[tuple[int, int]]) -> None:
    table = build_subnet_table(rules)
    for family, value in addresses:
        assert lookup(table, family, value) == passes(rules, family, value), (family, hex(value))


def test_no_rules_pass_everything() -> None:
    table = build_subnet_table(SubnetRules())
    assert set(table.roots) == {NODE_PASS}
    assert table.nodes == ()
    assert len(table.roots) == ROOT_ENTRIES


def test_allow_in_one_family_drops_the_other() -> None:
    table = build_subnet_table(rules_of(allow=["192.0.2.0/24"]))
    assert lookup(table, 4, parse_prefix("192.0.2.9").value)
    assert not lookup(table, 4, parse_prefix("192.0.3.9").value)
    assert not lookup(table, 6, parse_prefix("2001:db8::1").value)


def test_deny_wins_inside_allow() -> None:
    rules = rules_of(allow=["192.0.2.0/24"], deny=["192.0.2.128/25"])
    table = build_subnet_table(rules)
    assert lookup(table, 4, parse_prefix("192.0.2.127").value)
    assert not lookup(table, 4, parse_prefix("192.0.2.128").value)
    # allow inside deny does not punch a hole
    table = build_subnet_table(rules_of(allow=["192.0.2.7"], deny=["192.0.0.0/16"]))
    assert not lookup(table, 4, parse_prefix("192.0.2.7").value)


def test_levels_are_the_byte_lengths_in_use() -> None:
    table = build_subnet_table(
        rules_of(
            allow=[
                "192.0.2.0/24",
                "198.51.100.7",
                "10.0.0.0/8",
                "2001:db8::/48",
                "2001:db8:8000::/33",
            ]
        )
    )
    assert table.levels == {4: (3, 4), 6: (5, 6)}


def test_covered_prefixes_add_no_entries() -> None:
    table = build_subnet_table(rules_of(allow=["192.0.0.0/16", "192.0.2.0/24", "192.0.2.1"]))
    assert table.nodes == ()


def test_expansion_to_the_next_byte() -> None:
    table = build_subnet_table(rules_of(deny=["192.0.2.0/25"]))
    assert len(table.nodes) == 128
    assert all(node == 0 for _, _, _, node in table.nodes)
    root = table.roots[0xC000]
    assert root == NODE_DESCEND | NODE_PASS


def test_too_many_entries_is_a_clear_error() -> None:
    many = [f"{a}.{b}.{c}.0/25" for a in range(1, 256) for b in range(256) for c in range(0, 256)]
    assert len(many) * 128 > MAX_NODES
    from alfwrapper.errors import AlfError  # noqa: PLC0415

    with pytest.raises(AlfError, match="expand to more than"):
        build_subnet_table(rules_of(deny=many[: MAX_NODES // 128 + 1]))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_table_agrees_with_the_rules(seed: int, count: int) -> None:
    rng = random.Random(seed)
    rules = random_rules(rng, count)
    check(rules, probe_addresses(rng, rules, 60))
