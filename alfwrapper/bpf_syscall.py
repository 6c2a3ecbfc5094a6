"""Raw bpf(2) calls that BCC's Python bindings lack.  The only module with ctypes.

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


def udp_frame(family: int, source: int, payload: bytes = b"x") -> bytes:
    """An Ethernet frame carrying UDP from ``source`` (an integer address)."""
    udp = (
        (40000).to_bytes(2, "big")
        + (53).to_bytes(2, "big")
        + (8 + len(payload)).to_bytes(2, "big")
        + b"\0\0"
        + payload
    )
    if family == 4:
        header = bytearray(
            b"\x45\0"
            + (20 + len(udp)).to_bytes(2, "big")
            + b"\0\0\0\0\x40\x11\0\0"
            + source.to_bytes(4, "big")
            + bytes([192, 0, 2, 1])
        )
        header[10:12] = _checksum(bytes(header)).to_bytes(2, "big")
        ethertype, l3 = b"\x08\x00", bytes(header)
    else:
        l3 = (
            b"\x60\0\0\0"
            + len(udp).to_bytes(2, "big")
            + b"\x11\x40"
            + source.to_bytes(16, "big")
            + bytes.fromhex("20010db8000000000000000000000001")
        )
        ethertype = b"\x86\xdd"
    return b"\x02\0\0\0\0\x01" + b"\x02\0\0\0\0\x02" + ethertype + l3 + udp
