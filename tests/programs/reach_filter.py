"""The application's side of test_daemon_privileges: run behind alfwrapper (as root,
with the capabilities its unit gives), try every way to its own filter and maps,
print what each attempt got as one JSON line, then become the echo service.

    reach_filter.py SERVICE BYSTANDER_PID ECHO_SERVER

BYSTANDER_PID "self" looks at the BPF file system as mounted where it runs.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import struct
import sys

SYS_BPF = 321  # x86-64
BPF_OBJ_GET, BPF_PROG_GET_NEXT_ID, BPF_MAP_GET_FD_BY_ID = 7, 11, 14
SO_DETACH_FILTER, SO_COOKIE = 27, 57
PINS = ("dispatch", "slot", "meta", "counters", "runtime", "runtime_count")
libc = ctypes.CDLL(None, use_errno=True)


def bpf(cmd: int, attr: bytes) -> int:
    """bpf(2) itself, as an application would call it: the fd, or -errno."""
    buf = ctypes.create_string_buffer(attr, 128)
    result = libc.syscall(SYS_BPF, cmd, buf, 128)
    return result if result >= 0 else -ctypes.get_errno()


def obj_get(path: str) -> int:
    name = ctypes.create_string_buffer(path.encode())
    return bpf(BPF_OBJ_GET, struct.pack("=QII", ctypes.addressof(name), 0, 0))


def try_open(path: str) -> str:
    try:
        with open(path, "rb") as pin:
            return "read " + repr(pin.read(64))
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, str(err))


def tamper(folder: str) -> dict[str, str]:
    """What file-system changes to the pins get: each must fail."""
    attempts = {
        "rename": lambda: os.rename(f"{folder}/slot", f"{folder}/slot.moved"),
        "unlink": lambda: os.unlink(f"{folder}/counters"),
        "link": lambda: os.link(f"{folder}/runtime", f"{folder}/runtime.linked"),
        "symlink": lambda: os.symlink("/etc/passwd", f"{folder}/planted"),
        "mkdir": lambda: os.mkdir(f"{folder}/planted.d"),
    }
    results = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            results[name] = "done"
        except OSError as err:
            results[name] = errno.errorcode.get(err.errno or 0, str(err))
    return results


def view(folder: str) -> str:
    """What listing a folder gets: "listed", or the errno's name."""
    try:
        os.listdir(folder)
        return "listed"
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, str(err))


def status(field: str) -> str:
    with open("/proc/self/status", encoding="ascii") as lines:
        return next(line.split()[1] for line in lines if line.startswith(f"{field}:"))


def main() -> None:
    service, bystander, echo = sys.argv[1], sys.argv[2], sys.argv[3]
    listener = socket.socket(fileno=3)
    cookie = struct.unpack("=Q", listener.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]
    tail = f"sys/fs/bpf/alfwrapper/{service}/sock-{cookie}"
    through_host = f"/{tail}" if bystander == "self" else f"/proc/{bystander}/root/{tail}"
    try:
        listener.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        detach = "detached"
    except OSError as err:
        detach = errno.errorcode[err.errno or 0]
    bpf_fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:bpf"):
                bpf_fds.append(fd)
        except OSError:
            pass
    report = {
        "caps": {f: status(f) for f in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh")},
        "no_new_privs": status("NoNewPrivs"),
        "seccomp": status("Seccomp"),
        "uid": os.getuid(),
        "own_view": os.path.exists(f"/{tail}"),
        "host_view": view(through_host),
        "open": {pin: try_open(f"{through_host}/{pin}") for pin in PINS},
        "obj_get": {pin: obj_get(f"{through_host}/{pin}") for pin in PINS},
        "tamper": tamper(through_host),
        "next_prog_id": bpf(BPF_PROG_GET_NEXT_ID, bytes(8)),
        "map_by_id": bpf(BPF_MAP_GET_FD_BY_ID, struct.pack("=I", 1)),
        "detach": detach,
        "bpf_fds": bpf_fds,
    }
    listener.detach()
    print(json.dumps(report), flush=True)
    os.execv(sys.executable, [sys.executable, echo])


if __name__ == "__main__":
    main()
