"""systemd managers for the tests: root's `systemd --user` with the shipped units, and
ordinary users' own `systemd --user` (PID 1 here is not systemd)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from helpers.hosts import Host, Service
from helpers.support import ROOT, loader_arguments

UNITS = ROOT / "units"
ALFWRAPPER = str(Path(sys.executable).parent / "alfwrapper")


# Settings root's `systemd --user` cannot apply on this machine (a unit with them fails
# with 226/NAMESPACE; they work under a system manager), and DynamicUser=, which only a
# system manager supports (PID 1 here is not systemd).  Everything else is as shipped.
NOT_HERE = (
    "DynamicUser",
    "ProtectHome",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
)


def installed_unit(text: str) -> str:
    """A shipped unit as installed here: our paths, without what cannot apply here."""
    text = text.replace("/usr/bin/alfwrapper", ALFWRAPPER)
    text = text.replace("/usr/share/alfwrapper/", f"{ROOT}/examples/")
    text = text.replace("/var/lib/alfwrapper-lighttpd", f"{ROOT}/examples/lighttpd")
    text = text.replace("/usr/bin/python3", sys.executable)
    return re.sub(rf"(?m)^({'|'.join(NOT_HERE)})=.*\n", "", text)


class Manager:
    """What both kinds of manager share: unit drop-ins, log files, stopping."""

    units: Path
    logs: Path
    proc: subprocess.Popen[bytes]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def own(self, path: Path) -> None:
        """Give a file to the manager's user (root's: nothing to do)."""

    def log_to_file(self, unit: str) -> Path:
        """A drop-in sending the unit's output to a file (no journal here), returned."""
        path = self.logs / f"{unit}.log"
        path.touch()
        self.own(path)
        dropin = self.units / f"{unit}.d"
        dropin.mkdir(exist_ok=True)
        (dropin / "log.conf").write_text(
            f"[Service]\nStandardOutput=append:{path}\nStandardError=append:{path}\n"
        )
        return path

    def exit(self) -> None:
        self.run("exit", check=False)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class UserManager(Manager):
    """`systemd --user` in the server's network namespace, with the shipped units."""

    def __init__(self, server: Host) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="alf-systemd-"))
        # What the services must see, as they would see /etc and /var/lib: not in /tmp
        # (the shipped units have PrivateTmp=).
        self.shared = Path(tempfile.mkdtemp(prefix="alf-systemd-", dir="/var/lib"))
        self.shared.chmod(0o755)
        self.runtime = self.root / "runtime"
        self.runtime.mkdir(mode=0o700)
        self.config = self.root / "config"
        self.units = self.config / "systemd" / "user"
        self.units.mkdir(parents=True)
        self.logs = self.root / "logs"
        self.logs.mkdir()
        self.textfile = self.shared / "textfile"  # node_exporter's folder, for the metrics unit
        self.textfile.mkdir()
        for unit in UNITS.iterdir():
            text = installed_unit(unit.read_text())
            text = text.replace("/var/lib/prometheus/node-exporter", str(self.textfile))
            (self.units / unit.name).write_text(text)
        Path("/run/systemd/system").mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "XDG_RUNTIME_DIR": str(self.runtime),
            "XDG_CONFIG_HOME": str(self.config),
        }
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{server.netns}", "systemd", "--user"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while self.run("is-system-running", check=False).stdout.strip() not in (
            "running",
            "degraded",
        ):
            assert self.proc.poll() is None, "systemd --user exited"
            assert time.monotonic() < deadline, "systemd --user did not come up"
            time.sleep(0.1)
        # The policies as installed: the administrator's folder first, then the shipped ones.
        self.policies = self.shared / "policy"
        self.policies.mkdir(parents=True)
        self.run("set-environment", f"ALFWRAPPER_POLICY_PATH={self.policies}:{ROOT}/policies")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemctl", "--user", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def stop(self) -> None:
        self.exit()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.shared, ignore_errors=True)


def start_loader(manager: UserManager, copy: Path, options: str = "") -> Path:
    """Start the shipped alfwrapper-loader.socket (with ``options`` added to the
    loader's command line); returns its log file.  The loader runs alfwrapper from
    ``copy`` (readable_copy) with the system Python: its user cannot read a checkout
    in root's home, and the unit has ProtectHome=."""
    dropin = manager.units / "alfwrapper-loader.service.d"
    dropin.mkdir(exist_ok=True)
    log = manager.logs / "alfwrapper-loader.log"
    shipped = loader_arguments()
    text = (
        f"[Service]\nStandardError=append:{log}\nEnvironment=PYTHONPATH={copy}\n"
        f"ExecStart=\nExecStart=/usr/bin/python3 -m alfwrapper loader {shipped} {options}\n"
    )
    (dropin / "here.conf").write_text(text)
    manager.run("daemon-reload")
    manager.run("stop", "alfwrapper-loader.service", "alfwrapper-loader.socket", check=False)
    manager.run("start", "alfwrapper-loader.socket")
    return log


class UnitLog(Service):
    """A unit's output file, read like a Service's."""

    def __init__(self, path: Path) -> None:  # no process of our own
        self.path = path

    def output(self) -> str:
        return self.path.read_text() if self.path.exists() else ""

    def errors(self) -> str:
        return self.output()


def wait_until(
    check: Callable[[], bool], what: Callable[[], str] | str, timeout: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def cgroup_mounts() -> list[str]:
    """The cgroup hierarchies a systemd manager keeps its units in (v2, and the v1
    name=systemd one of a hybrid layout)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, after = line.partition(" - ")
        kind, _, options = after.split()[:3]
        if kind == "cgroup2" or (kind == "cgroup" and "name=systemd" in options.split(",")):
            found.append(fields.split()[4])
    return found


def ordinary_user(name: str) -> int:
    """An ordinary user (made once, kept: tests may run again); their uid."""
    import pwd  # noqa: PLC0415

    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            timeout=60,
        )
        return pwd.getpwnam(name).pw_uid


class OwnManager(Manager):
    """An ordinary user's own `systemd --user`, in the server's network namespace, as
    a login would start it: their runtime directory, and a cgroup of theirs (what
    logind and user@.service delegate; here PID 1 is not systemd, so we do)."""

    def __init__(self, user: str, server: Host) -> None:
        import pwd  # noqa: PLC0415

        entry = pwd.getpwnam(user)
        self.user, self.uid, self.netns = user, entry.pw_uid, server.netns
        self.runtime = Path(f"/run/user/{self.uid}")
        self.runtime.mkdir(parents=True, exist_ok=True)
        os.chown(self.runtime, entry.pw_uid, entry.pw_gid)
        self.runtime.chmod(0o700)
        self.config = Path(tempfile.mkdtemp(prefix=f"alf-{user}-"))
        self.config.chmod(0o755)
        self.units = self.config / "systemd" / "user"
        self.units.mkdir(parents=True)
        self.logs = self.config / "logs"
        self.logs.mkdir()
        for path in [self.config, *self.config.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self.cgroups = [Path(m) / f"alf-user-{self.uid}" for m in cgroup_mounts()]
        enter = ""
        for group in self.cgroups:
            group.mkdir(exist_ok=True)
            for path in [group, *group.iterdir()]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
            enter += f"echo $$ > {group}/cgroup.procs; "
        self.env = [
            f"XDG_RUNTIME_DIR={self.runtime}",
            f"XDG_CONFIG_HOME={self.config}",
            f"HOME={entry.pw_dir}",
        ]
        self.proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{server.netns}",
                "sh",
                "-c",
                f"{enter}exec runuser -u {user} -- env {' '.join(self.env)} systemd --user",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(
            lambda: (
                self.run("is-system-running", check=False).stdout.strip() in ("running", "degraded")
            ),
            f"{user}'s systemd --user did not come up",
            30,
        )

    def command(self, argv: list[str]) -> list[str]:
        """argv run as the user, on the server (its network namespace), with their
        manager's environment."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "runuser", "-u", self.user, "--",
                "env", *self.env, *argv]  # fmt: skip

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(["systemctl", "--user", *args]),
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def install(self, name: str, text: str) -> None:
        path = self.units / name
        path.write_text(text)
        os.chown(path, self.uid, -1)

    def own(self, path: Path) -> None:
        os.chown(path, self.uid, -1)

    def stop(self) -> None:
        self.exit()
        subprocess.run(["pkill", "-KILL", "-u", self.user], check=False)
        for group in self.cgroups:
            for sub in [*sorted(group.rglob("*"), reverse=True), group]:
                if sub.is_dir():
                    try:
                        sub.rmdir()
                    except OSError:
                        pass  # a process the kill has not reaped yet: harmless
        shutil.rmtree(self.config, ignore_errors=True)
