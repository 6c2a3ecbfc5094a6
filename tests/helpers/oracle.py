"""The subnet rules' meaning, written the slow obvious way, to check faster code against."""

from __future__ import annotations

import random

from alfwrapper.policy.prefixes import FAMILY_BITS, Prefix
from alfwrapper.policy.rules import SubnetRules


def covers(prefix: Prefix, family: int, value: int) -> bool:
    shift = FAMILY_BITS[family] - prefix.length
    return prefix.family == family and value >> shift == prefix.value >> shift


def passes(rules: SubnetRules, family: int, value: int) -> bool:
    """Deny wins; otherwise an allow match passes; no allow rules at all passes everything."""
    if any(covers(p, family, value) for p in rules.deny):
        return False
    if rules.allow and not any(covers(p, family, value) for p in rules.allow):
        return False
    return True


def random_prefix(rng: random.Random, family: int, base: int, base_bits: int) -> Prefix:
    """A prefix inside base/base_bits mostly, so that rules overlap a lot."""
    width = FAMILY_BITS[family]
    length = rng.choice([rng.randint(0, width), rng.randint(base_bits, width)])
    value = (
        base | rng.getrandbits(width - base_bits) if rng.random() < 0.9 else rng.getrandbits(width)
    )
    shift = width - length
    return Prefix(family, value >> shift << shift, length)


def random_rules(rng: random.Random, count: int) -> SubnetRules:
    bases = {4: (0xC0000000, 8), 6: (0x20010DB8 << 96, 32)}
    allow, deny = [], []
    for _ in range(count):
        family = rng.choice((4, 6))
        base, bits = bases[family]
        (allow if rng.random() < 0.6 else deny).append(random_prefix(rng, family, base, bits))
    if rng.random() < 0.2:
        allow = []
    return SubnetRules(allow=tuple(allow), deny=tuple(deny))


def probe_addresses(rng: random.Random, rules: SubnetRules, count: int) -> list[tuple[int, int]]:
    """Addresses at, just inside and just outside the rules' edges, plus random ones."""
    out = []
    for p in rules.allow + rules.deny:
        width = FAMILY_BITS[p.family]
        size = 1 << (width - p.length)
        for v in (
            p.value,
            p.value + size - 1,
            p.value - 1,
            p.value + size,
            p.value + rng.randrange(size),
        ):
            out.append((p.family, v % (1 << width)))
    while len(out) < count:
        family = rng.choice((4, 6))
        out.append((family, rng.getrandbits(FAMILY_BITS[family])))
    return out
