"""A set's keys and values as the bouncer builds them many at a time (sets._keyed,
with its short way for whole IPv4 addresses) are those of one entry at a time
(sets._key, sets._value), which sets.c reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from alfwrapper import sets
from alfwrapper.policy.prefixes import Prefix

PREFIXES = st.one_of(
    st.builds(lambda v, n: Prefix(4, v >> (32 - n) << (32 - n), n),
              st.integers(0, 2**32 - 1), st.sampled_from([32, 32, 24, 0])),
    st.builds(lambda v, n: Prefix(6, v >> (128 - n) << (128 - n), n),
              st.integers(0, 2**128 - 1), st.sampled_from([128, 128, 48, 0])),
)  # fmt: skip


@settings(deadline=None)  # a loaded machine's pauses are no failure
@given(st.dictionaries(PREFIXES, st.integers(0, 2**63), max_size=50))
def test_many_keys_are_each_ones(entries: dict[Prefix, int]) -> None:
    keyed = sets._keyed(entries)
    one_by_one: dict[str, tuple[list[bytes], list[bytes]]] = {"hosts": ([], []), "ranges": ([], [])}
    for prefix, until in entries.items():
        role, key = sets._key(prefix)
        one_by_one[role][0].append(key)
        one_by_one[role][1].append(sets._value(prefix, until))
    assert keyed == one_by_one
