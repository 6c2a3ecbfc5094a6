"""Reading BPF ring buffers (the drop log) through libbpf, or by mapping them where libbpf's
ring buffer manager cannot be used."""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import struct
from collections.abc import Callable

from alfwrapper.host.bpf_calls import bpf_check, fdinfo_field, libbpf

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
                    bpf_check(
                        lib.ring_buffer__add(self._ring, fd, self._callback, index),
                        "ring_buffer__add",
                    )
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
        bpf_check(min(count, 0), "ring_buffer__consume")
        return int(count)

    def poll(self, timeout_ms: int) -> int:
        if self._mapped is not None:
            self._mapped.epoll.poll(timeout_ms / 1000 if timeout_ms >= 0 else None)
            return self._mapped.consume()
        count = libbpf().ring_buffer__poll(self._ring, timeout_ms)
        if count < 0 and (ctypes.get_errno() or -count) == 4:  # EINTR
            return 0
        bpf_check(min(count, 0), "ring_buffer__poll")
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
                size = fdinfo_field(fd, "max_entries")
                consumer = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                producer = mmap.mmap(
                    fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
                )
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
