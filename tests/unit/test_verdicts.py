"""A kept verdict's table (lifecycle/verdicts.py) judges a source as the subnet rules
do (tests/helpers/oracle.py, and SubnetRules.passes, which tests/kernel holds to the
compiled program)."""

from __future__ import annotations

import random

import pytest
from helpers.oracle import passes, probe_addresses, random_rules

from alfwrapper.lifecycle import verdicts
from alfwrapper.policy.prefixes import Prefix

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("seed", range(40))
def test_the_kept_table_judges_as_the_rules_do(seed: int) -> None:
    """Random overlapping rule sets, IPv4 and IPv6, some with no allow rules; sources
    at, inside and beside every rule's edges."""
    rng = random.Random(seed)
    rules = random_rules(rng, rng.choice((1, 5, 30)))
    table = verdicts.table_of(rules.allow, rules.deny)
    for family, value in probe_addresses(rng, rules, 200):
        assert verdicts.passes(table, family, value) == passes(rules, family, value), (
            family,
            hex(value),
        )
        assert passes(rules, family, value) == rules.passes(family, value)


def test_no_rules_of_a_family_is_no_rule_for_it() -> None:
    """Allow rules of one family deny the other; no allow rules at all pass both."""
    v4 = [Prefix(4, 0xC0000200, 24)]
    only4 = verdicts.table_of(v4, [])
    assert verdicts.passes(only4, 4, 0xC0000207)
    assert not verdicts.passes(only4, 6, 0x20010DB8 << 96)
    deny_only = verdicts.table_of([], v4)
    assert not verdicts.passes(deny_only, 4, 0xC0000207)
    assert verdicts.passes(deny_only, 6, 0x20010DB8 << 96)
    assert verdicts.passes(deny_only, 4, 0xC6336402)
