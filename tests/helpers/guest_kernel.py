"""The kernel tier: every program alfwrapper generates, checked by the verifier of
each kernel the README names: Debian 12's own 6.1 and Debian 13's own 6.12 (booted
in qemu) and the host's.

Compiling under an emulated CPU takes about a minute a program, and it is the
verifier that is under test, so the programs are compiled on the host, where the
real wrapper runs each case with record_bpf.so preloaded (every BPF_PROG_LOAD it
makes is written down with its maps' shapes).  Then replay_bpf.c, built static,
loads those recordings again, once per mode (a set of capabilities): on the host
directly, and in Debian's kernel as the only process of an initramfs (qemu with
TCG: /dev/kvm here is nested PVM, which cannot boot Debian's kernel).  One boot
takes about 7 s.  Debian 13's kernel is the one in the boot tier's trixie image
(tests/boot/guest.sh kernel), built once.

Everything built or fetched goes under build/kernel-tier (the kernel package is
cached there by its version).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PROGRAMS = ROOT / "tests" / "programs"  # the recorder and the replayer
BUILD = Path(os.environ.get("ALF_KERNEL_TIER_DIR", ROOT / "build/kernel-tier"))
CAPABILITIES = {  # capability(7) numbers, as units name them
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_NET_BIND_SERVICE": 10,
    "CAP_NET_ADMIN": 12,
    "CAP_SYS_CHROOT": 18,
    "CAP_SYS_ADMIN": 21,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}


@dataclass(frozen=True)
class Mode:
    """A way a program is loaded: the capabilities its loader holds (None: all root's)."""

    name: str
    unit: str | None  # the shipped unit whose AmbientCapabilities= this is

    def mask(self) -> int | None:
        if self.unit is None:
            return None
        text = (ROOT / "units" / self.unit).read_text()
        found = re.search(r"^AmbientCapabilities=(.*)$", text, re.M)
        assert found, f"{self.unit} has no AmbientCapabilities="
        return sum(1 << CAPABILITIES[name] for name in found.group(1).split())


# As root (`alfwrapper doctor`, a root service), as the shipped units load (CAP_BPF
# and file capabilities, no CAP_PERFMON: the verifier keeps its protections for
# unprivileged programs), and as the loader does for ordinary users (CAP_BPF alone).
MODES = (
    Mode("root", None),
    Mode("unit", "alfwrapper-echo.service"),
    Mode("loader", "alfwrapper-loader.service"),
)


@dataclass(frozen=True)
class Outcome:
    mode: str
    case: str
    index: int
    name: str
    ok: bool
    detail: str
    log: tuple[str, ...] = ()


def build_tools() -> tuple[Path, Path]:
    """record_bpf.so and the static replayer, built from their C here."""
    BUILD.mkdir(parents=True, exist_ok=True)
    recorder, replayer = BUILD / "record_bpf.so", BUILD / "replay_bpf"
    for out, source, flags in (
        (recorder, "record_bpf.c", ["-shared", "-fPIC", "-ldl"]),
        (replayer, "replay_bpf.c", ["-static"]),
    ):
        src = PROGRAMS / source
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            subprocess.run(
                ["gcc", "-O2", "-Wall", "-Werror", "-o", str(out), str(src), *flags],
                check=True,
                capture_output=True,
                text=True,
            )
    return recorder, replayer


# The Debian releases whose own kernels' verifiers are under test, and what each
# kernel's release starts with.
RELEASES = {"debian12": "6.1.", "debian13": "6.12."}


def debian_kernel(release: str) -> Path:
    """vmlinuz of a Debian release's own kernel."""
    if release == "debian12":
        return bookworm_kernel()
    out = subprocess.run(
        [str(ROOT / "tests/boot/guest.sh"), "kernel"],
        env={**os.environ, "GUEST_SUITE": "trixie"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, f"guest.sh kernel: {out.stderr[-3000:]}"
    return Path(out.stdout.strip())


def bookworm_kernel() -> Path:
    """vmlinuz of Debian 12's kernel, the release whose headers BCC compiles against
    here (linux-headers-amd64's), fetched from the archive once and cached."""
    depends = subprocess.run(
        ["dpkg-query", "-W", "-f=${Depends}", "linux-headers-amd64"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"linux-headers-(\d[^\s,()]*-amd64)", depends)
    assert match, f"linux-headers-amd64 depends on no headers package: {depends!r}"
    release = match.group(1)
    kernel = BUILD / "kernels" / f"vmlinuz-{release}"
    if kernel.exists():
        return kernel
    kernel.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=kernel.parent) as tmp:
        os.chmod(tmp, 0o755)  # apt's sandbox user writes the download here
        subprocess.run(
            ["apt-get", "download", f"linux-image-{release}"],
            cwd=tmp,
            check=True,
            capture_output=True,
            text=True,
        )
        (deb,) = Path(tmp).glob("linux-image-*.deb")
        tar = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp, f"./boot/vmlinuz-{release}"], input=tar, check=True)
        shutil.move(Path(tmp) / "boot" / f"vmlinuz-{release}", kernel)
    return kernel


def mode_lines() -> str:
    lines = []
    for mode in MODES:
        mask = mode.mask()
        lines.append(f"{mode.name} {'all' if mask is None else format(mask, 'x')}\n")
    return "".join(lines)


def parse(console: str) -> tuple[str, list[Outcome]]:
    """The kernel release and one outcome per program and mode, from the replayer's lines."""
    release = ""
    outcomes: list[Outcome] = []
    logs: dict[tuple[str, str, int], list[str]] = {}
    for raw in console.splitlines():
        line = raw.strip("\r")
        if line.startswith("ALFK-KERNEL "):
            release = line.split(" ", 1)[1].strip()
        elif line.startswith("ALFKLOG "):
            head, _, text = line.partition(": ")
            _, mode, case, index = head.split(" ")
            logs.setdefault((mode, case, int(index)), []).append(text)
        elif line.startswith("ALFK "):
            parts = line.split(" ", 6)
            mode, case, index, name, verdict = parts[1:6]
            detail = parts[6] if len(parts) > 6 else ""
            outcomes.append(Outcome(mode, case, int(index), name, verdict == "ok", detail))
    with_logs = [
        dataclasses.replace(o, log=tuple(logs.get((o.mode, o.case, o.index), ()))) for o in outcomes
    ]
    assert "ALFK-DONE" in console, "the replayer did not finish:\n" + console[-3000:]
    return release, with_logs


def stage(recordings: Path, into: Path) -> None:
    """A replayer's working directory: progs/ and modes."""
    (into / "progs").mkdir(parents=True, exist_ok=True)
    for rec in sorted(recordings.glob("*.rec")):
        shutil.copy(rec, into / "progs" / rec.name)
    (into / "modes").write_text(mode_lines())


def replay_here(recordings: Path) -> tuple[str, list[Outcome]]:
    """The recordings through this host's verifier."""
    _, replayer = build_tools()
    with tempfile.TemporaryDirectory() as tmp:
        stage(recordings, Path(tmp))
        out = subprocess.run([str(replayer)], cwd=tmp, capture_output=True, text=True, timeout=600)
    return parse(out.stdout)


def replay_in_debian(
    recordings: Path, release: str, timeout: float = 600
) -> tuple[str, list[Outcome]]:
    """The recordings through a Debian release's own kernel (RELEASES): its vmlinuz and
    an initramfs whose /init is the replayer, under qemu (TCG)."""
    _, replayer = build_tools()
    kernel = debian_kernel(release)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        root = Path(tmp) / "initramfs"
        stage(recordings, root)
        shutil.copy(replayer, root / "init")
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        initrd = Path(tmp) / "initrd.cpio"
        with initrd.open("wb") as out:
            subprocess.run(
                ["cpio", "-o", "-H", "newc", "--quiet"],
                cwd=root,
                check=True,
                input="\n".join(files).encode(),
                stdout=out,
            )
        console = Path(tmp) / "console.log"
        accel = "tcg,thread=multi"
        subprocess.run(
            ["qemu-system-x86_64", "-machine", "q35", "-accel", accel, "-cpu", "max",
             "-smp", "2", "-m", "2048", "-nodefaults", "-no-user-config", "-display", "none",
             "-kernel", str(kernel), "-initrd", str(initrd),
             "-append", "console=ttyS0 panic=-1 quiet", "-serial", f"file:{console}",
             "-no-reboot"],
            check=True, timeout=timeout, capture_output=True,
        )  # fmt: skip
        return parse(console.read_text(errors="replace"))
