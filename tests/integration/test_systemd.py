"""The shipped units under a real systemd manager (systemd --user in the server's namespace)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hosts import CLIENT, Host, Network, Probe, all_probes, check_policy
from managers import ALFWRAPPER, UNITS, UnitLog, UserManager, installed_unit, wait_until
from support import ROOT


def test_units_verify(tmp_path: Path) -> None:
    """Every shipped unit verifies as it is (templates too), and every service's exposure
    in `systemd-analyze security` is at most 3.0."""
    units = [*UNITS.iterdir(), *(ROOT / "examples/lighttpd").glob("*.s*"),
             ROOT / "examples/alfwrapper@8084.socket"]  # fmt: skip
    # The gallery's daemons run as root where they need to (sshd, in.tftpd): they
    # verify, but their exposure is the daemon's own.
    gallery = sorted((ROOT / "examples/units").iterdir())
    for unit in [*units, *gallery]:
        # Our paths only: the settings are as shipped.
        text = unit.read_text().replace("/usr/bin/alfwrapper", ALFWRAPPER)
        (tmp_path / unit.name).write_text(text)
    for service in sorted(tmp_path.glob("*.service")):
        if any(service.name == unit.name for unit in gallery):
            continue
        out = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(service)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout)
        assert level and float(level.group(1)) <= 3.0, (service.name, out.stdout[-300:])
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(map(str, tmp_path.iterdir()))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.strip() == "", out.stderr


def test_on_demand_activation(network: Network, manager: UserManager) -> None:
    a, b = network.allowed, network.denied
    log = UnitLog(manager.log_to_file("alfwrapper-echo.service"))
    manager.run("daemon-reload")
    manager.run("start", "alfwrapper-echo.socket")
    assert (
        manager.run("is-active", "alfwrapper-echo.service", check=False).stdout.strip()
        == "inactive"
    )
    # The first connection starts the service, and is served.
    assert a.probe("tcp", 4, 8080, "first", timeout=20) == "echo", log.output()
    assert log.received("tcp", a.v4, "first")
    check_policy(log, served=all_probes(a, 8080, 8080), dropped=all_probes(b, 8080, 8080))
    # The service runs with no capability at all, and no_new_privs.
    pid = manager.run("show", "-p", "MainPID", "--value", "alfwrapper-echo.service").stdout
    status = Path(f"/proc/{pid.strip()}/status").read_text()
    for field in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert re.search(rf"^{field}:\s+0+$", status, re.M), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M)


def start_echo(manager: UserManager, client: Host) -> UnitLog:
    """Start the shipped echo socket; the client's first connection activates the service."""
    log = UnitLog(manager.log_to_file("alfwrapper-echo.service"))
    manager.run("daemon-reload")
    manager.run("start", "alfwrapper-echo.socket")
    assert client.probe("tcp", 4, 8080, "first", timeout=20) == "echo", log.output()
    return log


def test_administrator_drop_in_changes_the_shipped_policy(
    network: Network, manager: UserManager
) -> None:
    # The shipped unit names the shipped policy (--policy alfwrapper-echo); an
    # administrator changes it with a drop-in, never touching the vendor file.
    a, b = network.allowed, network.denied
    unit = "alfwrapper-echo.service"
    log = start_echo(manager, a)
    check_policy(log, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
    vendor = (ROOT / "policies/alfwrapper-echo.toml").read_text()
    dropin = manager.policies / "alfwrapper-echo.toml.d"
    dropin.mkdir()
    (dropin / "50-local.toml").write_text(
        "# this site: the 198.51.100.0/24 office too, but not that one host\n"
        'allow = ["198.51.100.0/24"]\ndeny = ["2001:db8:a::2"]\n'
    )
    manager.run("restart", unit)  # the socket stays; the new start fills its slot
    assert b.probe("tcp", 4, 8080, "after", timeout=20) == "echo", log.output()
    check_policy(
        log,
        served=[Probe(a, "tcp", 4, 8080), Probe(b, "tcp", 4, 8080)],
        dropped=[Probe(a, "tcp", 6, 8080), Probe(b, "tcp", 6, 8080)],
    )
    assert (ROOT / "policies/alfwrapper-echo.toml").read_text() == vendor


def hammer(host: Host, proto: str, port: int, tag: str, count: int) -> list[str]:
    """count probes, 8 at a time, each with a 1 s timeout: bounded in count and time."""

    def one(i: int) -> str:
        fam = 4 if i % 2 else 6
        target = host.server_v4 if fam == 4 else host.server_v6
        out = subprocess.run(
            host.command(
                [sys.executable, str(CLIENT), proto, target, str(port), f"{tag}-{i}", "1"]
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip()

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_activation_race(network: Network, manager: UserManager, proto: str) -> None:
    # Denied and allowed hosts hammer the socket while the service starts.
    a, b = network.allowed, network.denied
    log = UnitLog(manager.log_to_file("alfwrapper-echo.service"))
    manager.run("daemon-reload")
    manager.run("start", "alfwrapper-echo.socket")
    with ThreadPoolExecutor(2) as pool:
        denied = pool.submit(hammer, b, proto, 8080, "denied", 24)
        time.sleep(0.05)  # the denied host gets in first: it triggers the activation
        allowed = pool.submit(hammer, a, proto, 8080, "allowed", 24)
        results_b, results_a = denied.result(), allowed.result()
    assert not any(f"denied-{i}" in log.output() for i in range(24)), log.output()
    assert "echo" not in results_b
    assert results_a.count("echo") > 0, results_a
    # After activation everything is as usual.
    check_policy(log, served=[Probe(a, proto, 4, 8080)], dropped=[Probe(b, proto, 4, 8080)])


def test_named_sockets(network: Network, manager: UserManager) -> None:
    a, b = network.allowed, network.denied
    log = UnitLog(manager.log_to_file("alfwrapper-multi.service"))
    manager.run("daemon-reload")
    manager.run("start", "alfwrapper-multi-web.socket", "alfwrapper-multi-admin.socket")
    assert a.probe("tcp", 4, 8081, "first", timeout=20) == "echo", log.output()
    check_policy(
        log,
        served=[Probe(b, "tcp", 4, 8081), Probe(a, "tcp", 4, 8082)],
        dropped=[Probe(b, "tcp", 4, 8082), Probe(b, "tcp", 6, 8082)],
    )
    assert "names=web:admin" in log.output() or "names=admin:web" in log.output()


def test_accept_yes(network: Network, manager: UserManager) -> None:
    a, b = network.allowed, network.denied
    log = UnitLog(manager.log_to_file("alfwrapper-echo-accept@.service"))
    manager.run("daemon-reload")
    manager.run("start", "alfwrapper-echo-accept.socket")
    assert a.probe("tcp", 4, 8083, "accepted", timeout=20) == "echo", log.output()
    assert log.received("tcp", a.v4, "accepted")
    # systemd accepts the denied peer too; alfwrapper resets it before the service starts.
    result = b.probe("tcp", 4, 8083, "denied", timeout=5)
    assert result != "echo"
    deadline = time.monotonic() + 10
    while f"denied and reset; {sys.executable} not started" not in log.output():
        assert time.monotonic() < deadline, log.output()
        time.sleep(0.05)
    assert "denied" not in " ".join(
        line for line in log.output().splitlines() if line.startswith(("tcp ", "udp "))
    )


def test_accept_yes_refuses_knocking(network: Network, manager: UserManager) -> None:
    dropin = manager.units / "alfwrapper-echo-accept@.service.d"
    dropin.mkdir()
    (dropin / "knock.conf").write_text(
        f"[Service]\nExecStart=\nExecStart={ALFWRAPPER} --knock 7001,7002 -- "
        f"{sys.executable} {ROOT}/examples/echo_server.py\n"
    )
    log = UnitLog(manager.log_to_file("alfwrapper-echo-accept@.service"))
    manager.run("daemon-reload")
    manager.run("start", "alfwrapper-echo-accept.socket")
    assert network.allowed.probe("tcp", 4, 8083, "x", timeout=5) != "echo"
    deadline = time.monotonic() + 10
    while "knocking cannot check a connection" not in log.output():
        assert time.monotonic() < deadline, log.output()
        time.sleep(0.05)
    assert "ready fds" not in log.output()


def test_a_socket_filtered_under_another_name_names_its_socket_unit(
    network: Network, manager: UserManager
) -> None:
    """The service restarted under another --service name finds its inherited socket
    filtered under the first: the one line says which socket unit to restart."""
    unit = "alfwrapper-echo.service"
    log = UnitLog(manager.log_to_file(unit))
    manager.run("start", "alfwrapper-echo.socket")
    assert network.allowed.probe("tcp", 4, 8080, "first", timeout=20) == "echo", log.output()
    start = f"{ALFWRAPPER} --service renamed --policy alfwrapper-echo"
    echo = f"{sys.executable} {ROOT}/examples/echo_server.py"
    set_unit(manager, unit, f"ExecStart=\nExecStart={start} -- {echo}")
    manager.run("restart", unit, check=False)
    wait_until(lambda: "did not attach" in log.output(), "no refusal in the log", 30)
    line = next(x for x in log.output().splitlines() if "did not attach" in x)
    assert "for service renamed" in line, line
    assert "run systemctl --user restart alfwrapper-echo.socket" in line, line


def test_template_instance(network: Network, manager: UserManager) -> None:
    a, b = network.allowed, network.denied
    env = manager.config / "alfwrapper"
    env.mkdir(exist_ok=True)
    (env / "8084.env").write_text(
        installed_unit((ROOT / "examples/alfwrapper-instance.env").read_text())
    )
    socket = ROOT / "examples/alfwrapper@8084.socket"
    (manager.units / socket.name).write_text(socket.read_text())
    log = UnitLog(manager.log_to_file("alfwrapper@8084.service"))
    manager.run("daemon-reload")
    manager.run("start", "alfwrapper@8084.socket")
    assert a.probe("tcp", 4, 8084, "first", timeout=20) == "echo", log.output()
    check_policy(log, served=all_probes(a, 8084), dropped=all_probes(b, 8084))


def set_policy(manager: UserManager, rules: str, clear: bool = False) -> None:
    """Change the echo service's rules as an administrator would: policy drop-ins (the
    first, if asked, clears the vendor's allow list: `allow = []`)."""
    dropin = manager.policies / "alfwrapper-echo.toml.d"
    dropin.mkdir(exist_ok=True)
    (dropin / "40-clear.toml").write_text("allow = []\n" if clear else "")
    (dropin / "50-test.toml").write_text(rules)


def set_unit(manager: UserManager, unit: str, settings: str) -> None:
    dropin = manager.units / f"{unit}.d"
    dropin.mkdir(exist_ok=True)
    (dropin / "settings.conf").write_text(f"[Service]\n{settings}\n")
    manager.run("daemon-reload")


def main_pid(manager: UserManager, unit: str) -> int:
    return int(manager.run("show", "-p", "MainPID", "--value", unit).stdout.strip())


# The vendor policy allows A's networks; these replace that, in a drop-in.
ONLY_A = 'allow = ["192.0.2.0/24", "2001:db8:a::/48"]\n'
ONLY_B = 'allow = ["198.51.100.0/24", "2001:db8:b::/48"]\n'


def test_restarts_and_idle_exits_keep_the_current_rules(
    network: Network, manager: UserManager
) -> None:
    """The shipped plain pair (no PartOf=, no fd store): after each way a service can
    end and start again while its socket stays, the rules of the new start are in force
    on the same socket, and the socket's dispatcher is never replaced."""
    a, b = network.allowed, network.denied
    unit = "alfwrapper-echo.service"
    log = UnitLog(manager.log_to_file(unit))
    set_unit(manager, unit, "Restart=always\nRestartSec=100ms\nEnvironment=ECHO_IDLE_EXIT=3")
    manager.run("start", "alfwrapper-echo.socket")
    assert a.probe("tcp", 4, 8080, "first", timeout=20) == "echo", log.output()
    dispatchers = set(manager_state_dirs())
    for turn, way in enumerate(("systemctl restart", "kill -9", "idle exit", "socket restart")):
        inside, outside = (b, a) if turn % 2 == 0 else (a, b)  # the rules change each time
        set_policy(manager, ONLY_B if inside is b else ONLY_A, clear=True)
        starts = log.output().count("ready fds")
        pid = main_pid(manager, unit)
        if way == "systemctl restart":
            manager.run("restart", unit)
        elif way == "kill -9":
            os.kill(pid, 9)  # Restart=always starts it again
        elif way == "idle exit":
            wait_until(lambda: "idle: exiting" in log.output(), "no idle exit", 30)
            wait_until(
                lambda: manager.run("is-active", unit, check=False).stdout.strip() != "active",
                "still active",
            )
            # Exit status 0: no restart; the next connection activates it again.
            assert inside.probe("tcp", 4, 8080, "wake", timeout=20) == "echo", log.output()
        else:
            manager.run("restart", "alfwrapper-echo.socket")  # a new socket
            assert inside.probe("tcp", 4, 8080, "wake", timeout=20) == "echo", log.output()
        wait_until(
            lambda n=starts: log.output().count("ready fds") > n,  # type: ignore[misc]
            lambda w=way: (
                f"{w}: no new start: {log.output()}"  # type: ignore[misc]
                + manager.run("status", unit, "alfwrapper-echo.socket", check=False).stdout
            ),
        )
        assert "alfwrapper:" not in log.output().split("ready fds")[-1], log.output()
        check_policy(
            log, served=all_probes(inside, 8080, 8080), dropped=all_probes(outside, 8080, 8080)
        )
        now = set(manager_state_dirs())
        if way == "socket restart":
            assert now != dispatchers, "a new socket gets new state"
        else:
            assert now == dispatchers, f"{way}: the kept sockets keep their state"
        dispatchers = now
    assert manager.run("is-failed", unit, check=False).stdout.strip() != "failed"


def manager_state_dirs() -> list[str]:
    folder = Path("/sys/fs/bpf/alfwrapper/alfwrapper-echo")
    return sorted(p.name for p in folder.glob("sock-*")) if folder.exists() else []


def test_reload_changes_rules_without_restarting(network: Network, manager: UserManager) -> None:
    a, b = network.allowed, network.denied
    unit = "alfwrapper-echo.service"
    log = start_echo(manager, a)
    pid = main_pid(manager, unit)
    # A long-lived connection, open across the reload: one line a second.
    long_client = subprocess.Popen(
        a.command([sys.executable, str(ROOT / "tests/integration/steady_client.py"),
                   a.server_v4, "8080", "6"]),
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    wait_until(lambda: "long-1" in log.output(), "the long connection did not start")
    set_policy(manager, 'allow = ["198.51.100.0/24"]\ndeny = ["2001:db8:a::2"]\n')
    out = manager.run("reload", unit, check=False)
    assert out.returncode == 0, out.stderr + log.output()
    assert main_pid(manager, unit) == pid, "reload restarted the application"
    check_policy(
        log,
        served=[Probe(b, "tcp", 4, 8080), Probe(a, "tcp", 4, 8080)],
        dropped=[Probe(a, "tcp", 6, 8080), Probe(b, "tcp", 6, 8080)],
    )
    result, _ = long_client.communicate(timeout=60)
    assert result.split() == ["sent", "6", "echoed", "6"], (result, log.output())
    assert "long-6" in log.output()
    assert main_pid(manager, unit) == pid


JOURNALD = "/lib/systemd/systemd-journald"


@pytest.fixture
def journal() -> Iterator[None]:
    """systemd-journald, as on a systemd host (here PID 1 is not systemd, so nothing
    runs it): started for the test, and gone after it with its files, so that other
    tests see a host without a journal."""
    if not Path(JOURNALD).exists():
        pytest.fail("systemd-journald is missing: `make setup` installs systemd")
    from alfwrapper.droplog import journald_present

    assert not journald_present(), "a journal already runs here"
    proc = subprocess.Popen([JOURNALD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(journald_present, "systemd-journald did not come up", 20)
        yield
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree("/run/systemd/journal", ignore_errors=True)
        shutil.rmtree("/run/log/journal", ignore_errors=True)


def journal_entries(*matches: str) -> list[dict[str, str]]:
    out = subprocess.run(["journalctl", "--no-pager", "-o", "json", *matches],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_drops_go_to_the_journal_under_the_unit(
    network: Network, journal: None, manager: UserManager
) -> None:
    a, b = network.allowed, network.denied
    set_policy(manager, "log-drops = 1000\n")
    # /run here is a plain directory on /, which the unit's sandbox (ProtectControlGroups=)
    # covers with a fresh tmpfs; under a system manager /run is a mount and journald's
    # socket stays in view.  Put it in view, as it would be.
    set_unit(manager, "alfwrapper-echo.service", "BindReadOnlyPaths=/run/systemd/journal")
    log = start_echo(manager, a)
    check_policy(log, served=[Probe(a, "udp", 4, 8080)],
                 dropped=[Probe(b, "udp", 4, 8080), Probe(b, "tcp", 6, 8080)])  # fmt: skip
    unit = "alfwrapper-echo.service"

    def drops() -> list[dict[str, str]]:
        return journal_entries("-u", unit, "ALF_SERVICE=alfwrapper-echo")

    wait_until(lambda: {e.get("ALF_SRC") for e in drops()} >= {b.v4, b.v6},
               lambda: f"journal: {journal_entries('ALF_SERVICE=alfwrapper-echo')}")  # fmt: skip
    for entry in drops():
        assert entry["ALF_REASON"] == "subnets", entry
        assert entry["ALF_SOCKET"] == "echo" and entry["ALF_PORT"] == "8080", entry
        assert entry["_SYSTEMD_UNIT"] == unit, entry
        assert entry["ALF_INTERFACE"] == b.server_if, entry
        assert entry["ALF_SRC"] in (b.v4, b.v6), entry
    protocols = {e["ALF_PROTOCOL"] for e in drops()}
    assert protocols == {"udp", "tcp"}, protocols
    # The allowed client's traffic is not in the drop log.
    assert not journal_entries(f"ALF_SRC={a.v4}") and not journal_entries(f"ALF_SRC={a.v6}")
    # The forwarder keeps CAP_BPF alone (the unit bounds its capabilities, so it
    # cannot switch to the user alfwrapper: it stays the service's user), and lives
    # in the unit's cgroup.
    forwarder = status_json()["sockets"][0]["forwarder"]
    assert forwarder, "no forwarder"
    proc_status = Path(f"/proc/{forwarder}/status").read_text()
    assert re.search(rf"^CapEff:\s+0*{1 << 39:x}$", proc_status, re.M), proc_status
    assert re.search(r"^NoNewPrivs:\s+1$", proc_status, re.M)
    assert unit in Path(f"/proc/{forwarder}/cgroup").read_text()
    # One started by a reload from an administrator's shell joins the unit's cgroup too.
    os.kill(forwarder, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{forwarder}").exists(), "the forwarder lives on")
    policies = {"ALFWRAPPER_POLICY_PATH": f"{manager.policies}:{ROOT}/policies"}
    out = subprocess.run([ALFWRAPPER, "reload", "alfwrapper-echo"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **policies})  # fmt: skip
    assert out.returncode == 0, out.stderr
    again = status_json()["sockets"][0]["forwarder"]
    assert again and again != forwarder
    check_policy(log, served=[], dropped=[Probe(b, "udp", 6, 8080)])
    wait_until(lambda: any(e["_PID"] == str(again) and e["ALF_SRC"] == b.v6 for e in drops()),
               lambda: f"journal: {journal_entries('ALF_SERVICE=alfwrapper-echo')}")  # fmt: skip
    # It ends with the application.
    manager.run("stop", unit)
    wait_until(lambda: not Path(f"/proc/{again}").exists(), "the forwarder outlived the unit")


def status_json(service: str = "alfwrapper-echo") -> dict[str, Any]:
    """The service's status, with each socket's meta (forwarder, watcher) beside it."""
    out = subprocess.run([ALFWRAPPER, "status", service, "--json"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["services"][0]
    from alfwrapper import state

    for sock in report["sockets"]:
        sock.update(forwarder=state.read_meta(state.SocketState(service, sock["cookie"]))
                    .get("forwarder", 0))  # fmt: skip
    return report


def test_status_counts_across_restarts_and_idle_exits(
    network: Network, manager: UserManager
) -> None:
    a, b = network.allowed, network.denied
    unit = "alfwrapper-echo.service"
    log = start_echo(manager, a)
    check_policy(log, served=[Probe(a, "udp", 4, 8080)], dropped=[Probe(b, "udp", 4, 8080)])

    def udp() -> dict[str, Any]:
        return next(s for s in status_json()["sockets"] if s["protocol"] == "udp")

    before = udp()
    assert before["pid"] == main_pid(manager, unit)
    assert before["counters"]["passed"] >= 1 and before["counters"]["dropped"]["subnets"] >= 1
    manager.run("stop", unit)  # as an idle exit: the socket unit stays
    stopped = udp()
    assert stopped["pid"] is None
    assert stopped["counters"] == before["counters"]  # read from the pinned state
    # The next datagram starts the service again; the counting goes on from there.
    check_policy(log, served=[Probe(a, "udp", 4, 8080)], dropped=[Probe(b, "udp", 4, 8080)])
    after = udp()
    assert after["pid"] == main_pid(manager, unit) and after["cookie"] == before["cookie"]
    assert after["counters"]["passed"] > before["counters"]["passed"]
    assert after["counters"]["dropped"]["subnets"] > before["counters"]["dropped"]["subnets"]


def test_metrics_timer_writes_the_textfile(network: Network, manager: UserManager) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    start_echo(manager, network.allowed)
    manager.run("start", "alfwrapper-metrics.timer")
    target = manager.textfile / "alfwrapper.prom"
    wait_until(target.exists, lambda: manager.run("status", "alfwrapper-metrics.service",
                                                  check=False).stdout)  # fmt: skip
    families = {f.name: f for f in text_string_to_metric_families(target.read_text())}
    passed = [s for s in families["alfwrapper_packets"].samples
              if s.labels["service"] == "alfwrapper-echo" and s.labels["verdict"] == "pass"
              and s.labels["protocol"] == "tcp"]  # fmt: skip
    assert passed and passed[0].value >= 1, passed
