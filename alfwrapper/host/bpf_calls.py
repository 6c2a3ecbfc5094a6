"""bpf(2) through libbpf: test runs, objects and their info, pins, maps and their elements,
and the calls a user's fds need made by the loader before Linux 6.5.

BPF goes through libbpf (libbpf.so.1, Debian's libbpf1): bpf_prog_test_run_opts
and the map element calls, which the wrapper needs without BCC (the interface
watcher is a small process that never loads BCC).  One call is bpf(2) itself,
by number: prog_load_logged, whose attribute libbpf's bpf_prog_load_opts lays
out differently between its versions.

BPF_PROG_TEST_RUN (Linux 4.12; socket filters take an Ethernet frame and see
the network header after it) runs a loaded program on a packet we make up:
the backlog check judges queued connections with it, the tests check the
kernel's verdicts with it, and the benchmarks time it.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
from collections.abc import Callable
from typing import Any, TypeVar

from alfwrapper.host.libc import LIBC
from alfwrapper.record import Record

_libbpf: ctypes.CDLL | None = None


def libbpf() -> ctypes.CDLL:
    """libbpf.so.1, loaded on first use; OSError when it is missing."""
    global _libbpf
    if _libbpf is None:
        try:  # the soname first: find_library runs ldconfig, tens of milliseconds
            lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        except OSError:
            from ctypes.util import find_library  # noqa: PLC0415  (imports subprocess)

            try:
                lib = ctypes.CDLL(find_library("bpf") or "libbpf.so", use_errno=True)
            except OSError:
                raise OSError(0, "libbpf.so.1 is missing (apt-get install libbpf1)") from None
        lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.c_void_p]
        for name_ in ("bpf_map_update_elem", "bpf_map_lookup_elem"):
            getattr(lib, name_).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + (
                [ctypes.c_uint64] if name_ == "bpf_map_update_elem" else []
            )
        lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
        lib.bpf_map_update_batch.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.bpf_map_get_next_key.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.bpf_obj_pin.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
        lib.bpf_obj_get_opts.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
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
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except PermissionError:
                if _fd_proxy is None:
                    raise
            import inspect  # noqa: PLC0415  (only for the proxy: 10 ms a start otherwise)

            bound = inspect.signature(fn).bind(*args, **kwargs)
            bound.apply_defaults()
            fds = [bound.arguments[p] for p in fd_params]
            rest = {k: v for k, v in bound.arguments.items() if k not in fd_params}
            return _fd_proxy(fn.__name__, fds, rest)

        FD_CALLS[fn.__name__] = (fn, fd_params)
        return call  # type: ignore[return-value]

    return wrap


def bpf_check(result: int, what: str, obj: str = "") -> None:
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


class TestRun(Record):
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
    return _test_run(prog_fd, frame, repeat, ingress_ifindex, xdp=False)


def xdp_test_run(prog_fd: int, frame: bytes, repeat: int = 1) -> TestRun:
    """Run an XDP program on an Ethernet frame in the kernel, with no context: it sees
    the frame arrive on this network namespace's loopback.  Root's (early drop's)."""
    return _test_run(prog_fd, frame, repeat, 0, xdp=True)


def _test_run(prog_fd: int, frame: bytes, repeat: int, ingress_ifindex: int, xdp: bool) -> TestRun:
    data = ctypes.create_string_buffer(frame, len(frame))
    ctx = (ctypes.c_uint32 * _SKB_CTX_WORDS)()
    ctx[_SKB_INGRESS_IFINDEX] = ingress_ifindex
    opts = _TestRunOpts(
        sz=ctypes.sizeof(_TestRunOpts),
        data_in=ctypes.addressof(data),
        data_size_in=len(frame),
        ctx_in=None if xdp else ctypes.addressof(ctx),
        ctx_size_in=0 if xdp else ctypes.sizeof(ctx),
        repeat=repeat,
    )
    bpf_check(
        libbpf().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)),
        "BPF_PROG_TEST_RUN",
        f"prog fd {prog_fd}",
    )
    return TestRun(retval=opts.retval, duration_ns=opts.duration)


class ProgInfo(Record):
    id: int
    instructions: int  # as verified (xlated), 8 bytes each
    jited_bytes: int
    name: str = ""


# struct bpf_map_info and bpf_prog_info up to the last field read here
INFO_SIZE = 96


@_fd_call("fd")
def _info(fd: int, what: str) -> bytes:
    info = ctypes.create_string_buffer(256)  # larger than the kernel's struct: zeros are fine
    size = ctypes.c_uint32(len(info))
    bpf_check(
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
    name = raw[64:80].split(b"\0", 1)[0].decode(errors="replace")  # char name[16]
    return ProgInfo(prog_id, xlated // 8, jited, name)


@_fd_call("prog_fd")
def prog_map_ids(prog_fd: int) -> list[int]:
    """The ids of the maps a program uses (struct bpf_prog_info's map_ids)."""
    ids = (ctypes.c_uint32 * 64)()
    info = ctypes.create_string_buffer(256)
    struct.pack_into("=IQ", info, 52, 64, ctypes.addressof(ids))  # nr_map_ids, map_ids
    size = ctypes.c_uint32(len(info))
    bpf_check(
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


BPF_MAP_TYPE_ARRAY_OF_MAPS = 12


BPF_MAP_TYPE_RINGBUF = 27


BPF_PROG_TYPE_SOCKET_FILTER = 1


_BPF_FUNC_TAIL_CALL = 12


def obj_pin(fd: int, path: str) -> None:
    bpf_check(libbpf().bpf_obj_pin(fd, path.encode()), "BPF_OBJ_PIN", path)


BPF_F_RDONLY = 1 << 3  # an fd that reads a map, and cannot change it


class _ObjGetOpts(ctypes.Structure):
    # struct bpf_obj_get_opts, libbpf's bpf.h (1.0 and later)
    _fields_ = [("sz", ctypes.c_size_t), ("file_flags", ctypes.c_uint32)]


def obj_get(path: str, read_only: bool = False) -> int:
    """An fd of a pinned map or program: one that reads and writes, which needs read
    and write permission on the pin, or, ``read_only``, one that only reads (read
    permission), through which the map cannot be changed."""
    if read_only:
        opts = _ObjGetOpts(ctypes.sizeof(_ObjGetOpts), BPF_F_RDONLY)
        fd = libbpf().bpf_obj_get_opts(path.encode(), ctypes.byref(opts))
    else:
        fd = libbpf().bpf_obj_get(path.encode())
    bpf_check(fd, "BPF_OBJ_GET", path)
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


def map_create(
    kind: int,
    name: str,
    key_size: int,
    value_size: int,
    entries: int,
    flags: int = 0,
    inner_fd: int = 0,
) -> int:
    """A new map; an array of maps needs ``inner_fd``, a map of its maps' shape."""
    opts = _MapCreateOpts(sz=ctypes.sizeof(_MapCreateOpts), map_flags=flags, inner_map_fd=inner_fd)
    fd = libbpf().bpf_map_create(
        kind, name.encode()[:15], key_size, value_size, entries, ctypes.byref(opts)
    )
    bpf_check(fd, "BPF_MAP_CREATE", name)
    return int(fd)


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


def map_renamed(map_fd: int, name: str, keep_btf: bool = True, inner_fd: int = 0) -> int:
    """A new, empty map like this one (type, sizes, flags, BTF types) but named ``name``;
    an array of maps needs ``inner_fd``, a map of the shape its maps have.

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
    opts = _MapCreateOpts(
        sz=ctypes.sizeof(_MapCreateOpts), map_flags=flags, map_extra=extra, inner_map_fd=inner_fd
    )
    btf = _btf_fds().get(btf_id) if btf_id and keep_btf else None
    if btf is not None:
        opts.btf_fd, opts.btf_key_type_id, opts.btf_value_type_id = btf, btf_key, btf_value
    fd = libbpf().bpf_map_create(kind, name.encode()[:15], key, value, entries, ctypes.byref(opts))
    bpf_check(fd, "BPF_MAP_CREATE", name)
    return int(fd)


@_fd_call("map_fd")
def map_lookup(map_fd: int, key: bytes, value_size: int) -> bytes | None:
    value = ctypes.create_string_buffer(value_size)
    result = libbpf().bpf_map_lookup_elem(map_fd, key, value)
    if result < 0 and (ctypes.get_errno() or -result) == 2:  # ENOENT
        return None
    bpf_check(result, "map lookup", f"map fd {map_fd}")
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
    bpf_check(fd, "loading the dispatcher", name)
    return int(fd)


_NR_BPF = 321  # x86-64


_BPF_PROG_LOAD = 5


def prog_load_logged(
    insns: bytes, name: str, log_size: int = 1 << 20, kind: int = BPF_PROG_TYPE_SOCKET_FILTER
) -> tuple[int, str]:
    """Load instructions as they are (map fds already in them) as a program of type
    ``kind`` (a socket filter, or BPF_PROG_TYPE_XDP), with the verifier's log: (fd, "")
    or (-errno, the log); ``log_size`` 0: no log.  bpf(2) itself, with the attribute
    laid out here: libbpf's bpf_prog_load_opts changes shape between its versions."""
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(max(1, log_size))
    attr = ctypes.create_string_buffer(
        struct.pack(
            "<IIQQIIQII16s",
            kind, len(insns) // 8, ctypes.addressof(code),
            ctypes.addressof(license_), 1 if log_size else 0, log_size,
            ctypes.addressof(log) if log_size else 0, 0, 0, name.encode()[:15],
        ).ljust(128, b"\0")
    )  # fmt: skip
    fd = LIBC.syscall(
        ctypes.c_long(_NR_BPF), ctypes.c_long(_BPF_PROG_LOAD), attr, ctypes.c_long(128)
    )
    if fd < 0:
        return -ctypes.get_errno(), log.value.decode(errors="replace")
    return int(fd), ""


BPF_PROG_TYPE_XDP = 6
BPF_XDP = 37  # enum bpf_attach_type: an XDP program's link to an interface


class _LinkCreateOpts(ctypes.Structure):
    # struct bpf_link_create_opts, libbpf's bpf.h, up to flags (libbpf takes a shorter
    # struct than its own: what it does not see is zero)
    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32)]


XDP_FLAGS_SKB_MODE = 1 << 1  # generic XDP: after the driver, before the stack


def xdp_link(prog_fd: int, ifindex: int) -> int:
    """Attach an XDP program to an interface through a BPF link (Linux 5.9): natively
    where the driver can run it (no mode flag: the kernel chooses the driver's where it
    has one), generically where it has none or refuses this program.  The link's fd;
    pinned, it outlives this process; EBUSY if another program is attached to the
    interface."""
    fd = libbpf().bpf_link_create(prog_fd, ifindex, BPF_XDP, None)
    if fd < 0 and (ctypes.get_errno() or -fd) not in (errno.EBUSY, errno.EPERM, errno.ENODEV):
        opts = _LinkCreateOpts(ctypes.sizeof(_LinkCreateOpts), XDP_FLAGS_SKB_MODE)
        fd = libbpf().bpf_link_create(prog_fd, ifindex, BPF_XDP, ctypes.byref(opts))
    bpf_check(fd, "BPF_LINK_CREATE", f"interface index {ifindex}")
    return int(fd)


def link_update(link_fd: int, prog_fd: int) -> None:
    """Put another program behind a link, in one step (BPF_LINK_UPDATE)."""
    bpf_check(libbpf().bpf_link_update(link_fd, prog_fd, None), "BPF_LINK_UPDATE")


def link_detach(link_fd: int) -> None:
    """End a link's attachment now, whoever else holds it (BPF_LINK_DETACH)."""
    bpf_check(libbpf().bpf_link_detach(link_fd), "BPF_LINK_DETACH")


def link_info(link_fd: int) -> tuple[int, int]:
    """An XDP link's program id and interface index (struct bpf_link_info: type, id,
    prog_id, then the xdp member's ifindex); the index is 0 once the link was detached,
    or its interface (or network namespace) went away."""
    raw = _info(link_fd, "link")
    prog_id = int.from_bytes(raw[8:12], "little")
    ifindex = int.from_bytes(raw[16:20], "little")
    return prog_id, ifindex


def fdinfo_field(fd: int, field: str) -> int:
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
        for line in info:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(0, f"no {field} in the fdinfo of fd {fd}")


@_fd_call("map_fd")
def map_update(map_fd: int, key: bytes, value: bytes) -> None:
    """Put key -> value in a map (BPF_ANY)."""
    bpf_check(libbpf().bpf_map_update_elem(map_fd, key, value, 0), "map update", f"map fd {map_fd}")


@_fd_call("map_fd")
def map_update_batch(map_fd: int, keys: bytes, values: bytes, count: int) -> None:
    """Put ``count`` packed keys and values in a map in one BPF_MAP_UPDATE_BATCH (5.6)."""
    done = ctypes.c_uint32(count)
    bpf_check(
        libbpf().bpf_map_update_batch(map_fd, keys, values, ctypes.byref(done), None),
        "batch update",
        f"map fd {map_fd}",
    )


@_fd_call("map_fd")
def map_items(
    map_fd: int, key_size: int, value_size: int, chunk: int = 65536
) -> tuple[bytes, bytes, int]:
    """Every key and value of a hash map, packed, and how many: BPF_MAP_LOOKUP_BATCH
    (Linux 5.6), ``chunk`` entries a call (a bucket holding more fails with ENOSPC:
    the call is made again with room for twice as many)."""
    keys_out, values_out, total = [], [], 0
    token = ctypes.create_string_buffer(max(8, key_size))  # the kernel's place to go on
    given: ctypes.Array[ctypes.c_char] | None = None
    while True:
        keys = ctypes.create_string_buffer(key_size * chunk)
        values = ctypes.create_string_buffer(value_size * chunk)
        count = ctypes.c_uint32(chunk)
        result = libbpf().bpf_map_lookup_batch(
            map_fd, given, token, keys, values, ctypes.byref(count), None
        )
        error = (ctypes.get_errno() or -result) if result < 0 else 0
        if error == 28:  # ENOSPC: a bucket larger than chunk
            chunk *= 2
            continue
        keys_out.append(keys.raw[: count.value * key_size])
        values_out.append(values.raw[: count.value * value_size])
        total += count.value
        if error == 2:  # ENOENT: the last entries came with this call
            return b"".join(keys_out), b"".join(values_out), total
        bpf_check(result, "batch lookup", f"map fd {map_fd}")
        given = ctypes.create_string_buffer(token.raw)


@_fd_call("map_fd")
def map_delete(map_fd: int, key: bytes) -> bool:
    """Remove key from a map; False if it was not there."""
    result = libbpf().bpf_map_delete_elem(map_fd, key)
    if result < 0 and (ctypes.get_errno() or -result) == 2:  # ENOENT
        return False
    bpf_check(result, "map delete", f"map fd {map_fd}")
    return True


@_fd_call("map_fd")
def map_first_key(map_fd: int, key_size: int) -> bytes | None:
    """A map's first key, or None if it is empty."""
    current = ctypes.create_string_buffer(key_size)
    result = libbpf().bpf_map_get_next_key(map_fd, None, current)
    if result < 0:
        if (ctypes.get_errno() or -result) == 2:  # ENOENT: no key
            return None
        bpf_check(result, "map iteration", f"map fd {map_fd}")
    return current.raw


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
            bpf_check(result, "map iteration", f"map fd {map_fd}")
        previous = current.raw
        keys.append(previous)


@_fd_call("map_fd", "prog_fd")
def prog_array_set(map_fd: int, index: int, prog_fd: int) -> None:
    """Put a program in a program array's slot ``index``: one atomic update."""
    bpf_check(
        libbpf().bpf_map_update_elem(
            map_fd, index.to_bytes(4, "little"), prog_fd.to_bytes(4, "little"), 0
        ),
        "program array update",
        f"map fd {map_fd}",
    )


def unprivileged_bpf_disabled() -> int | None:
    """kernel.unprivileged_bpf_disabled (0: anyone may load; 1 or 2: CAP_BPF only);
    None when it cannot be read."""
    try:
        with open("/proc/sys/kernel/unprivileged_bpf_disabled", "rb") as f:
            return int(f.read().strip() or b"0")
    except (OSError, ValueError):
        return None


def bcc_table_names(module: Any) -> list[bytes]:
    """The names of the maps of a module BCC compiled (libbcc's table list, which BCC's
    Python does not offer)."""
    from bcc.libbcc import lib  # noqa: PLC0415

    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return [lib.bpf_table_name(module, i) for i in range(lib.bpf_num_tables(module))]
