"""Records behave as the dataclasses they replace: each case is declared both ways and
must give the same answers (equality, hashing, repr, defaults, freezing, inheritance,
replace), and the same refusals."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from alfwrapper.record import FrozenError, Record, as_dict, as_tuple, field, fields, replace

pytestmark = pytest.mark.unit


@dataclasses.dataclass(frozen=True)
class DRules:
    allow: tuple[int, ...] = ()
    deny: tuple[int, ...] = ()
    extra: list[int] = dataclasses.field(default_factory=list, compare=False)
    sources: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)


class RRules(Record):
    allow: tuple[int, ...] = ()
    deny: tuple[int, ...] = ()
    extra: list[int] = field(default_factory=list, compare=False)
    sources: tuple[str, ...] = field(default=(), compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class DBase:
    name: str
    width: int = 32


@dataclasses.dataclass(frozen=True)
class DChild(DBase):
    depth: int = 0


class RBase(Record):
    name: str
    width: int = 32


class RChild(RBase):
    depth: int = 0


@dataclasses.dataclass
class DCounter:
    count: int
    seen: dict[str, int] = dataclasses.field(default_factory=dict)


class RCounter(Record, frozen=False):
    count: int
    seen: dict[str, int] = field(default_factory=dict)


class RShape(Record, eq=False):
    bits: int


class RChecked(Record):
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError("low above high")


def same(d: Any, r: Any) -> None:
    """The two answer alike, up to the class's name in repr."""
    assert repr(d).split("(", 1)[1] == repr(r).split("(", 1)[1]


def test_value_semantics_match_dataclasses() -> None:
    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {}),
        (((1, 2),), {}),
        (((1,), (3,)), {"sources": ("a",)}),
    ]
    for args, kwargs in cases:
        d1, d2 = DRules(*args, **kwargs), DRules(*args, **{**kwargs, "extra": [9]})
        r1, r2 = RRules(*args, **kwargs), RRules(*args, **{**kwargs, "extra": [9]})
        same(d1, r1)
        same(d2, r2)
        assert (d1 == d2) == (r1 == r2) is True  # extra is not compared
        assert (hash(d1) == hash(d2)) == (hash(r1) == hash(r2)) is True
    assert RRules((1,)) != RRules((2,)) and hash(RRules((1,))) != hash(RRules((2,)))
    assert RRules() != DRules() and RBase("a") != RChild("a")  # another class: never equal
    assert RRules().extra is not RRules().extra  # a fresh list each time
    assert {RRules((1,)), RRules((1,), extra=[5])} == {RRules((1,))}


def test_frozen_like_dataclasses() -> None:
    d, r = DRules((1,)), RRules((1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.allow = ()  # type: ignore[misc]
    with pytest.raises(FrozenError):
        r.allow = ()  # type: ignore[misc]
    with pytest.raises(FrozenError):
        del r.allow
    assert isinstance(FrozenError("x"), AttributeError)  # as FrozenInstanceError is
    assert r.allow == (1,)


def test_inheritance_and_replace_match_dataclasses() -> None:
    d, r = DChild("x", depth=3), RChild("x", depth=3)
    same(d, r)
    assert as_tuple(r) == dataclasses.astuple(d) and as_dict(r) == dataclasses.asdict(d)
    same(dataclasses.replace(d, width=64), replace(r, width=64))
    assert replace(r, width=64) == RChild("x", 64, 3) and r.width == 32
    with pytest.raises(TypeError):
        replace(r, colour="blue")
    with pytest.raises(TypeError):
        RChild()  # type: ignore[call-arg]  # name is required
    with pytest.raises(TypeError):
        RChild("x", 1, 2, 3)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        RChild("x", name="y")  # type: ignore[misc]
    with pytest.raises(TypeError):
        RChild("x", colour="blue")  # type: ignore[call-arg]


def test_mutable_and_identity_records() -> None:
    d, r = DCounter(1), RCounter(1)
    d.count += 1
    r.count += 1
    same(d, r)
    assert r == RCounter(2) and r != RCounter(3)
    with pytest.raises(TypeError):
        hash(r)  # a mutable record is not hashable, as a mutable dataclass
    a, b = RShape(4), RShape(4)
    assert a != b and [a] == [a]  # by identity
    assert len({a, b}) == 2
    c = copy.copy(r)
    assert c == r and c is not r


def test_post_init_checks_every_new_record() -> None:
    assert RChecked(1, 2).high == 2
    with pytest.raises(ValueError, match="low above high"):
        RChecked(3, 2)
    with pytest.raises(ValueError, match="low above high"):
        replace(RChecked(1, 2), low=5)  # a replaced record is made, and checked, anew


class RValueChild(RShape, eq=True):
    colour: str = "red"


def test_each_class_says_its_own_kind() -> None:
    """As with dataclasses, a record compared by identity may have a child compared by
    value (nothing of that is inherited); frozen or not, a child is as its parent."""
    assert RValueChild(4) == RValueChild(4) != RValueChild(4, "blue")
    assert hash(RValueChild(4)) == hash(RValueChild(4))
    assert RShape(4) != RShape(4)
    with pytest.raises(FrozenError):
        RValueChild(4).bits = 5  # type: ignore[misc]
    with pytest.raises(TypeError):

        class Loose(RShape, frozen=False):  # type: ignore[misc]
            pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class DNamed:
    name: str
    width: int = dataclasses.field(default=32, metadata={"unit": "bits"})


class RNamed(Record, kw_only=True):
    name: str
    width: int = field(default=32, metadata={"unit": "bits"})


class RNamedChild(RNamed):
    depth: int = 0


def test_keyword_only_records_and_their_fields_metadata() -> None:
    """kw_only refuses what dataclasses' refuses (a child keeps it), and fields() gives
    each field's declaration back, metadata included, in order."""
    assert RNamed(name="a") == RNamed(name="a", width=32)
    assert repr(RNamed(name="a")).split("(")[1] == repr(DNamed(name="a")).split("(")[1]
    for made in (DNamed, RNamed, RNamedChild):
        with pytest.raises(TypeError):
            made("a")  # type: ignore[misc]
    assert list(fields(RNamedChild)) == ["name", "width", "depth"]
    assert fields(RNamed)["width"].metadata == dataclasses.fields(DNamed)[1].metadata
    assert fields(RNamed)["name"].metadata is None and fields(RNamed)["width"].made() == 32
