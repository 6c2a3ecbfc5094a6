"""The loader's client: Broker, a state.Store whose every operation is a request to the
loader, used by itself by a wrapper or command without CAP_BPF."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alfwrapper import state
from alfwrapper.errors import (
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    AlfError,
)
from alfwrapper.host import bpf_calls
from alfwrapper.host.faults import crash_point
from alfwrapper.loader.protocol import (
    BUSY_SECONDS,
    READ_SECONDS,
    REQUEST_LIMIT,
    WORK_SECONDS,
    Late,
    connect,
    from_wire,
    receive,
    send,
    socket_path,
    to_wire,
)
from alfwrapper.policy.rules import SocketRules


class Broker(state.Store):
    """The pinned state of this user's services, through the loader."""

    opens_sets = False

    def __init__(self, path: str = "") -> None:
        super().__init__(state.user_base(os.getuid()))
        self.path = path or socket_path()
        self._pins: dict[state.SocketState, set[str]] = {}

    def request(
        self, message: dict[str, Any], fds: Sequence[int] = (), seconds: float = WORK_SECONDS
    ) -> tuple[dict[str, Any], list[int]]:
        """One request, sent again while the loader is busy (it says so, or closes an
        over-full queue's connection unanswered), for at most BUSY_SECONDS."""
        deadline, pause = time.monotonic() + BUSY_SECONDS, 0.05
        while True:
            try:
                return self._request_once(message, fds, seconds)
            except AlfError as err:
                if err.exit_code != EX_TEMPFAIL or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _request_once(
        self, message: dict[str, Any], fds: Sequence[int], seconds: float
    ) -> tuple[dict[str, Any], list[int]]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.settimeout(READ_SECONDS)
                connect(conn, self.path)
                try:
                    send(conn, message, fds)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before it was all read: the answer says why
                answer, got = receive(conn, REQUEST_LIMIT, seconds, 8)
            except Late:
                raise AlfError(
                    f"the loader ({self.path})",
                    f"gave no complete answer within {seconds:.0f} s",
                    "check `systemctl status alfwrapper-loader.service`",
                    EX_UNAVAILABLE,
                ) from None
            except (FileNotFoundError, ConnectionRefusedError):
                raise unavailable(self.path) from None
            except OSError as err:
                raise AlfError(
                    f"the loader ({self.path})",
                    err.strerror or str(err),
                    "check `systemctl status alfwrapper-loader.service`",
                    EX_UNAVAILABLE,
                ) from None
        error = answer.get("error")
        if isinstance(error, dict):
            for fd in got:
                os.close(fd)
            raise AlfError(
                str(error.get("what", "loader")),
                str(error.get("why", "failed")),
                str(error.get("hint", "")),
                int(error.get("code", EX_SOFTWARE)),
            )
        return answer, got

    def root(self, create: bool = True) -> Path:
        return self.base

    def take(self, service: str, sock: socket.socket, label: str, pid: int = 0) -> state.Taken:
        """Store.take, by the loader, in one request: this process is the one named."""
        answer, _ = self.request(
            {"op": "take", "service": service, "label": label}, [sock.fileno()]
        )
        where = self.state(service, int(answer["cookie"]))
        taken = state.Taken(where, answer.get("judged") is True, answer.get("made") is True)
        crash_point("attached")  # the loader pinned and attached; nothing is loaded yet
        return taken

    def remove(self, where: state.SocketState) -> None:
        self.request({"op": "remove", "service": where.service, "cookie": where.cookie})

    def check_pins(self, where: state.SocketState) -> str:
        answer, _ = self.request({"op": "check", "service": where.service, "cookie": where.cookie})
        return str(answer.get("problem", ""))

    def install(self, where: state.SocketState, prog_fd: int) -> None:
        """Store.install, by the loader, in one request."""
        self.request({"op": "install", "service": where.service, "cookie": where.cookie}, [prog_fd])
        self._pins.pop(where, None)

    def open_pin(self, where: state.SocketState, name: str) -> int:
        _, fds = self.request(
            {"op": "open", "service": where.service, "cookie": where.cookie, "name": name}
        )
        return fds[0]

    def has_pin(self, where: state.SocketState, name: str) -> bool:
        if where not in self._pins:
            answer, _ = self.request(
                {"op": "pins", "service": where.service, "cookie": where.cookie}
            )
            self._pins[where] = set(answer["pins"])
        return name in self._pins[where]

    def services(self) -> list[str]:
        return list(self.request({"op": "services"})[0]["services"])

    def sockets_of(self, service: str) -> list[state.SocketState]:
        answer, _ = self.request({"op": "sockets", "service": service})
        return [self.state(service, int(c)) for c in answer["cookies"]]

    def gc(self) -> list[state.SocketState]:
        return self.collect()[0]

    def collect(self) -> tuple[list[state.SocketState], str]:
        answer, _ = self.request({"op": "collect"})
        removed = [self.state(s, int(c)) for s, c in answer["removed"]]
        return removed, "your services' state, through the loader"

    def fd_call(self, name: str, fds: list[int], args: dict[str, Any]) -> Any:
        """A bpf_calls call the kernel refused us (before Linux 6.5), made by the loader."""
        answer, _ = self.request(
            {"op": "fd", "call": name, "args": {k: to_wire(v) for k, v in args.items()}}, fds
        )
        if "errno" in answer:  # what the kernel said to the loader, as if to us
            raise OSError(int(answer["errno"]), str(answer.get("why", "")))
        return from_wire(answer.get("result"))

    def load(
        self,
        rules: SocketRules,
        where: state.SocketState | None,
        label: str,
        listener: bool,
        sock: socket.socket | None = None,
    ) -> tuple[int, int]:
        """Compile and load a program for these rules (against the socket's pinned
        maps, if ``where``); its fd and id."""
        message: dict[str, Any] = {
            "op": "load",
            "rules": rules,  # in its wire form by send
            "label": label,
            "listener": listener,
        }
        if where is not None:
            message.update(service=where.service, cookie=where.cookie)
        answer, fds = self.request(message, [sock.fileno()] if sock is not None else [])
        self._pins.pop(where, None) if where is not None else None
        return fds[0], int(answer["program"])

    def check(self, rules: SocketRules, label: str) -> tuple[int, int]:
        """Have the loader compile and load a program for these rules as a start would,
        nothing pinned or attached (`alfwrapper check`): its fd and its maps' bytes.  An
        unpinned program's request carries its socket (the loader counts it against the
        quota by it): an unbound UDP socket, closed when the answer is in."""
        message = {"op": "load", "rules": rules, "label": label, "listener": False}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            answer, fds = self.request(message, [sock.fileno()])
        return fds[0], int(answer.get("map_bytes", 0))

    def load_filter(
        self,
        rules: SocketRules,
        where: state.SocketState | None,
        label: str,
        cookies: list[int],
        sock: socket.socket | None = None,
        env: Any = None,
    ) -> Any:
        """Store.load_filter, by the loader: the program's fd, and the plan's rules (no
        BCC module here; the loader filled the maps)."""
        from alfwrapper.bpf import compiler, program  # noqa: PLC0415

        fd, _ = self.load(rules, where, label, bool(cookies), sock)
        plan = program.ProgramPlan(
            rules=rules, text="", defines=(), include_dirs=(), parts=(), label=label
        )
        return compiler.LoadedFilter(tables=None, fd=fd, plan=plan)


def unavailable(path: str) -> AlfError:
    return AlfError(
        "loading the filter without CAP_BPF",
        f"the loader does not answer on {path}",
        "start it as root: systemctl enable --now alfwrapper-loader.socket "
        "(or run alfwrapper with CAP_BPF)",
        EX_UNAVAILABLE,
    )


def needed() -> bool:
    """Must this process go through the loader?  Yes when it may not create maps and
    load programs itself: without CAP_BPF (or CAP_SYS_ADMIN) where unprivileged BPF
    is disabled.  Where it is allowed, the built-in filters load directly."""
    from alfwrapper.host.capabilities import CAP_BPF, CAP_SYS_ADMIN  # noqa: PLC0415
    from alfwrapper.host.privileges import effective  # noqa: PLC0415

    if effective() & ((1 << CAP_BPF) | (1 << CAP_SYS_ADMIN)):
        return False
    return bpf_calls.unprivileged_bpf_disabled() != 0  # unknown: as the strict setting


def use_if_needed() -> bool:
    """Use the loader's store for this process when it cannot do the work itself."""
    if not needed():
        return False
    broker = Broker()
    state.use_store(broker)
    bpf_calls.use_fd_proxy(broker.fd_call)
    return True
