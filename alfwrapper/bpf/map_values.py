"""Turn ``--set MAP KEY VALUE`` text into a map's key and value, by the types BCC reports.

The types are the ctypes classes BCC builds for a map (``table.Key`` and
``table.Leaf``); this module only reads them, so it is tested without a
kernel.  Accepted, per field type:

- integers (any width): decimal or 0x hex; an interface name (its index);
  an IPv4 address in a 32-bit field (stored in network byte order, as it
  sits in the packet);
- byte arrays of 4 or 16: an IPv4 or IPv6 address;
- a struct: its fields, comma-separated, in order;
- an LPM-trie key (a struct of a 32-bit prefix length then a byte array):
  a CIDR such as 192.0.2.0/24.
"""

from __future__ import annotations

import ctypes
import ipaddress
from collections.abc import Callable
from typing import Any

from alfwrapper.errors import excerpt
from alfwrapper.policy.prefixes import parse_prefix

IfindexOf = Callable[[str], int | None]

_INTEGERS = (
    ctypes.c_byte,
    ctypes.c_ubyte,
    ctypes.c_short,
    ctypes.c_ushort,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_long,
    ctypes.c_ulong,
    ctypes.c_longlong,
    ctypes.c_ulonglong,
    ctypes.c_bool,
    ctypes.c_char,
)


# C type names in BCC's descriptions of map types, as ctypes.
_C_TYPES: dict[str, Any] = {
    "_Bool": ctypes.c_bool,
    "char": ctypes.c_char,
    "unsigned char": ctypes.c_ubyte,
    "short": ctypes.c_short,
    "unsigned short": ctypes.c_ushort,
    "int": ctypes.c_int,
    "unsigned int": ctypes.c_uint,
    "long": ctypes.c_long,
    "unsigned long": ctypes.c_ulong,
    "long long": ctypes.c_longlong,
    "unsigned long long": ctypes.c_ulonglong,
    "__int128": ctypes.c_int64 * 2,
    "unsigned __int128": ctypes.c_uint64 * 2,
}


def ctype_of(desc: Any) -> Any:
    """The ctypes type of BCC's JSON description of a map's key or value (libbcc's
    bpf_table_key_desc): a C type name, or [name, fields, "struct"|"union"|
    "struct_packed"] whose fields are [name, type], [name, type, [count]] (an
    array), [name, type, bits] or a nested description.  The same reading as
    BCC's Python, here so that a program from the cache needs no BCC."""
    if isinstance(desc, str):
        try:
            return _C_TYPES[desc]
        except KeyError:
            raise ValueError(f"unknown C type {desc!r}") from None
    fields: list[tuple[Any, ...]] = []
    anonymous: list[str] = []
    for item in desc[1]:
        if len(item) == 2:
            fields.append((item[0], ctype_of(item[1])))
        elif len(item) == 3 and isinstance(item[2], list):
            fields.append((item[0], ctype_of(item[1]) * item[2][0]))
        elif len(item) == 3 and isinstance(item[2], int):
            fields.append((item[0], ctype_of(item[1]), item[2]))
        elif len(item) == 3 and item[2] in ("struct", "union", "struct_packed"):
            name = item[0] or f"__anon{len(anonymous)}"
            if not item[0]:
                anonymous.append(name)
            fields.append((name, ctype_of(item)))
        else:
            raise ValueError(f"cannot read the type description {item!r}")
    kind = desc[2] if len(desc) > 2 else "struct"
    base = ctypes.Union if kind == "union" else ctypes.Structure
    body: dict[str, Any] = {"_anonymous_": anonymous, "_fields_": fields}
    if kind == "struct_packed":
        body["_pack_"] = 1
    return type(str(desc[0]), (base,), body)


def type_name(ctype: Any) -> str:
    """A C-like name for a ctypes type, for error messages."""
    if issubclass(ctype, ctypes.Array):
        return f"{type_name(ctype._type_)}[{ctype._length_}]"
    if issubclass(ctype, ctypes.Structure):
        fields = ", ".join(
            f"{type_name(t)} {n}" for n, t, *_ in ctype._fields_ if not n.startswith("__pad")
        )
        return f"struct {{{fields}}}"
    size = ctypes.sizeof(ctype)
    signed = ctype in (
        ctypes.c_byte,
        ctypes.c_short,
        ctypes.c_int,
        ctypes.c_long,
        ctypes.c_longlong,
    )
    return f"{'s' if signed else 'u'}{size * 8}"


def _fields(ctype: Any) -> list[tuple[str, Any]]:
    return [(f[0], f[1]) for f in ctype._fields_ if not f[0].startswith("__pad")]


def _is_lpm_key(ctype: Any) -> bool:
    fields = _fields(ctype)
    return (
        len(fields) == 2
        and ctypes.sizeof(fields[0][1]) == 4
        and issubclass(fields[0][1], _INTEGERS)
        and issubclass(fields[1][1], ctypes.Array)
        and ctypes.sizeof(fields[1][1]) in (4, 16)
    )


def _address(text: str, size: int) -> bytes | None:
    try:
        address = ipaddress.IPv4Address(text) if size == 4 else ipaddress.IPv6Address(text)
    except ValueError:
        return None
    return None if "%" in text else address.packed


def _integer(ctype: Any, text: str, ifindex_of: IfindexOf) -> bytes:
    size = ctypes.sizeof(ctype)
    text = text.strip()
    value: int | None = None
    try:
        value = int(text, 0)
    except ValueError:
        pass
    if value is None and size == 4 and (raw := _address(text, 4)) is not None:
        return raw  # network byte order, as in the packet
    if value is None:
        value = ifindex_of(text)
    if value is None:
        raise ValueError(
            f"{excerpt(text)} is not a number, an interface name"
            + (" or an IPv4 address" if size == 4 else "")
        )
    signed = type_name(ctype).startswith("s")
    low, high = (
        (-(1 << (size * 8 - 1)), (1 << (size * 8 - 1)) - 1)
        if signed
        else (0, (1 << (size * 8)) - 1)
    )
    if not low <= value <= high:
        raise ValueError(f"{value} does not fit in {type_name(ctype)}")
    return value.to_bytes(size, "little", signed=signed)


def encode(ctype: Any, text: str, ifindex_of: IfindexOf) -> bytes:
    """The bytes of a value of ``ctype`` written as ``text``; ValueError if it does not fit."""
    if issubclass(ctype, ctypes.Structure):
        if _is_lpm_key(ctype) and "/" in text:
            prefix = parse_prefix(text)
            size = ctypes.sizeof(_fields(ctype)[1][1])
            if (prefix.family == 4) != (size == 4):
                raise ValueError(f"{excerpt(text)} is not an IPv{4 if size == 4 else 6} CIDR")
            out = bytearray(ctypes.sizeof(ctype))
            out[0:4] = prefix.length.to_bytes(4, "little")
            offset = getattr(ctype, _fields(ctype)[1][0]).offset
            out[offset : offset + size] = prefix.value.to_bytes(size, "big")
            return bytes(out)
        fields = _fields(ctype)
        parts = text.split(",")
        if len(parts) != len(fields):
            raise ValueError(
                f"{excerpt(text)} has {len(parts)} comma-separated fields, "
                f"{type_name(ctype)} has {len(fields)}"
            )
        out = bytearray(ctypes.sizeof(ctype))
        for (name, ftype), part in zip(fields, parts, strict=True):
            offset = getattr(ctype, name).offset
            try:
                raw = encode(ftype, part, ifindex_of)
            except ValueError as err:
                raise ValueError(f"field {name}: {err}") from None
            out[offset : offset + len(raw)] = raw
        return bytes(out)
    if issubclass(ctype, ctypes.Array):
        size = ctypes.sizeof(ctype)
        if size in (4, 16) and ctypes.sizeof(ctype._type_) == 1:
            address = _address(text.strip(), size)
            if address is None:
                raise ValueError(f"{excerpt(text)} is not an IPv{4 if size == 4 else 6} address")
            return address
        raise ValueError(f"cannot write {type_name(ctype)} from text")
    if issubclass(ctype, _INTEGERS):
        return _integer(ctype, text, ifindex_of)
    raise ValueError(f"cannot write {type_name(ctype)} from text")
