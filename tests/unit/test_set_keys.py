"""A set's keys, values and sieve bits as the bouncer builds them many at a time
(content._keyed, with its short way for whole IPv4 addresses) are those of one entry
at a time (content._key, content._value, bloom.sieved), which sets.c reads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alfwrapper.policy.prefixes import Prefix
from alfwrapper.sets import bloom, content

pytestmark = pytest.mark.unit

PREFIXES = st.one_of(
    st.builds(lambda v, n: Prefix(4, v >> (32 - n) << (32 - n), n),
              st.integers(0, 2**32 - 1), st.sampled_from([32, 32, 24, 0])),
    st.builds(lambda v, n: Prefix(6, v >> (128 - n) << (128 - n), n),
              st.integers(0, 2**128 - 1), st.sampled_from([128, 128, 48, 0])),
)  # fmt: skip


@settings(deadline=None)  # a loaded machine's pauses are no failure
@given(
    st.dictionaries(PREFIXES, st.integers(0, 2**63), max_size=50),
    st.sampled_from([40, 46, 58]),
)
def test_many_keys_are_each_ones(entries: dict[Prefix, int], shift: int) -> None:
    keyed, bits = content._keyed(entries, shift)
    one_by_one: dict[str, tuple[list[bytes], list[bytes]]] = {"hosts": ([], []), "ranges": ([], [])}
    for prefix, until in entries.items():
        role, key = content._key(prefix)
        one_by_one[role][0].append(key)
        one_by_one[role][1].append(content._value(prefix, until))
    for role, (keys, values) in one_by_one.items():  # in any order, each key with its value
        assert sorted(zip(*keyed[role], strict=True)) == sorted(zip(keys, values, strict=True))
    assert bits == bloom.sieved(shift, list(entries))
    assert all(1 <= index <= 1 + (2**64 - 1 >> shift) for index in bits.spots)


def test_the_sieve_sends_few_others_on_to_the_hash() -> None:
    """At a set's size (SIEVE_BITS_AN_ENTRY bits an entry), about 0.5% of sources in
    none of its addresses find their bits (docs/architecture.md's figure), IPv4 and IPv6."""
    import random  # noqa: PLC0415

    from alfwrapper.bpf.parts import sieve_shift  # noqa: PLC0415

    rng = random.Random(27)
    size = 1 << 16
    shift = sieve_shift(1 + bloom.sieve_words(size))
    for family, width in ((4, 32), (6, 128)):
        held = bloom.sieved(
            shift, [Prefix(family, rng.getrandbits(width), width) for _ in range(size)]
        ).spots
        probes = [
            bloom.sieved(shift, [Prefix(family, rng.getrandbits(width), width)]).spots
            for _ in range(20000)
        ]
        found = sum(held.get(i, 0) & bits == bits for probe in probes for i, bits in probe.items())
        assert found / len(probes) < 0.008, (family, found / len(probes))


@settings(deadline=None)
@given(
    st.lists(st.integers(0, 2**64 - 1), min_size=8, max_size=8),
    st.dictionaries(st.integers(1, 7), st.integers(0, 2**64 - 1)),
)
def test_many_words_grow_as_each_one_does(words: list[int], found: dict[int, int]) -> None:
    """sieve_add's numpy way for many words (_grown_many) is its one-by-one way."""
    from array import array  # noqa: PLC0415

    word = memoryview(array("Q", words)).cast("B").cast("Q")
    assert bloom._grown_many(word, found) == bloom._grown(word, found)


@pytest.mark.parametrize(
    "prefix",
    [
        Prefix(4, 2**32 + 5, 32),
        Prefix(4, 2**64, 32),
        Prefix(4, -1, 32),
        Prefix(6, 2**128, 128),
        Prefix(6, -1, 128),
    ],
)
def test_an_address_out_of_its_family_is_refused_as_one_at_a_time_refuses_it(
    prefix: Prefix,
) -> None:
    """The columns cut nothing short: what _key cannot write, _keyed refuses too."""
    with pytest.raises(OverflowError):
        content._key(prefix)
    with pytest.raises(OverflowError):
        content._keyed({prefix: 0}, 40)
