"""Compile a planned program with BCC, load it, and fill its maps.

The plan (program.py) is a pure function of the rules; this is where the
kernel and its privileges come in, and where BCC's errors become messages a
user can act on.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from alfwrapper.bpf import cache
from alfwrapper.bpf.parts import INNER_MAPS, REASONS, RESERVED_PREFIXES, FillEnv
from alfwrapper.bpf.program import ProgramPlan, object_name, plan_program
from alfwrapper.bpf.tables import MapSpec, OwnFds, Table, Tables
from alfwrapper.errors import (
    EX_CONFIG,
    EX_DATAERR,
    EX_NOPERM,
    EX_OSERR,
    EX_SOFTWARE,
    EX_USAGE,
    AlfError,
    missing_library,
)
from alfwrapper.host import bpf_calls, kernel_headers, libc, process
from alfwrapper.policy.rules import SocketRules
from alfwrapper.record import Record, field

MOST_MAPS = 64  # maps one program may use (the verifier's MAX_USED_MAPS)


class LoadedFilter(Record, frozen=False):
    """A loaded program; keep it referenced until its fd is attached.  ``tables``: its
    maps (None when the loader loaded it); ``programs``: each loaded function's
    instructions, as loaded."""

    tables: Any
    fd: int
    plan: ProgramPlan
    programs: dict[str, bytes] = field(default_factory=dict)


@contextmanager
def _output_to(sink: list[str], what: str = "") -> Iterator[None]:
    """Capture fds 1 and 2 while libbcc runs: clang and the verifier write to stderr,
    BCC's loader to stdout (std::cout, through C stdio: flushed here, before the fds
    are given back, so that nothing of it comes out later on the real stdout).  With
    ``what``, LLVM's errors that end the process (exit(1): a filter's stack over 512
    bytes) are said in one line by an _exit_witness."""
    sys.stdout.flush()
    import tempfile  # noqa: PLC0415  (with random: 2 ms a start from the cache need not pay)

    with tempfile.TemporaryFile() as tmp:
        saved = [os.dup(1), os.dup(2)]
        witness = _exit_witness(tmp.fileno(), saved[1], what) if what else None
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            _flush_c_stdio()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            if witness is not None:
                witness()
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))


def _exit_witness(captured: int, stderr: int, what: str) -> Callable[[], None] | None:
    """A child that outlives this process if LLVM ends it, and then says why.

    LLVM ends the process on some errors (exit(1), its default for an error
    diagnostic: no exception, no Python clean-up) while its words are in the capture
    of fd 2, which nobody would read.  The child waits on a pipe: a byte from the
    caller (returned: call it once the compile is over) lets it go quietly; the pipe's
    end without one means this process is gone, and it prints the last error line of
    the capture as alfwrapper's one line (none if the capture holds no error: a
    kill).  The exit status stays LLVM's 1 (errors.EX_COMPILER_ENDED).  No child
    (fork refused, as by a quota): None, and no witness."""
    readable, writable = os.pipe()
    try:
        child = os.fork()
    except OSError:
        os.close(readable)
        os.close(writable)
        return None
    if child == 0:  # only system calls here, then _exit
        os.close(writable)
        if os.read(readable, 1):
            os._exit(0)
        size = os.fstat(captured).st_size  # its last 64 KiB: LLVM's words come last
        text = os.pread(captured, 1 << 16, max(0, size - (1 << 16))).decode("utf-8", "replace")
        said = [line for line in text.splitlines() if "error" in line.lower()]
        if not said:  # killed, say, not ended by LLVM: nothing of ours to say
            os._exit(0)
        why = said[-1].replace("/virtual/main.c", "alfwrapper-composed.c").strip()[:400]
        hint = (
            "a filter's stack is at most 512 bytes: move large variables into a per-CPU array map"
            if "stack" in why
            else "-v shows the compiler output"
        )
        os.write(
            stderr,
            f"alfwrapper: {what}: the compiler (LLVM) stopped the process: {why} "
            f"({hint})\n".encode(),
        )
        os._exit(0)
    os.close(readable)

    def over() -> None:
        os.write(writable, b"1")
        os.close(writable)
        os.waitpid(child, 0)

    return over


def _flush_c_stdio() -> None:
    """fflush(NULL): C stdio's buffers (libbcc's std::cout goes through them)."""
    libc.flush_c_stdio()


@contextmanager
def _in_root_directory() -> Iterator[None]:
    """Compile from /: BCC's include path has entries relative to the working directory,
    and clang stops at one it may not read (a service started in a directory its user
    cannot enter)."""
    try:  # O_PATH: a folder it may enter but not read (or that Landlock hides) comes back too
        saved: int | None = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        saved = None
    os.chdir("/")
    try:
        yield
    finally:
        if saved is not None:
            os.fchdir(saved)
            os.close(saved)


_PERMISSION = ("Operation not permitted", "EPERM")
_NEED_CAP = (
    "loading filters needs CAP_BPF while kernel.unprivileged_bpf_disabled is set: run as root "
    "with its capabilities, or give the service AmbientCapabilities=CAP_BPF"
)


def _permission_error(what: str, details: str, plan: ProgramPlan | None = None) -> AlfError:
    hint = _NEED_CAP
    unprivileged_allowed = bpf_calls.unprivileged_bpf_disabled() == 0
    if unprivileged_allowed and plan is not None and plan.rules.knock:
        hint = (
            "knocking needs CAP_BPF even where unprivileged BPF is allowed (its LRU map "
            "and TAI clock are privileged): give the service AmbientCapabilities=CAP_BPF"
        )
    return AlfError(what, "permission denied", hint, EX_NOPERM, details=details)


def _import_bcc() -> Any:
    try:
        import bcc  # noqa: PLC0415  (slow import, only when loading)
    except ImportError as err:
        raise missing_library(err) or err from None
    return bcc


def prepare_to_compile() -> None:
    """Load now what compiling loads lazily (BCC, libbpf, which ctypes finds by running
    ld), and the modules a start imports only when it needs them (importlib.util for
    BCC's version, hashlib and hmac for a knock secret, tempfile, subprocess, the
    SHA-256 module, knocking and interfaces for parts.py): for a process about to
    lose the right to read them (the loader's confine, where Python's own library is
    out of reach)."""
    import hashlib  # noqa: F401, PLC0415
    import hmac  # noqa: F401, PLC0415
    import importlib.util  # noqa: F401, PLC0415
    import subprocess  # noqa: F401, PLC0415
    import tempfile  # noqa: F401, PLC0415

    from alfwrapper.host import cachedir, interfaces  # noqa: F401, PLC0415
    from alfwrapper.policy import knocking  # noqa: F401, PLC0415  (parts.py's, lazily)

    cachedir.sha256(b"")
    _import_bcc()
    bpf_calls.libbpf()


def _first_error(log: str) -> str:
    """The compiler's first error, as FILE:LINE:COL: message."""
    for line in log.splitlines():
        if "error:" in line:
            return line.strip()
    return ""


_SOURCE_NOTE = re.compile(r"^; (?P<code>.*\S) @ (?P<where>\S+:\d+)$")


def _verifier_reason(log: str) -> str:
    """The lines of the verifier log that matter: its complaint, and where.

    The complaint is the last line that is not statistics; "where" is the
    last source annotation before it that shows real code (BCC annotates
    instructions with "; code @ file:line", and #line markers make the file
    the part's own).
    """
    lines = [raw.strip() for raw in log.splitlines()]
    complaint, at = "no verifier log", len(lines)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] and not lines[i].startswith(("processed ", "verification time", "stack depth")):
            complaint, at = lines[i], i
            break
    for line in reversed(lines[:at]):
        match = _SOURCE_NOTE.match(line)
        if match and match.group("code") not in ("}", "{"):
            return f"{complaint}, near {match.group('where')}: {match.group('code')}"
    return complaint


def _what(plan: ProgramPlan) -> str:
    if plan.rules.custom:
        return f"the filter {plan.rules.custom.path}"
    return "the filter"


def compile_and_load(plan: ProgramPlan, env: FillEnv | None = None) -> LoadedFilter:
    """Load the plan's program: from the program cache (cache.py) if it was compiled
    before with the same settings, else compiled with BCC (and then kept there); the
    maps its parts bind (Part.bind: named sets) from ``env``."""
    headers = kernel_headers.find()
    if headers is None:
        raise AlfError(
            f"compiling {_what(plan)}",
            f"no kernel headers for BCC ({kernel_headers.searched()})",
            kernel_headers.HINT,
            EX_SOFTWARE,
        )
    key = cache.key(plan.text, plan.cflags, list(plan.programs), str(headers.where))
    env = env or FillEnv()
    entry = cache.load(key)
    if entry is not None:
        loaded = _from_cache(plan, entry, env)
        if loaded is not None:
            return loaded
    loaded = _compile(plan, headers, env)
    kept = _cache_entry(loaded)
    if kept is not None:
        cache.store(key, kept)
    return loaded


def _from_cache(plan: ProgramPlan, entry: cache.Entry, env: FillEnv) -> LoadedFilter | None:
    """Make the entry's maps afresh (named as name_maps names them), adopt the pinned
    ones, and load its programs with their fds; None if any step but binding fails
    (then the plan is compiled, as without a cache).  Binding raises: a set that
    cannot be read is not the cache's fault."""
    owner = OwnFds()
    tables: dict[str, Table] = {}
    if [p.name for p in entry.programs] != list(plan.programs):
        return None
    try:
        # An array of maps is made after the map whose shape its maps take.
        for spec in sorted(entry.maps, key=lambda s: s.name in INNER_MAPS):
            name = object_name(plan.label, spec.name) if plan.label else spec.name
            inner = tables[INNER_MAPS[spec.name]].map_fd if spec.name in INNER_MAPS else 0
            fd = bpf_calls.map_create(
                spec.kind, name, spec.key_size, spec.value_size, spec.entries, spec.flags, inner
            )
            owner.fds.append(fd)
            tables[spec.name] = Table(spec, fd)
        loaded_tables = Tables(tables, owner)
        adopt_pinned(loaded_tables, plan.pinned, plan.borrowed)
        fds = loaded_tables.fds()
        programs = {p.name: p.with_fds(fds) for p in entry.programs}
    except (OSError, KeyError, AlfError):
        return None
    bound = bind_parts(plan, loaded_tables, env)
    try:
        entry_fd = _load_programs(plan, programs, loaded_tables, bound)
    except (OSError, KeyError):
        return None
    finally:
        _close(bound)
    return LoadedFilter(loaded_tables, entry_fd, plan, programs)


def bind_parts(plan: ProgramPlan, tables: Tables, env: FillEnv) -> dict[str, int]:
    """What each part binds (Part.bind), by placeholder: fds for the caller to close."""
    bound: dict[str, int] = {}
    try:
        for part_plan in plan.parts:
            bound.update(part_plan.part.bind(tables, part_plan, plan.rules, env))
    except BaseException:
        _close(bound)
        raise
    return bound


def _close(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)


def _load_programs(
    plan: ProgramPlan, programs: dict[str, bytes], tables: Tables, bound: dict[str, int]
) -> int:
    """Load each function's instructions under its kernel name (the body into
    iface_alive's slot 0), with the ``bound`` maps in their placeholders' places (as
    loaded only: ``programs`` keeps the placeholders, for the cache); the entry's fd,
    or raise OSError with the verifier's log as its filename.  The program fds belong
    to the tables' owner.  Loaded first without a log, as BCC does (a long log can
    overflow and fail a good program on older kernels), and again with one when the
    kernel refuses."""
    fds: dict[str, int] = {}
    own = tables.fds()
    names = {fd: name for name, fd in own.items()}
    for function, placeheld in programs.items():
        insns = placeheld
        if bound:
            found = cache.relocations(placeheld, names)
            if found is None:  # an fd that is none of its maps: BCC's, never
                raise OSError(errno.EBADF, "an instruction names a map that is not the program's")
            insns = cache.CachedProgram(function, placeheld, found).with_fds({**own, **bound})
        name = plan.programs[function]
        fd, _ = bpf_calls.prog_load_logged(insns, name, log_size=0, kind=plan.kind)
        if fd < 0:
            _, log = bpf_calls.prog_load_logged(insns, name, kind=plan.kind)
            raise OSError(-fd, os.strerror(-fd), log)
        tables.owner.fds.append(fd)
        fds[function] = fd
    if plan.rules.interfaces:
        bpf_calls.prog_array_set(tables[b"iface_alive"].map_fd, 0, fds[plan.body])
    return fds[plan.entry]


def _cache_entry(loaded: LoadedFilter) -> cache.Entry | None:
    """What the cache keeps of a program compiled here; None if an instruction names
    an fd that is none of its maps (then it is not kept)."""
    names = {fd: name for name, fd in loaded.tables.fds().items()}
    programs = []
    for name, insns in loaded.programs.items():
        found = cache.relocations(insns, names)
        if found is None:
            return None
        programs.append(cache.CachedProgram(name, insns, found))
    return cache.Entry(tuple(loaded.tables.specs()), tuple(programs))


def _compile(plan: ProgramPlan, headers: kernel_headers.HeaderTree, env: FillEnv) -> LoadedFilter:
    """Compile the plan's C with BCC and load its entry function as a socket filter."""
    bcc = _import_bcc()
    log: list[str] = []
    what = _what(plan)
    _return_freed_memory()  # what parsing and planning freed, before LLVM's peak
    try:
        with (
            _output_to(log, f"compiling {what}"),
            _in_root_directory(),
            kernel_headers.for_bcc(headers) as include,
        ):
            bpf = bcc.BPF(text=plan.text.encode(), cflags=[*plan.cflags, *include])
    except Exception as err:  # noqa: BLE001  (BCC raises bare Exception)
        text = "".join(log).replace("/virtual/main.c", "alfwrapper-composed.c")
        if "Unable to find kernel headers" in text:
            raise AlfError(
                f"compiling {what}",
                f"BCC found no kernel headers at {headers.where}",
                kernel_headers.HINT,
                EX_SOFTWARE,
                details=text,
            ) from None
        if any(p in text for p in _PERMISSION):
            raise _permission_error(f"creating the maps of {what}", text, plan) from None
        clash = re.search(r"redefinition of '(\w+)_table_t'", text)
        if clash:  # a map declared twice: one of the filter's has a built-in one's name
            raise AlfError(
                f"compiling {what}",
                f"two maps are named {clash.group(1)!r}, the filter's and alfwrapper's own",
                "rename the filter's map: names starting with "
                f"{', '.join(RESERVED_PREFIXES)} belong to alfwrapper's parts",
                EX_DATAERR,
                details=text,
            ) from None
        raise AlfError(
            f"compiling {what}",
            _first_error(text) or str(err),
            "run with -v for the compiler output",
            EX_DATAERR,
            details=text,
        ) from None
    tables = _bcc_tables(bpf)
    if plan.label:
        name_maps(tables, plan.label, {name for name, _ in plan.pinned})
    adopt_pinned(tables, plan.pinned, plan.borrowed)
    bound = bind_parts(plan, tables, env)
    try:
        programs = {f: bytes(bpf.dump_func(f.encode())) for f in plan.programs}
        entry_fd = _load_programs(plan, programs, tables, bound)
    except OSError as err:
        if err.errno == errno.E2BIG:  # too many maps, or too much to verify: the log
            text = err.filename or ""  # of our own load (BCC's would verify it all again)
        else:
            text = _bcc_log(bcc, bpf, plan, log) or err.filename or ""
        if err.errno == errno.EPERM:
            raise _permission_error(f"loading {what}", text, plan) from None
        maps = err.errno == errno.E2BIG and "number of maps" in text
        if err.errno in (errno.EACCES, errno.EINVAL) or (err.errno == errno.E2BIG and not maps):
            # E2BIG too for a program the verifier gave up on ("too large", a million
            # instructions processed) or one of too many instructions.
            raise AlfError(
                f"loading {what}",
                f"the verifier rejected it: {_verifier_reason(text)}",
                "bound every loop and access, check map lookups for NULL; -v shows the "
                "verifier log",
                EX_DATAERR,
                details=text,
            ) from None
        if maps:  # "The total number of maps per program has reached the limit"
            raise AlfError(
                f"loading {what}",
                f"it uses more maps than the kernel lets one program use ({MOST_MAPS})",
                "name fewer sets for this socket, or declare fewer maps in the filter",
                EX_USAGE,
                details=text,
            ) from None
        raise AlfError(
            f"loading {what}",
            err.strerror or str(err),
            "run with -v for details",
            EX_OSERR,
            details=text,
        ) from None
    finally:
        _close(bound)
    _return_freed_memory()
    return LoadedFilter(tables, entry_fd, plan, programs)


def _bcc_log(bcc: Any, bpf: Any, plan: ProgramPlan, log: list[str]) -> str:
    """The verifier's log for a refused program, as BCC's own loading prints it: with
    the source line of each instruction (BCC passes the line info)."""
    try:
        with _output_to(log):
            for function in plan.programs:
                bpf.load_func(function.encode(), plan.kind)
    except Exception:  # noqa: BLE001  (refused again: the log is what is wanted)
        pass
    return "".join(log)


def _bcc_tables(bpf: Any) -> Tables:
    """The maps BCC made for a module, with their shapes and C types (kept by ``bpf``)."""
    import json  # noqa: PLC0415

    from bcc.libbcc import lib  # noqa: PLC0415

    tables = {}
    for raw in bpf_calls.bcc_table_names(bpf.module):
        fd = lib.bpf_table_fd(bpf.module, raw)
        kind, key_size, value_size, entries, flags = bpf_calls.map_shape(fd)
        descs = [lib.bpf_table_key_desc(bpf.module, raw), lib.bpf_table_leaf_desc(bpf.module, raw)]
        key_desc, leaf_desc = (json.loads(d) if d else "" for d in descs)
        name = raw.decode()
        spec = MapSpec(name, kind, key_size, value_size, entries, flags, key_desc, leaf_desc)
        tables[name] = Table(spec, fd)
    return Tables(tables, OwnFds(keep=bpf))


def refused_without_perfmon(loaded: LoadedFilter) -> str:
    """The verifier's complaint when the program, loaded here, would not load with
    CAP_BPF alone, as the shipped units and the loader load every program; "" when it
    would (or when this process holds neither CAP_PERFMON nor CAP_SYS_ADMIN: it was
    just loaded that way).  The same instructions are loaded again in a child that
    keeps CAP_BPF only."""
    from alfwrapper.host import privileges  # noqa: PLC0415
    from alfwrapper.host.capabilities import CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN  # noqa: PLC0415

    # What the verifier grants a loader with either (allow_ptr_leaks, bypass_spec_v1).
    if not privileges.effective() & (1 << CAP_PERFMON | 1 << CAP_SYS_ADMIN):
        return ""
    cap_bpf = 1 << CAP_BPF
    programs = list(loaded.programs.items())
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: CAP_BPF alone, the parent's maps by their fds
        os.close(read_end)
        complaint = ""
        try:
            process.capset(cap_bpf, cap_bpf, 0)
            for name, insns in programs:
                fd, log = bpf_calls.prog_load_logged(insns, name)
                if fd < 0:
                    complaint = _verifier_reason(log) if log else os.strerror(-fd)
                    break
                os.close(fd)
        except OSError as err:
            complaint = f"could not try: {err}"
        os.write(write_end, complaint.encode()[:4000])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        complaint = pipe.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return complaint


def _return_freed_memory() -> None:
    """Give freed heap back to the system (glibc's malloc_trim(3)): before compiling,
    what parsing a big rule file freed (about 35 MiB at a million rules); after, what
    LLVM freed (about 40 MiB), before the maps are filled.  Both would otherwise add
    to the peak RSS."""
    libc.malloc_trim()


def name_maps(tables: Tables, label: str, pinned: set[str]) -> None:
    """Name every map for the service and socket it serves, before the program loads.

    BCC names a map after its declaration, the same in every program; each is
    replaced here (while empty, by fd number, as adopt_pinned does) by a copy
    named ``LABEL.ROLE`` (program.object_name).  Maps to be ``pinned`` lose their
    BTF description: bpffs shows a map with one as text to whoever may open its
    pin, and a pin without one cannot be opened but through bpf(2), which the
    application may not call (privileges.py)."""
    fds = tables.fds()
    for name, fd in fds.items():
        try:
            inner = fds[INNER_MAPS[name]] if name in INNER_MAPS else 0
            renamed = bpf_calls.map_renamed(
                fd, object_name(label, name), keep_btf=name not in pinned, inner_fd=inner
            )
        except OSError as err:
            raise AlfError(
                f"naming the map {name}", err.strerror or str(err), "run with -v", EX_OSERR
            ) from None
        os.dup2(renamed, fd, inheritable=False)
        os.close(renamed)


def adopt_pinned(
    tables: Tables, pinned: tuple[tuple[str, str], ...], borrowed: bool = False
) -> None:
    """Make the program use pinned maps that outlive it, before it is loaded.

    BCC creates every map when it compiles and writes their fd numbers into
    the program; the kernel resolves those numbers when the program loads.  So
    a pinned map goes in by taking over the fd number of the fresh map BCC made
    for the same declaration (dup2).  (BCC's own pinned tables open them by id,
    which needs CAP_SYS_ADMIN.)  A pinned map whose shape differs from the
    declaration (the program changed) is replaced; one not pinned yet is
    pinned now.  ``borrowed``: neither; the map must be there, of the shape.
    """
    for name, path in pinned:
        fresh = tables[name].map_fd
        try:
            if os.path.exists(path) or borrowed:
                kept = bpf_calls.obj_get(path)
                try:
                    if bpf_calls.map_shape(kept) == bpf_calls.map_shape(fresh):
                        os.dup2(kept, fresh, inheritable=False)
                        continue
                finally:
                    os.close(kept)
                if borrowed:
                    raise AlfError(
                        f"pinned map {path}",
                        "is not of the shape this alfwrapper makes",
                        "restart the service with this alfwrapper",
                        EX_CONFIG,
                    )
                os.unlink(path)
            bpf_calls.obj_pin(fresh, path)
        except OSError as err:
            raise AlfError(
                f"pinned map {path}",
                err.strerror or str(err),
                "run as root, or give the unit CAP_DAC_OVERRIDE and CAP_CHOWN besides CAP_BPF",
                EX_NOPERM if err.errno in (1, 13) else EX_OSERR,
            ) from None


def set_knock_listeners(tables: Tables, cookies: list[int]) -> None:
    """Tell the knock part which sockets are TCP listeners (their SO_COOKIE)."""
    table = tables[b"knock_listeners"]
    for cookie in cookies:
        try:
            table[table.Key(cookie)] = table.Leaf(1)
        except Exception as err:  # noqa: BLE001  (BCC raises bare Exception)
            raise AlfError(
                "knocking",
                f"too many listening sockets share one knock rule: {err}",
                "give each listener its own knock rule",
                EX_USAGE,
            ) from None


def prog_id(loaded: LoadedFilter) -> int:
    """The kernel's id of the loaded program (as bpftool shows it)."""
    from alfwrapper.host.bpf_calls import prog_info  # noqa: PLC0415

    return prog_info(loaded.fd).id


def counters(loaded: LoadedFilter) -> dict[str, int]:
    """The verdict counters, summed over CPUs, by reason (parts.REASONS)."""
    table = loaded.tables[b"alf_counters"]
    return {reason: sum(table.per_cpu(table.Key(i))) for i, reason in enumerate(REASONS)}


def load_program(plan: ProgramPlan, env: FillEnv | None = None) -> LoadedFilter:
    """Compile, load (binding what the parts bind) and fill every map of the plan."""
    env = env or FillEnv()
    loaded = compile_and_load(plan, env)
    for part_plan in plan.parts:
        part_plan.part.fill(loaded.tables, part_plan, plan.rules, env)
    return loaded


def load_rules(rules: SocketRules) -> LoadedFilter:
    """Plan, compile, load and fill a program for rules that name no interface."""
    return load_program(plan_program(rules))
