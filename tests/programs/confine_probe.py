"""Compile hostile filter sources the way the loader does, each in a child of its own,
and report which of them opened a secret file (inotify on the file: an open Landlock
refuses never reaches it).  Used by test_confine.py; as root.

    confine_probe.py SECRET MODE < sources.json > results.json

MODE is "confined" (server.confine first, as every loader request does) or "open"
(nothing: the control, which shows the spellings do reach the file).  The text check
(program.checked_source) is off in both: Landlock must stop what it would let by."""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from alfwrapper import state
from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.loader import server
from alfwrapper.policy.rules import CustomFilter, SocketRules

IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000
TREE = state.USERS_ROOT / "4000000"  # a user's tree nobody has


def watch(path: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK)
    if fd < 0 or libc.inotify_add_watch(fd, path.encode(), IN_OPEN | IN_ACCESS) < 0:
        raise OSError(ctypes.get_errno(), "inotify")
    return int(fd)


def events(fd: int) -> int:
    count = 0
    try:
        while data := os.read(fd, 4096):
            while data:
                _, _, _, length = struct.unpack_from("iIII", data)
                data = data[16 + length :]
                count += 1
    except BlockingIOError:
        pass
    return count


def compile_in_child(source: str, confined: bool) -> str:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            program.checked_source = lambda text, where: text  # type: ignore[assignment]
            if confined:
                server.confine(state.Store(TREE, state.USERS_ROOT), custom=True)
            rules = SocketRules(custom=CustomFilter(path="x.c", source=source))
            compiler.load_program(program.plan_program(rules, label_="x_u1"), FillEnv())
            out = "loaded"
        except BaseException as err:  # noqa: BLE001
            out = f"{type(err).__name__}: {err}"
        os.write(write, out.encode()[:60000])
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(child, 0)
    return b"".join(chunks).decode(errors="replace")


def main() -> None:
    secret, mode = sys.argv[1], sys.argv[2]
    sources = json.load(sys.stdin)
    compiler.prepare_to_compile()
    token = Path(secret).read_text().split()[0]
    fd = watch(secret)
    results = []
    for source in sources:
        said = compile_in_child(source, mode == "confined")
        results.append({"opened": events(fd), "shown": token in said, "said": said[-300:]})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
