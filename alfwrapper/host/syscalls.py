"""What Python lacks for the kernel: libbpf's test runs and map calls, capset(2), prctl(2),
Landlock.

The only module that calls C libraries through ctypes (BCC's tables take
ctypes values elsewhere, as its Python API asks).  BPF goes through libbpf (libbpf.so.1, Debian's
libbpf1), never a hand-made bpf(2) call: bpf_prog_test_run_opts and the map
element calls, which the wrapper needs without BCC (the interface watcher
is a small process that never loads BCC).  capset(2) and prctl(2) go through
glibc's own wrappers.  The one place with syscall numbers written by hand is
Landlock's three calls: glibc 2.36 has no wrappers for them and Debian 12 has
no library that does.

BPF_PROG_TEST_RUN (Linux 4.12; socket filters take an Ethernet frame and see
the network header after it) runs a loaded program on a packet we make up:
the backlog check judges queued connections with it, the tests check the
kernel's verdicts with it, and the benchmarks time it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import inspect
import mmap
import os
import select
import stat
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libbpf: ctypes.CDLL | None = None


def libbpf() -> ctypes.CDLL:
    """libbpf.so.1, loaded on first use; OSError when it is missing."""
    global _libbpf
    if _libbpf is None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            raise OSError(0, "libbpf.so.1 is missing (apt-get install libbpf1)") from None
        lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.c_void_p]
        for name_ in ("bpf_map_update_elem", "bpf_map_lookup_elem"):
            getattr(lib, name_).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + (
                [ctypes.c_uint64] if name_ == "bpf_map_update_elem" else []
            )
        lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
        lib.bpf_map_get_next_key.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.bpf_obj_pin.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
        lib.bpf_map_create.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_uint32,
            ctypes.c_uint32,
            ctypes.c_uint32,
            ctypes.c_void_p,
        ]
        lib.bpf_prog_load.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
        ]
        _libbpf = lib
    return _libbpf


# -- calls on fds one holds, and who makes them when the kernel says EPERM --------------

FdProxy = Callable[[str, list[int], dict[str, Any]], Any]
_fd_proxy: FdProxy | None = None
# name -> (the call itself, the names of its fd parameters): what a proxy may make
FD_CALLS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {}
_F = TypeVar("_F", bound=Callable[..., Any])


def use_fd_proxy(proxy: FdProxy | None) -> None:
    """From now on, a call on fds that the kernel refuses with EPERM goes to
    ``proxy(name, fds, other_arguments)``, whose answer is the call's."""
    global _fd_proxy
    _fd_proxy = proxy


def _fd_call(*fd_params: str) -> Callable[[_F], _F]:
    """A call that needs nothing but the fds named: made here, else by the proxy."""

    def wrap(fn: _F) -> _F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except PermissionError:
                if _fd_proxy is None:
                    raise
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            fds = [bound.arguments[p] for p in fd_params]
            rest = {k: v for k, v in bound.arguments.items() if k not in fd_params}
            return _fd_proxy(fn.__name__, fds, rest)

        FD_CALLS[fn.__name__] = (fn, fd_params)
        return call  # type: ignore[return-value]

    return wrap


def _bpf_check(result: int, what: str, obj: str = "") -> None:
    # libbpf returns -errno (and sets errno) on failure.
    if result < 0:
        err = ctypes.get_errno() or -result
        raise OSError(err, f"{what}: {os.strerror(err)}", obj or None)


class _TestRunOpts(ctypes.Structure):
    # struct bpf_test_run_opts, libbpf's bpf.h (1.0 and later)
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


# struct __sk_buff up to ingress_ifindex (uapi/linux/bpf.h): the context fields a
# test run may set.  Only mark, priority, ingress_ifindex, cb and tstamp may be
# non-zero; ingress_ifindex is the 10th u32.
_SKB_INGRESS_IFINDEX = 9
_SKB_CTX_WORDS = 10


@dataclass(frozen=True)
class TestRun:
    retval: int  # what the program returned (0 = drop for a socket filter)
    duration_ns: int  # the kernel's mean time per run


def fd_calls_refused() -> bool:
    """Does the kernel refuse this process every bpf(2) call, even on an fd it holds
    (before Linux 6.5, without CAP_BPF, while unprivileged BPF is disabled)?  Asked
    with a lookup on no fd: EPERM comes before EBADF only then."""
    key = ctypes.create_string_buffer(4)
    result = libbpf().bpf_map_lookup_elem(-1, key, key)
    return result < 0 and (ctypes.get_errno() or -result) == 1  # EPERM


@_fd_call("prog_fd")
def prog_test_run(prog_fd: int, frame: bytes, repeat: int = 1, ingress_ifindex: int = 0) -> TestRun:
    """Run the program on an Ethernet frame ``repeat`` times in the kernel.

    ``ingress_ifindex`` is the interface the packet is taken to have arrived on.
    """
    data = ctypes.create_string_buffer(frame, len(frame))
    ctx = (ctypes.c_uint32 * _SKB_CTX_WORDS)()
    ctx[_SKB_INGRESS_IFINDEX] = ingress_ifindex
    opts = _TestRunOpts(
        sz=ctypes.sizeof(_TestRunOpts),
        data_in=ctypes.addressof(data),
        data_size_in=len(frame),
        ctx_in=ctypes.addressof(ctx),
        ctx_size_in=ctypes.sizeof(ctx),
        repeat=repeat,
    )
    _bpf_check(
        libbpf().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)),
        "BPF_PROG_TEST_RUN",
        f"prog fd {prog_fd}",
    )
    return TestRun(retval=opts.retval, duration_ns=opts.duration)


@dataclass(frozen=True)
class ProgInfo:
    id: int
    instructions: int  # as verified (xlated), 8 bytes each
    jited_bytes: int


# struct bpf_map_info and bpf_prog_info up to the last field read here
INFO_SIZE = 96


@_fd_call("fd")
def _info(fd: int, what: str) -> bytes:
    info = ctypes.create_string_buffer(256)  # larger than the kernel's struct: zeros are fine
    size = ctypes.c_uint32(len(info))
    _bpf_check(
        libbpf().bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)),
        "BPF_OBJ_GET_INFO_BY_FD",
        f"{what} fd {fd}",
    )
    return info.raw[:INFO_SIZE]


def prog_info(prog_fd: int) -> ProgInfo:
    """BPF_OBJ_GET_INFO_BY_FD of a program: struct bpf_prog_info up to xlated_prog_len."""
    raw = _info(prog_fd, "prog")
    prog_id = int.from_bytes(raw[4:8], "little")
    jited, xlated = (int.from_bytes(raw[i : i + 4], "little") for i in (16, 20))
    return ProgInfo(prog_id, xlated // 8, jited)


@_fd_call("prog_fd")
def prog_map_ids(prog_fd: int) -> list[int]:
    """The ids of the maps a program uses (struct bpf_prog_info's map_ids)."""
    ids = (ctypes.c_uint32 * 64)()
    info = ctypes.create_string_buffer(256)
    struct.pack_into("=IQ", info, 52, 64, ctypes.addressof(ids))  # nr_map_ids, map_ids
    size = ctypes.c_uint32(len(info))
    _bpf_check(
        libbpf().bpf_obj_get_info_by_fd(prog_fd, info, ctypes.byref(size)),
        "BPF_OBJ_GET_INFO_BY_FD",
        f"prog fd {prog_fd}",
    )
    count = struct.unpack_from("=I", info, 52)[0]
    return list(ids[: min(count, 64)])


def map_info_id(fd: int) -> int:
    """The kernel's id of a map (struct bpf_map_info's second word)."""
    return int.from_bytes(_info(fd, "map")[4:8], "little")


def prog_type(fd: int) -> int:
    """A program's type (struct bpf_prog_info's first word: 1 is a socket filter)."""
    return int.from_bytes(_info(fd, "prog")[0:4], "little")


def map_shape(map_fd: int) -> tuple[int, int, int, int, int]:
    """A map's type, key size, value size, max entries and flags (struct bpf_map_info)."""
    kind, _, key, value, entries, flags = struct.unpack_from("=6I", _info(map_fd, "map"))
    return kind, key, value, entries, flags


def fd_memlock(fd: int) -> int:
    """The kernel memory a map or program holds (its fdinfo's memlock), in bytes.
    Read as bytes: no codec to import (the loader reads it under Landlock, where
    Python's lazily imported modules are out of reach).  OSError if unreadable."""
    with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
        for line in info:
            if line.startswith(b"memlock:"):
                return int(line.split()[1])
    raise OSError(errno.ENODATA, f"fd {fd} has no memlock in its fdinfo")


# enum bpf_map_type (uapi/linux/bpf.h): the types alfwrapper's filters use.
BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PROG_ARRAY = 3
BPF_MAP_TYPE_PERCPU_ARRAY = 6
BPF_MAP_TYPE_LRU_HASH = 9
BPF_MAP_TYPE_LPM_TRIE = 11
BPF_MAP_TYPE_RINGBUF = 27
BPF_PROG_TYPE_SOCKET_FILTER = 1
_BPF_FUNC_TAIL_CALL = 12


def obj_pin(fd: int, path: str) -> None:
    _bpf_check(libbpf().bpf_obj_pin(fd, path.encode()), "BPF_OBJ_PIN", path)


def obj_get(path: str) -> int:
    """An fd of a pinned map or program (needs read and write permission on the pin)."""
    fd = libbpf().bpf_obj_get(path.encode())
    _bpf_check(fd, "BPF_OBJ_GET", path)
    return int(fd)


def map_create(kind: int, name: str, key_size: int, value_size: int, entries: int) -> int:
    fd = libbpf().bpf_map_create(kind, name.encode()[:15], key_size, value_size, entries, None)
    _bpf_check(fd, "BPF_MAP_CREATE", name)
    return int(fd)


class _MapCreateOpts(ctypes.Structure):
    # struct bpf_map_create_opts, libbpf's bpf.h (1.0 and later)
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("btf_fd", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("map_extra", ctypes.c_uint64),
        ("numa_node", ctypes.c_uint32),
        ("map_ifindex", ctypes.c_uint32),
    ]


def _btf_fds() -> dict[int, int]:
    """This process's open BTF objects (BCC keeps its program's open), by id."""
    found = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{entry}") == "anon_inode:btf":
                # struct bpf_btf_info: u64 btf, u32 btf_size, u32 id
                found[int.from_bytes(_info(int(entry), "btf")[12:16], "little")] = int(entry)
        except OSError:
            continue
    return found


def map_renamed(map_fd: int, name: str, keep_btf: bool = True) -> int:
    """A new, empty map like this one (type, sizes, flags, BTF types) but named ``name``.

    A map's name is fixed when it is made; BCC names each after its C
    declaration.  The copy keeps the BTF description when asked to and the BTF
    object is open in this process (then `bpftool map dump` prints the structs)."""
    # struct bpf_map_info: type, id, key_size, value_size, max_entries, map_flags,
    # name[16], ifindex, btf_vmlinux_value_type_id, netns_dev, netns_ino, btf_id,
    # btf_key_type_id, btf_value_type_id, btf_vmlinux_id, map_extra
    raw = _info(map_fd, "map")
    kind, _, key, value, entries, flags = struct.unpack_from("=6I", raw)
    btf_id, btf_key, btf_value = struct.unpack_from("=3I", raw, 64)
    (extra,) = struct.unpack_from("=Q", raw, 80)
    opts = _MapCreateOpts(sz=ctypes.sizeof(_MapCreateOpts), map_flags=flags, map_extra=extra)
    btf = _btf_fds().get(btf_id) if btf_id and keep_btf else None
    if btf is not None:
        opts.btf_fd, opts.btf_key_type_id, opts.btf_value_type_id = btf, btf_key, btf_value
    fd = libbpf().bpf_map_create(kind, name.encode()[:15], key, value, entries, ctypes.byref(opts))
    _bpf_check(fd, "BPF_MAP_CREATE", name)
    return int(fd)


@_fd_call("map_fd")
def map_lookup(map_fd: int, key: bytes, value_size: int) -> bytes | None:
    value = ctypes.create_string_buffer(value_size)
    result = libbpf().bpf_map_lookup_elem(map_fd, key, value)
    if result < 0 and (ctypes.get_errno() or -result) == 2:  # ENOENT
        return None
    _bpf_check(result, "map lookup", f"map fd {map_fd}")
    return value.raw


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def load_dispatcher(slot_fd: int, name: str) -> int:
    """The socket's fixed filter: tail-call slot[0]; if the slot is empty, drop.

    Six instructions, assembled here rather than compiled: it never changes,
    and loading it needs no compiler.
    """
    code = b"".join(
        (
            _insn(0x18, dst=2, src=1, imm=slot_fd),  # r2 = the slot map (BPF_PSEUDO_MAP_FD)
            _insn(0),
            _insn(0xB7, dst=3, imm=0),  # r3 = 0, the index; r1 is still the packet
            _insn(0x85, imm=_BPF_FUNC_TAIL_CALL),  # on success this never returns
            _insn(0xB7, dst=0, imm=0),  # r0 = 0: drop
            _insn(0x95),  # exit
        )
    )
    buffer = ctypes.create_string_buffer(code, len(code))
    fd = libbpf().bpf_prog_load(
        BPF_PROG_TYPE_SOCKET_FILTER, name.encode()[:15], b"GPL", buffer, len(code) // 8, None
    )
    _bpf_check(fd, "loading the dispatcher", name)
    return int(fd)


_NR_BPF = 321  # x86-64
_BPF_PROG_LOAD = 5


def prog_load_logged(insns: bytes, name: str, log_size: int = 1 << 20) -> tuple[int, str]:
    """Load socket-filter instructions as they are (map fds already in them), with the
    verifier's log: (fd, "") or (-errno, the log).  bpf(2) itself, with the attribute
    laid out here: libbpf's bpf_prog_load_opts changes shape between its versions."""
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(log_size)
    attr = ctypes.create_string_buffer(
        struct.pack(
            "<IIQQIIQII16s",
            BPF_PROG_TYPE_SOCKET_FILTER, len(insns) // 8, ctypes.addressof(code),
            ctypes.addressof(license_), 1, log_size, ctypes.addressof(log), 0, 0,
            name.encode()[:15],
        ).ljust(128, b"\0")
    )  # fmt: skip
    fd = _libc.syscall(
        ctypes.c_long(_NR_BPF), ctypes.c_long(_BPF_PROG_LOAD), attr, ctypes.c_long(128)
    )
    if fd < 0:
        return -ctypes.get_errno(), log.value.decode(errors="replace")
    return int(fd), ""


_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class RingReader:
    """Reads BPF ring buffers (Linux 5.8) through libbpf's ring_buffer API, or through
    their mmap(2) where libbpf cannot (see the module's text).

    ``on_record(index, data)`` gets each record with the index of its buffer in
    ``map_fds``.  Reading a record consumes it, for every reader of that buffer.
    """

    def __init__(self, map_fds: list[int], on_record: Callable[[int, bytes], None]) -> None:
        lib = libbpf()
        lib.ring_buffer__new.restype = ctypes.c_void_p
        lib.ring_buffer__new.argtypes = [ctypes.c_int, _SAMPLE_FN, ctypes.c_void_p, ctypes.c_void_p]
        lib.ring_buffer__add.argtypes = [ctypes.c_void_p, ctypes.c_int, _SAMPLE_FN, ctypes.c_void_p]
        lib.ring_buffer__poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.ring_buffer__consume.argtypes = [ctypes.c_void_p]
        lib.ring_buffer__epoll_fd.argtypes = [ctypes.c_void_p]
        lib.ring_buffer__free.argtypes = [ctypes.c_void_p]

        def sample(ctx: int | None, data: int, size: int) -> int:
            on_record(ctx or 0, ctypes.string_at(data, size))
            return 0

        self._callback = _SAMPLE_FN(sample)  # kept alive as long as the reader
        self._ring = None
        self._mapped: _MappedRings | None = None
        lib.libbpf_set_print.restype = ctypes.c_void_p
        lib.libbpf_set_print.argtypes = [ctypes.c_void_p]
        said = lib.libbpf_set_print(None)  # its warning when it cannot is ours to give
        try:
            for index, fd in enumerate(map_fds):
                if self._ring is None:
                    self._ring = lib.ring_buffer__new(fd, self._callback, index, None)
                    if not self._ring:
                        err = ctypes.get_errno()
                        raise OSError(err, f"ring_buffer__new: {os.strerror(err)}")
                else:
                    _bpf_check(lib.ring_buffer__add(self._ring, fd, self._callback, index),
                               "ring_buffer__add")  # fmt: skip
        except PermissionError:
            self.close()
            self._mapped = _MappedRings(map_fds, on_record)
        finally:
            lib.libbpf_set_print(said)

    def fileno(self) -> int:
        if self._mapped is not None:
            return self._mapped.epoll.fileno()
        return int(libbpf().ring_buffer__epoll_fd(self._ring))

    def consume(self) -> int:
        """Read every record there is now; returns how many."""
        if self._mapped is not None:
            return self._mapped.consume()
        count = libbpf().ring_buffer__consume(self._ring)
        _bpf_check(min(count, 0), "ring_buffer__consume")
        return int(count)

    def poll(self, timeout_ms: int) -> int:
        if self._mapped is not None:
            self._mapped.epoll.poll(timeout_ms / 1000 if timeout_ms >= 0 else None)
            return self._mapped.consume()
        count = libbpf().ring_buffer__poll(self._ring, timeout_ms)
        if count < 0 and (ctypes.get_errno() or -count) == 4:  # EINTR
            return 0
        _bpf_check(min(count, 0), "ring_buffer__poll")
        return int(count)

    def close(self) -> None:
        if self._ring:
            libbpf().ring_buffer__free(self._ring)
            self._ring = None
        if self._mapped is not None:
            self._mapped.close()
            self._mapped = None


# The kernel's ring buffer layout (kernel/bpf/ringbuf.c, uapi/linux/bpf.h): at offset
# 0 a page whose first u64 is the consumer's position (ours to write); at one page
# the producer's page (its position first), then the data area mapped twice, so a
# record that wraps reads in one piece.  Each record has an 8-byte header (u32
# length with the BUSY and DISCARD bits, u32 page offset) and is 8-byte aligned.
_RINGBUF_BUSY = 1 << 31
_RINGBUF_DISCARD = 1 << 30


def _fdinfo(fd: int, field: str) -> int:
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
        for line in info:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(0, f"no {field} in the fdinfo of fd {fd}")


class _MappedRings:
    """Ring buffers read through their mmap, with no bpf(2) call: the size comes from
    the fd's fdinfo, readiness from epoll on the map fds."""

    def __init__(self, map_fds: list[int], on_record: Callable[[int, bytes], None]) -> None:
        self.on_record = on_record
        self.rings: list[tuple[mmap.mmap, mmap.mmap, int]] = []
        self.epoll = select.epoll()
        page = mmap.PAGESIZE
        try:
            for fd in map_fds:
                size = _fdinfo(fd, "max_entries")
                consumer = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                producer = mmap.mmap(fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ,
                                     offset=page)  # fmt: skip
                self.rings.append((consumer, producer, size))
                self.epoll.register(fd, select.EPOLLIN)
        except BaseException:
            self.close()
            raise

    def consume(self) -> int:
        count = 0
        page = mmap.PAGESIZE
        for index, (consumer, producer, size) in enumerate(self.rings):
            (position,) = struct.unpack_from("=Q", consumer, 0)
            (end,) = struct.unpack_from("=Q", producer, 0)
            while position < end:
                start = page + (position & (size - 1))
                (header,) = struct.unpack_from("=I", producer, start)
                if header & _RINGBUF_BUSY:
                    break  # still being written
                length = header & ~(_RINGBUF_BUSY | _RINGBUF_DISCARD)
                if not header & _RINGBUF_DISCARD:
                    self.on_record(index, producer[start + 8 : start + 8 + length])
                    count += 1
                position += (length + 8 + 7) & ~7
                struct.pack_into("=Q", consumer, 0, position)
        return count

    def close(self) -> None:
        self.epoll.close()
        for consumer, producer, _ in self.rings:
            consumer.close()
            producer.close()
        self.rings = []


CLONE_NEWNET = 0x40000000


def setns(fd: int, kind: int) -> None:
    _check(_libc.setns(fd, kind), "setns")


@contextmanager
def netns(path: str) -> Iterator[None]:
    """Run the block in the network namespace at ``path`` (as /proc/PID/ns/net), then
    return to our own.  Needs CAP_SYS_ADMIN; OSError when it cannot enter."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(fd, CLONE_NEWNET)
        finally:
            os.close(fd)
        try:
            yield
        finally:
            setns(home, CLONE_NEWNET)
    finally:
        os.close(home)


def each_netns() -> Iterator[int]:
    """Enter every network namespace in use (by a process, or named in /run/netns) in
    turn, yielding in each; back in our own at the end.  Needs CAP_SYS_ADMIN."""
    seen: set[tuple[int, int]] = set()
    paths = [f"/proc/{p}/ns/net" for p in os.listdir("/proc") if p.isdigit()]
    if os.path.isdir("/run/netns"):
        paths += [os.path.join("/run/netns", n) for n in os.listdir("/run/netns")]
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    moved = False
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # gone, or not ours to see
            try:
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
                setns(fd, CLONE_NEWNET)
                moved = True
                yield fd
            finally:
                os.close(fd)
    finally:
        if moved:
            setns(home, CLONE_NEWNET)
        os.close(home)


@_fd_call("map_fd")
def map_update(map_fd: int, key: bytes, value: bytes) -> None:
    """Put key -> value in a map (BPF_ANY)."""
    _bpf_check(
        libbpf().bpf_map_update_elem(map_fd, key, value, 0), "map update", f"map fd {map_fd}"
    )


@_fd_call("map_fd")
def map_delete(map_fd: int, key: bytes) -> bool:
    """Remove key from a map; False if it was not there."""
    result = libbpf().bpf_map_delete_elem(map_fd, key)
    if result < 0 and (ctypes.get_errno() or -result) == 2:  # ENOENT
        return False
    _bpf_check(result, "map delete", f"map fd {map_fd}")
    return True


@_fd_call("map_fd")
def map_keys(map_fd: int, key_size: int) -> list[bytes]:
    """Every key of a hash map."""
    keys: list[bytes] = []
    previous: bytes | None = None
    current = ctypes.create_string_buffer(key_size)
    while True:
        result = libbpf().bpf_map_get_next_key(map_fd, previous, current)
        if result < 0:
            if (ctypes.get_errno() or -result) == 2:  # ENOENT: the last key
                return keys
            _bpf_check(result, "map iteration", f"map fd {map_fd}")
        previous = current.raw
        keys.append(previous)


@_fd_call("map_fd", "prog_fd")
def prog_array_set(map_fd: int, index: int, prog_fd: int) -> None:
    """Put a program in a program array's slot ``index``: one atomic update."""
    _bpf_check(
        libbpf().bpf_map_update_elem(
            map_fd, index.to_bytes(4, "little"), prog_fd.to_bytes(4, "little"), 0
        ),
        "program array update",
        f"map fd {map_fd}",
    )


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


# -- capabilities (glibc's capset(2) and prctl(2)) -----------------------------

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
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
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = effective >> (32 * i) & 0xFFFFFFFF
        data[i].permitted = permitted >> (32 * i) & 0xFFFFFFFF
        data[i].inheritable = inheritable >> (32 * i) & 0xFFFFFFFF
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


# -- a mount namespace (glibc's unshare(2), mount(2), umount2(2)) ----------------

CLONE_NEWNS = 0x00020000
MS_REC = 1 << 14
MS_SLAVE = 1 << 19
MNT_DETACH = 2


def unshare_mounts() -> None:
    """A mount namespace of this process's own that hears of the host's mounts and
    unmounts but tells the host of none of its own (MS_SLAVE, recursively)."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount(/, MS_SLAVE)")


def umount_detach(path: str) -> None:
    _check(_libc.umount2(os.fsencode(path), MNT_DETACH), f"umount2({path})")


# Landlock (Linux 5.13): no library in Debian's Python; its three syscalls and
# structs from uapi/linux/landlock.h.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_RULE_PATH_BENEATH = 1
_LANDLOCK_CREATE_RULESET_VERSION = 1
# What changes the file system, as of ABI 1: write a file, remove a file or a
# directory, make a character device, a directory, a regular file (a BPF pin
# is one), a socket, a FIFO, a block device or a symbolic link.
_LANDLOCK_WRITES_V1 = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (
    1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)  # fmt: skip
_LANDLOCK_READS_V1 = (1 << 0) | (1 << 2) | (1 << 3)  # run a file, read a file, list a folder
_LANDLOCK_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14)  # execute, write, read, truncate
_LANDLOCK_REFER = 1 << 13  # ABI 2: link or rename across folders
_LANDLOCK_TRUNCATE = 1 << 14  # ABI 3
_LANDLOCK_SCOPE_SIGNAL = 1 << 1  # ABI 6


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def statfs_type(path: str) -> int:
    """statfs(2)'s f_type (a file system's magic number), which os.statvfs lacks."""
    buf = ctypes.create_string_buffer(120)  # struct statfs; f_type is its first word
    if _libc.statfs(path.encode(), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int.from_bytes(buf.raw[:8], "little") & 0xFFFFFFFF


def flush_c_stdio() -> None:
    """fflush(NULL): C stdio's buffers (libbcc's std::cout goes through them)."""
    try:
        _libc.fflush(None)
    except AttributeError:
        pass


def malloc_trim() -> None:
    """Give freed heap back to the system (glibc's malloc_trim(3)); no library wraps it."""
    try:
        _libc.malloc_trim(0)
    except AttributeError:  # not glibc: nothing to give back this way
        pass


def unprivileged_bpf_disabled() -> int | None:
    """kernel.unprivileged_bpf_disabled (0: anyone may load; 1 or 2: CAP_BPF only);
    None when it cannot be read."""
    try:
        with open("/proc/sys/kernel/unprivileged_bpf_disabled", "rb") as f:  # noqa: PTH123
            return int(f.read().strip() or b"0")
    except (OSError, ValueError):
        return None


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers; 0 without Landlock (not built,
    not in the boot's lsm= list, or its syscalls filtered)."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def landlock_restrict(
    writable: list[str], readable: list[str] | None = None, scope_signals: bool = False
) -> None:
    """From now on this process (and what it starts) may change the file system only
    beneath ``writable``; with ``readable``, it may also read (and run) files only
    beneath those and ``writable``, else reading is untouched.  With
    ``scope_signals`` (ABI 6, Linux 6.12), it may signal only processes it started.
    OSError when Landlock is unavailable (or too old for what is asked)."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    _check(abi, "landlock_create_ruleset")
    if scope_signals and abi < 6:
        raise OSError(errno.ENOSYS, f"Landlock ABI {abi}: signal scoping needs 6 (Linux 6.12)")
    handled = _LANDLOCK_WRITES_V1
    if abi >= 2:
        handled |= _LANDLOCK_REFER
    if abi >= 3:
        handled |= _LANDLOCK_TRUNCATE
    reads = _LANDLOCK_READS_V1 if readable is not None else 0
    handled |= reads
    # struct landlock_ruleset_attr: handled_access_fs, handled_access_net (ABI 4), scoped (ABI 6)
    attr = (ctypes.c_uint64 * 3)(handled, 0, _LANDLOCK_SCOPE_SIGNAL if scope_signals else 0)
    size = 24 if scope_signals else 8
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    _check(ruleset, "landlock_create_ruleset")
    try:
        rules = [(p, handled) for p in writable] + [(p, reads) for p in readable or []]
        for path, wanted in rules:
            folder = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                # A file (not a folder) takes only the rights a file can have.
                a_file = not stat.S_ISDIR(os.fstat(folder).st_mode)
                rule = _PathBeneath(wanted & _LANDLOCK_FILE_RIGHTS if a_file else wanted, folder)
                _check(
                    _libc.syscall(
                        _SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH,
                        ctypes.byref(rule), 0,
                    ),
                    "landlock_add_rule",
                )  # fmt: skip
            finally:
                os.close(folder)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        _check(_libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
