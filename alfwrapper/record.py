"""Records: value classes declared as dataclasses are, made without compiling code.

    class Prefixes(Record):             # frozen, compared and hashed by value
        allow: tuple[Prefix, ...] = ()
        sources: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    class Counter(Record, frozen=False):  # mutable, so not hashable
    class Shape(Record, eq=False):        # compared and hashed by identity
    class Rules(Record, kw_only=True):    # made by keyword only: Rules(allow=...)

Why not the dataclasses module: it writes each class's __init__, __repr__, __eq__,
__hash__ and __setattr__ as source text and compiles it with exec(), about 1.3 ms a
frozen class on this machine.  A warm start defines over thirty, about a quarter of
its time, every start.  attrs does the same, and msgspec (C) is not in Debian 12.  Here
one generic method per role serves every class: a class costs what its own
statement costs.  Only what alfwrapper uses is offered: fields with defaults or
default factories, compare=False and repr=False fields, a field's metadata (what
fields() gives back, as dataclasses.fields does), keyword-only records,
__post_init__, inheritance of fields, replace(), and a shallow as_tuple() / as_dict().
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs a start that needs it nowhere else 4 ms
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T", bound="Record")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls


_MISSING: Any = object()


class FrozenError(AttributeError):
    """An assignment to a frozen record's field."""


class Field:
    """What field() declares: a default or a factory of one, whether the field is
    compared (and hashed) and shown, and what else its class says of it (metadata)."""

    __slots__ = ("default", "factory", "compare", "repr", "metadata")

    def __init__(
        self, default: Any, factory: Any, compare: bool, repr: bool, metadata: Any = None
    ) -> None:
        self.default, self.factory, self.compare, self.repr = default, factory, compare, repr
        self.metadata = metadata

    def made(self) -> Any:
        """The default, or a new one from the factory (a field with neither: KeyError)."""
        if self.default is not _MISSING:
            return self.default
        if self.factory is not _MISSING:
            return self.factory()
        raise KeyError("a field without a default")


def field(
    *,
    default: Any = _MISSING,
    default_factory: Any = _MISSING,
    compare: bool = True,
    repr: bool = True,
    metadata: Any = None,
) -> Any:
    return Field(default, default_factory, compare, repr, metadata)


class _Spec:
    """A record class's fields, in order, as its methods use them."""

    __slots__ = ("fields", "names", "compared", "shown", "defaults", "factories", "frozen",
                 "kw_only", "post_init")  # fmt: skip

    def __init__(
        self, fields: dict[str, Field], frozen: bool, kw_only: bool, post_init: bool
    ) -> None:
        self.fields = fields
        self.names = tuple(fields)
        self.compared = tuple(n for n, f in fields.items() if f.compare)
        self.shown = tuple(n for n, f in fields.items() if f.repr)
        self.defaults = {n: f.default for n, f in fields.items() if f.default is not _MISSING}
        self.factories = {n: f.factory for n, f in fields.items() if f.factory is not _MISSING}
        self.frozen = frozen
        self.kw_only = kw_only
        self.post_init = post_init


def _annotations(cls: type) -> dict[str, Any]:
    own = cls.__dict__.get("__annotations__", {})
    return {n: a for n, a in own.items() if not str(a).startswith(("ClassVar", "typing.ClassVar"))}


@dataclass_transform(
    frozen_default=True, eq_default=True, kw_only_default=False, field_specifiers=(field, Field)
)
class Record:
    """The base of every record: see the module's text."""

    _spec_: _Spec

    def __init_subclass__(
        cls, *, frozen: bool | None = None, eq: bool = True, kw_only: bool | None = None
    ) -> None:
        parent: _Spec | None = next(
            (b.__dict__["_spec_"] for b in cls.__mro__[1:] if "_spec_" in b.__dict__), None
        )
        fields: dict[str, Field] = dict(parent.fields) if parent is not None else {}
        for name in _annotations(cls):
            value = cls.__dict__.get(name, _MISSING)
            declared = value if isinstance(value, Field) else Field(value, _MISSING, True, True)
            fields.pop(name, None)
            fields[name] = declared
            if isinstance(value, Field):
                if value.default is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, value.default)
        if frozen is None:
            frozen = parent.frozen if parent is not None else True
        if parent is not None and frozen != parent.frozen:
            raise TypeError(f"{cls.__name__}: a record and its parent are both frozen, or neither")
        if kw_only is None:
            kw_only = parent.kw_only if parent is not None else False
        cls._spec_ = _Spec(fields, frozen, kw_only, hasattr(cls, "__post_init__"))
        # Set on every class, not inherited: a parent may be mutable, or compared by
        # identity, where this one is not.  What the class itself defines stays.
        for name, method in (
            ("__setattr__", Record.__setattr__ if frozen else object.__setattr__),
            ("__delattr__", Record.__delattr__ if frozen else object.__delattr__),
            ("__eq__", Record.__eq__ if eq else object.__eq__),
            ("__hash__", (Record.__hash__ if frozen else None) if eq else object.__hash__),
        ):
            if name not in cls.__dict__:
                setattr(cls, name, method)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        spec = self._spec_
        names = spec.names
        if args and spec.kw_only:
            raise TypeError(f"{type(self).__name__}() takes its fields by keyword only")
        if len(args) > len(names):
            raise TypeError(
                f"{type(self).__name__}() takes {len(names)} arguments, got {len(args)}"
            )
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name in values or name not in names:
                raise TypeError(f"{type(self).__name__}(): unexpected or repeated {name!r}")
            values[name] = value
        if len(values) < len(names):
            for name in names:
                if name in values:
                    continue
                if name in spec.defaults:
                    values[name] = spec.defaults[name]
                elif name in spec.factories:
                    values[name] = spec.factories[name]()
                else:
                    raise TypeError(f"{type(self).__name__}(): missing {name!r}")
            values = {name: values[name] for name in names}
        object.__setattr__(self, "__dict__", values)
        if spec.post_init:
            self.__post_init__()  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise FrozenError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def _compared(self) -> tuple[Any, ...]:
        values = self.__dict__
        return tuple([values[name] for name in self._spec_.compared])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        values = self.__dict__
        shown = ", ".join(f"{name}={values[name]!r}" for name in self._spec_.shown)
        return f"{type(self).__qualname__}({shown})"


def replace(record: T, **changes: Any) -> T:
    """A copy of ``record`` with ``changes``, made (and checked) as a new one is."""
    values = {name: record.__dict__[name] for name in record._spec_.names}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(record)(**values)


def fields(cls: type[Record]) -> dict[str, Field]:
    """A record class's fields by name, in order, as declared (not to be changed)."""
    return cls._spec_.fields


def as_tuple(record: Record) -> tuple[Any, ...]:
    """The fields' values, in order (not copied: records inside stay records)."""
    return tuple(record.__dict__[name] for name in record._spec_.names)


def as_dict(record: Record) -> dict[str, Any]:
    """The fields by name, in order (not copied)."""
    return {name: record.__dict__[name] for name in record._spec_.names}
