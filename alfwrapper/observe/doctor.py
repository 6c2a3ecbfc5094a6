"""``alfwrapper doctor``: check that this host can compile, load and attach filters.

Each check prints one line: ``ok`` with what it found, or ``problem`` with
what is wrong and how to fix it.  The last check builds the real subnet filter
through the same code path as the wrapper.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from alfwrapper.errors import EX_UNAVAILABLE, LIBRARIES, AlfError
from alfwrapper.host import bpf_calls, frames, kernel_headers
from alfwrapper.host.capabilities import CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN
from alfwrapper.policy.prefixes import parse_prefix
from alfwrapper.policy.rules import SocketRules, SubnetRules
from alfwrapper.record import Record

MIN_KERNEL = (5, 6)  # BPF_MAP_UPDATE_BATCH; bpf_skb_load_bytes_relative is 4.18


class Check(Record):
    ok: bool
    text: str


def kernel_version(release: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def effective_capabilities(status: str) -> int:
    """CapEff from /proc/<pid>/status, as a bit mask."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status, re.M)
    return int(match.group(1), 16) if match else 0


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def check_kernel() -> Check:
    release = platform.release()
    if kernel_version(release) < MIN_KERNEL:
        return Check(
            False,
            f"kernel {release} is older than {MIN_KERNEL[0]}.{MIN_KERNEL[1]}: upgrade the kernel",
        )
    return Check(True, f"kernel {release}")


# The platforms the project's tests run on (README: Requirements): each Debian release
# with its own kernel and the host's 6.18, and its systemd as PID 1.
TESTED = {
    "12": ("bookworm", ("6.1", "6.18"), "252"),
    "13": ("trixie", ("6.12", "6.18"), "257"),
}


def platform_check(os_release: str, release: str, systemd: str | None) -> Check:
    """Which platform this is, and whether the tests run on it (never a problem: a
    platform they do not run on may well work, but nothing is claimed for it)."""
    fields = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', os_release, re.M))
    name = fields.get("PRETTY_NAME") or fields.get("NAME") or "an unknown system"
    version = ".".join(map(str, kernel_version(release)))
    manager = f"systemd {systemd} as PID 1" if systemd else "no systemd as PID 1"
    text = f"{name}, kernel {release}, {manager}"
    tested = TESTED.get(fields.get("VERSION_ID", "")) if fields.get("ID") == "debian" else None
    if tested and version in tested[1]:
        if systemd == tested[2]:
            return Check(True, f"{text}: a platform the tests run on")
        return Check(
            True,
            f"{text}: a platform the tests run on (the units under systemd {tested[2]} as PID 1)",
        )
    return Check(
        True,
        f"{text}: not a platform the tests run on (Debian 12 and 13, each "
        "with its own kernel or 6.18), so nothing is claimed",
    )


def systemd_version() -> str | None:
    """PID 1's systemd version, where systemd is PID 1: sd_booted's /run/systemd/system,
    and PID 1's name where this process may see it (a unit's ProtectProc= may hide it)."""
    if not Path("/run/systemd/system").is_dir() or _read("/proc/1/comm") not in ("systemd", None):
        return None
    import subprocess  # noqa: PLC0415

    try:
        out = subprocess.run(
            ["systemctl", "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"systemd (\d+)", out)
    return match.group(1) if match else None


def check_platform() -> Check:
    return platform_check(_read("/etc/os-release") or "", platform.release(), systemd_version())


def check_bpf_syscall() -> Check:
    if not Path("/sys/fs/bpf").exists() and not Path("/proc/sys/kernel/bpf_stats_enabled").exists():
        return Check(
            False, "the kernel has no BPF syscall (CONFIG_BPF_SYSCALL): use a kernel built with it"
        )
    return Check(True, "BPF syscall present")


def check_jit() -> Check:
    value = _read("/proc/sys/net/core/bpf_jit_enable")
    if value is None and os.path.exists("/proc/sys/net/core/bpf_jit_enable"):
        return Check(True, "BPF JIT: only root may read net.core.bpf_jit_enable")
    if value is None and os.path.isdir("/proc/sys/net/core"):
        return Check(
            True,
            "BPF JIT: the host's setting applies (net.core.bpf_jit_enable "
            "is not shown inside a network namespace)",
        )
    if value is None:
        return Check(False, "cannot read net.core.bpf_jit_enable: is /proc mounted?")
    if value == "0":
        return Check(
            False,
            "the BPF JIT is off, filters run interpreted: sysctl -w net.core.bpf_jit_enable=1",
        )
    return Check(True, f"BPF JIT on (net.core.bpf_jit_enable={value})")


def check_privilege() -> Check:
    """Which way this user's filters get loaded, and whether that way works."""
    setting = bpf_calls.unprivileged_bpf_disabled()
    unpriv = None if setting is None else str(setting)
    caps = effective_capabilities(_read("/proc/self/status") or "")
    held = [
        name
        for bit, name in (
            (CAP_BPF, "CAP_BPF"),
            (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
            (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        )
        if caps >> bit & 1
    ]
    held_text = ", ".join(held) or "none of CAP_BPF, CAP_SYS_ADMIN, CAP_NET_ADMIN"
    if caps >> CAP_BPF & 1 or caps >> CAP_SYS_ADMIN & 1:
        return Check(True, f"loads filters itself (capabilities: {held_text})")
    if unpriv == "0":
        return Check(
            True,
            "loads the built-in filters itself: kernel.unprivileged_bpf_disabled=0 "
            f"(capabilities: {held_text}); knocking and pinned state need CAP_BPF",
        )
    return check_loader(unpriv, held_text)


def through_loader() -> bool:
    from alfwrapper.loader import client  # noqa: PLC0415

    return client.needed()


def check_loader(unpriv: str | None, held_text: str) -> Check:
    from alfwrapper.loader import client, protocol  # noqa: PLC0415

    why = f"kernel.unprivileged_bpf_disabled={unpriv} and this process holds {held_text}"
    try:
        refused = bpf_calls.fd_calls_refused()
    except OSError:
        refused = False  # no libbpf: check_imports says so
    if refused:
        why += (
            "; this kernel refuses even calls on fds one holds without CAP_BPF (as before "
            "Linux 6.5), so the loader makes those too"
        )
    try:
        # As long as any request: a loader that socket activation starts now may take
        # seconds to import (an emulated or loaded machine), and that is not a fault.
        limits, _ = client.Broker().request({"op": "limits"})
    except AlfError as err:
        return Check(False, f"{why}, so filters come from the loader: {err.why} ({err.hint})")
    return Check(
        True,
        f"loads filters through the loader ({protocol.socket_path()}): {why}; your "
        "services' pinned state is kept by the loader; " + loader_limits(limits),
    )


def loader_limits(limits: dict[str, object]) -> str:
    """What the loader enforces, as doctor says it to a user."""
    counted = (
        "counted by the kernel (a memory cgroup of yours)"
        if limits.get("counted_by_kernel")
        else "counted from your live sockets' maps only (no delegated memory controller)"
    )
    confined = (
        f"every compile is confined by Landlock (ABI {limits.get('landlock')})"
        if limits.get("landlock")
        else "Landlock is unavailable, so a filter of your own (--filter) is refused; the "
        "built-in ones work (boot with lsm=...,landlock to allow it)"
    )
    return (
        f"your quota: {limits.get('programs')} filtered sockets and "
        f"{limits.get('memory_mib')} MiB of memory, {counted}; {confined}"
    )


def check_headers() -> Check:
    release = platform.release()
    found = kernel_headers.find(release)
    if found is None:
        return Check(
            False,
            f"no kernel headers for {release} ({kernel_headers.searched()}): {kernel_headers.HINT}",
        )
    if not found.exact:
        return Check(
            True,
            f"kernel headers of {found.release} at {found.where} for {release} (a socket "
            "filter needs only the UAPI and basic types, which do not change)",
        )
    return Check(True, f"kernel headers at {found.where}")


# What each library is imported for; errors.LIBRARIES says which package has it.
IMPORTS = (
    ("bcc", "compiling and loading filters"),
    ("numpy", "the IPv4 subnet table"),
    ("pyroute2", "the queue check, gc and interfaces (netlink)"),
    ("seccomp", "denying bpf(2) to the application"),
    ("setproctitle", "the helper processes' names in ps"),
    ("systemd.daemon", "inherited sockets"),
    ("systemd.journal", "the drop log"),
)


def check_imports(imports: Sequence[tuple[str, str]] = IMPORTS) -> Check:
    missing = []
    for module, purpose in imports:
        try:
            importlib.import_module(module)
        except ImportError:
            package = LIBRARIES[module.split(".")[0]]
            missing.append(f"{module} ({purpose}: apt-get install {package})")
    if missing:
        return Check(
            False,
            f"missing Python modules: {'; '.join(missing)}; run alfwrapper with "
            "/usr/bin/python3 or a venv made from it with --system-site-packages",
        )
    return Check(True, f"Python modules {', '.join(m for m, _ in imports)} importable")


def check_state() -> Check:
    from alfwrapper import state  # noqa: PLC0415

    try:
        root = state.state_root(create=True)
    except AlfError as err:
        return Check(
            False,
            f"pinned state: {err.line().removeprefix('alfwrapper: ')}; without it, filters "
            "cannot be reloaded and restarts cannot re-filter their sockets",
        )
    return Check(True, f"pinned state in {root} (owned by {state.OWNER}, mode 700)")


def check_build() -> Check:
    from alfwrapper.bpf import compiler  # noqa: PLC0415

    try:
        compiler.load_rules(SocketRules(subnets=SubnetRules(allow=(parse_prefix("192.0.2.0/24"),))))
    except AlfError as err:
        return Check(False, err.line().removeprefix("alfwrapper: "))
    return Check(True, "a subnet filter compiles, loads and fills its maps")


def check_build_through_loader() -> Check:
    import socket  # noqa: PLC0415

    from alfwrapper.loader import client  # noqa: PLC0415

    rules = SocketRules(subnets=SubnetRules(allow=(parse_prefix("192.0.2.0/24"),)))
    client.use_if_needed()  # the test run, too, where the kernel refuses it to us
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            fd, _ = client.Broker().load(rules, None, "doctor_u0", False, sock)
            verdict = bpf_calls.prog_test_run(fd, frames.udp_frame(4, 0xC0000202)).retval
            os.close(fd)
    except (AlfError, OSError) as err:
        text = err.line() if isinstance(err, AlfError) else str(err)
        return Check(False, f"through the loader: {text.removeprefix('alfwrapper: ')}")
    if verdict == 0:
        return Check(False, "through the loader: the test filter dropped an allowed packet")
    return Check(True, "a subnet filter compiles and loads through the loader, and judges here")


CHECKS: tuple[Callable[[], Check], ...] = (
    check_platform,
    check_kernel,
    check_bpf_syscall,
    check_jit,
    check_privilege,
    check_headers,
    check_imports,
    check_state,
)
# Through the loader, compiling and pinned state are the loader's business.
LOADER_CHECKS: tuple[Callable[[], Check], ...] = (
    check_platform,
    check_kernel,
    check_bpf_syscall,
    check_jit,
    check_privilege,
    lambda: check_imports(IMPORTS[1:]),  # BCC runs in the loader, not here
)


def main() -> int:
    """`alfwrapper doctor` (its options: cli.observe.doctor_parser): every check, a line each."""
    loader = through_loader()
    results = [check() for check in (LOADER_CHECKS if loader else CHECKS)]
    if all(r.ok for r in results):
        results.append(check_build_through_loader() if loader else check_build())
    for r in results:
        print(f"{'ok' if r.ok else 'problem'}: {r.text}")
    return 0 if all(r.ok for r in results) else EX_UNAVAILABLE
