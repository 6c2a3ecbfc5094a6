"""Raw system calls Python lacks: bpf(2) test runs, capset(2), prctl(2).  The only module
with ctypes.

BPF_PROG_TEST_RUN (Linux 4.12; socket filters take an Ethernet frame and see
the network header after it) runs a loaded program on a packet we make up:
the tests check the kernel's verdicts with it, and the benchmarks time it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from dataclasses import dataclass

BPF_PROG_TEST_RUN = 10
_SYS_BPF = {"x86_64": 321, "aarch64": 280}


class _TestRunAttr(ctypes.Structure):
    # union bpf_attr, the BPF_PROG_TEST_RUN member (include/uapi/linux/bpf.h)
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@dataclass(frozen=True)
class TestRun:
    retval: int  # what the program returned (0 = drop for a socket filter)
    duration_ns: int  # the kernel's mean time per run


def prog_test_run(prog_fd: int, frame: bytes, repeat: int = 1) -> TestRun:
    """Run the program on an Ethernet frame ``repeat`` times in the kernel."""
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise OSError(0, f"bpf(2) syscall number unknown for {platform.machine()}")
    data = ctypes.create_string_buffer(frame, len(frame))
    attr = _TestRunAttr(
        prog_fd=prog_fd, data_size_in=len(frame), data_in=ctypes.addressof(data), repeat=repeat
    )
    if _libc.syscall(number, BPF_PROG_TEST_RUN, ctypes.byref(attr), ctypes.sizeof(attr)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN: {os.strerror(err)}", f"prog fd {prog_fd}")
    return TestRun(retval=attr.retval, duration_ns=attr.duration)


def _checksum(header: bytes) -> int:
    total = sum(int.from_bytes(header[i : i + 2], "big") for i in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ip_frame(family: int, source: int, destination: int, protocol: int, l4: bytes) -> bytes:
    """An Ethernet frame carrying ``l4`` over IPv4 or IPv6 between integer addresses."""
    if family == 4:
        header = bytearray(
            b"\x45\0"
            + (20 + len(l4)).to_bytes(2, "big")
            + b"\0\0\0\0\x40"
            + bytes([protocol])
            + b"\0\0"
            + source.to_bytes(4, "big")
            + destination.to_bytes(4, "big")
        )
        header[10:12] = _checksum(bytes(header)).to_bytes(2, "big")
        ethertype, l3 = b"\x08\x00", bytes(header)
    else:
        l3 = (
            b"\x60\0\0\0"
            + len(l4).to_bytes(2, "big")
            + bytes([protocol, 64])
            + source.to_bytes(16, "big")
            + destination.to_bytes(16, "big")
        )
        ethertype = b"\x86\xdd"
    return b"\x02\0\0\0\0\x01" + b"\x02\0\0\0\0\x02" + ethertype + l3 + l4


def udp_frame(
    family: int,
    source: int,
    payload: bytes = b"x",
    sport: int = 40000,
    destination: int | None = None,
    dport: int = 53,
) -> bytes:
    """An Ethernet frame carrying UDP from ``source`` (an integer address)."""
    if destination is None:
        destination = 0xC0000201 if family == 4 else (0x20010DB8 << 96) | 1
    udp = (
        sport.to_bytes(2, "big")
        + dport.to_bytes(2, "big")
        + (8 + len(payload)).to_bytes(2, "big")
        + b"\0\0"
        + payload
    )
    return ip_frame(family, source, destination, 17, udp)


def tcp_syn_frame(family: int, source: int, sport: int, destination: int, dport: int) -> bytes:
    """An Ethernet frame carrying a TCP SYN: what a new connection's first packet looks like."""
    tcp = (
        sport.to_bytes(2, "big")
        + dport.to_bytes(2, "big")
        + bytes(8)
        + b"\x50\x02\xff\xff"
        + bytes(4)
    )
    return ip_frame(family, source, destination, 6, tcp)


# -- capabilities (capset(2), prctl(2)) ---------------------------------------

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_CAPBSET_DROP = 24


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    _check(
        _libc.prctl(
            option, ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0)
        ),
        f"prctl({option})",
    )


def capset(effective: int, permitted: int, inheritable: int) -> None:
    """Set this thread's capability sets (bit masks over all 64 capabilities)."""
    number = _SYS_CAPSET.get(platform.machine())
    if number is None:
        raise OSError(0, f"capset(2) syscall number unknown for {platform.machine()}")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = effective >> (32 * i) & 0xFFFFFFFF
        data[i].permitted = permitted >> (32 * i) & 0xFFFFFFFF
        data[i].inheritable = inheritable >> (32 * i) & 0xFFFFFFFF
    _check(_libc.syscall(number, ctypes.byref(header), ctypes.byref(data)), "capset")
