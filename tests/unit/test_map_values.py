"""--set text into map keys and values, by ctypes types shaped like BCC's."""

from __future__ import annotations

import ctypes

import pytest

from alfwrapper.bpf.map_values import encode, type_name

pytestmark = pytest.mark.unit


def no_links(name: str) -> int | None:
    return {"lo": 1, "wg0": 7}.get(name)


class Addr6(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


class PortLimit(ctypes.Structure):
    _fields_ = [
        ("port", ctypes.c_ushort),
        ("open", ctypes.c_ubyte),
        ("__pad_0", ctypes.c_ubyte * 1),
    ]


class LpmKey4(ctypes.Structure):
    _fields_ = [("prefixlen", ctypes.c_uint), ("data", ctypes.c_ubyte * 4)]


@pytest.mark.parametrize(
    ("ctype", "text", "expected"),
    [
        (ctypes.c_uint, "7", (7).to_bytes(4, "little")),
        (ctypes.c_uint, "0x10", (16).to_bytes(4, "little")),
        (ctypes.c_uint, "192.0.2.2", bytes([192, 0, 2, 2])),  # network order, as in the packet
        (ctypes.c_uint, "wg0", (7).to_bytes(4, "little")),
        (ctypes.c_int, "-1", b"\xff\xff\xff\xff"),
        (ctypes.c_ushort, "443", (443).to_bytes(2, "little")),
        (ctypes.c_ubyte, "1", b"\x01"),
        (ctypes.c_ubyte * 4, "192.0.2.1", bytes([192, 0, 2, 1])),
        (Addr6, "2001:db8::1", bytes.fromhex("20010db8000000000000000000000001")),
        (PortLimit, "8080,1", (8080).to_bytes(2, "little") + b"\x01\x00"),
        (LpmKey4, "192.0.2.0/24", (24).to_bytes(4, "little") + bytes([192, 0, 2, 0])),
    ],
)
def test_encode(ctype: type, text: str, expected: bytes) -> None:
    assert encode(ctype, text, no_links) == expected


@pytest.mark.parametrize(
    ("ctype", "text", "message"),
    [
        (ctypes.c_ubyte, "256", "does not fit in u8"),
        (ctypes.c_ushort, "-1", "does not fit in u16"),
        (ctypes.c_uint, "eth9", "not a number, an interface name or an IPv4"),
        (ctypes.c_ushort, "192.0.2.1", "not a number, an interface name"),
        (ctypes.c_ubyte * 4, "2001:db8::1", "not an IPv4 address"),
        (Addr6, "192.0.2.1", "not an IPv6 address"),
        (PortLimit, "8080", "has 1 comma-separated fields"),
        (PortLimit, "8080,x", "field open"),
        (LpmKey4, "2001:db8::/32", "not an IPv4 CIDR"),
        (ctypes.c_ubyte * 3, "1", r"cannot write u8\[3\]"),
    ],
)
def test_encode_rejects(ctype: type, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode(ctype, text, no_links)


def test_type_names() -> None:
    assert type_name(PortLimit) == "struct {u16 port, u8 open}"
    assert type_name(ctypes.c_int) == "s32"
    assert type_name(LpmKey4) == "struct {u32 prefixlen, u8[4] data}"
