"""The CrowdSec bouncer against a real Local API (Debian's crowdsec package, run here
offline with a private configuration and database): bans reach a service's deny set,
deletions lift them, and LAPI restarts and bouncer crashes lose nothing."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.hosts import Held, Network, Probe, Service, all_probes, check_policy, start_echo
from helpers.support import WRAPPER

from alfwrapper import sets
from alfwrapper.errors import AlfError
from alfwrapper.lifecycle import bouncer
from alfwrapper.lifecycle.bouncer import METRICS, read_metrics
from alfwrapper.policy.crowdsec import Book
from alfwrapper.policy.prefixes import parse_prefix

pytestmark = pytest.mark.netns

PACKAGE_CONFIG = Path("/etc/crowdsec/config.yaml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lapi:
    """crowdsec -no-cs (the Local API alone) on 127.0.0.1, from a copy of the package's
    configuration and database (which knows the local machine cscli logs in as)."""

    def __init__(self, folder: Path) -> None:
        import yaml  # noqa: PLC0415  (python3-yaml, which crowdsec's tests need alone)

        self.folder, self.port = folder, free_port()
        data = folder / "data"
        data.mkdir(parents=True)
        shutil.copy("/var/lib/crowdsec/data/crowdsec.db", data / "crowdsec.db")
        cfg = yaml.safe_load(PACKAGE_CONFIG.read_text())
        cfg["common"].update(daemonize=False, log_media="stdout", log_level="warning")
        cfg["config_paths"]["data_dir"] = str(data)
        cfg["db_config"]["db_path"] = str(data / "crowdsec.db")
        creds = yaml.safe_load(Path("/etc/crowdsec/local_api_credentials.yaml").read_text())
        creds["url"] = f"http://127.0.0.1:{self.port}"
        (folder / "credentials.yaml").write_text(yaml.safe_dump(creds))
        cfg["api"]["client"]["credentials_path"] = str(folder / "credentials.yaml")
        cfg["api"]["server"]["listen_uri"] = f"127.0.0.1:{self.port}"
        cfg["api"]["server"].pop("online_client", None)  # no Central API: offline
        cfg["prometheus"]["enabled"] = False
        self.config = folder / "config.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.folder / "lapi.log", "ab")
        self.proc = subprocess.Popen(
            ["crowdsec", "-c", str(self.config), "-no-cs"], stdout=log, stderr=log
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, (self.folder / "lapi.log").read_text()
                time.sleep(0.1)
        raise AssertionError("the LAPI did not listen within 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)

    def cscli(self, *argv: str) -> str:
        out = subprocess.run(
            ["cscli", "-c", str(self.config), *argv], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, (argv, out.stderr)
        return out.stdout


@pytest.fixture
def lapi(tmp_path: Path) -> Iterator[Lapi]:
    if shutil.which("crowdsec") is None or not PACKAGE_CONFIG.exists():
        pytest.fail("crowdsec is missing: `make setup` installs it")
    server = Lapi(tmp_path / "lapi")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Bouncer:
    def __init__(self, config: Path) -> None:
        self.config = config
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        argv = [*WRAPPER, "crowdsec", "--config", str(self.config)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def write_key(path: Path, key: str) -> None:
    """The key as docs/sets.md tells: mode 600 (the bouncer refuses one others may read)."""
    path.write_text(key)
    path.chmod(0o600)


def bouncer_config(lapi: Lapi, key: Path, name: str, interval: float, metrics: str) -> str:
    return (
        f'lapi-url = "http://127.0.0.1:{lapi.port}"\napi-key-file = "{key}"\nset = "{name}"\n'
        f'poll-interval = {interval}\nmetrics-file = "{metrics}"\n'
    )


def finish(bouncer: Bouncer, name: str) -> str:
    """Kill the bouncer, remove its set and metrics file; what it said (shown too)."""
    bouncer.kill()
    output = bouncer.proc.stdout.read() if bouncer.proc and bouncer.proc.stdout else ""
    print(output, file=sys.stderr)
    subprocess.run([*WRAPPER, "set", "destroy", name], capture_output=True, timeout=60)
    Path(METRICS).unlink(missing_ok=True)
    return output


def held(name: str, address: str) -> bool:
    prefix = parse_prefix(address)
    return sets.holding(name, prefix.family, prefix.value) is not None


def until(check: Callable[[], bool], seconds: float, what: str) -> float:
    """Seconds until check() holds (an AssertionError past ``seconds``)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, what
        time.sleep(0.01)
    return time.monotonic() - start


def test_bans_reach_a_service_and_survive_restarts(
    network: Network, services: list[Service], lapi: Lapi, tmp_path: Path
) -> None:
    a = network.allowed
    name = f"cs{os.getpid()}"
    key = tmp_path / "key"
    write_key(key, lapi.cscli("bouncers", "add", f"alfw{os.getpid()}", "-o", "raw"))
    config = tmp_path / "bouncer.toml"
    Path(METRICS).parent.mkdir(exist_ok=True)
    config.write_text(bouncer_config(lapi, key, name, 0.5, METRICS))
    bouncer = Bouncer(config)
    try:
        # A ban made before the bouncer starts comes in its startup answer.
        lapi.cscli("decisions", "add", "--range", "2001:db8:a::/48", "--duration", "1h")
        bouncer.start()
        until(lambda: sets.exists(name) and held(name, a.v6), 30, "the startup answer")
        svc = start_echo(network, services, f"{name}-svc", "--deny-set", name)
        check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(a, "tcp", 6, 8080)])
        open_connection = Held(a, 4, 8080)
        try:
            lapi.cscli("decisions", "add", "--ip", a.v4, "--duration", "1h")
            took = until(lambda: held(name, a.v4), 10, "a new ban")
            print(f"a ban reached the set {took:.3f} s after cscli returned (poll 0.5 s)")
            # ... and the banned host's open connection is reset (lifecycle/cut.py).
            assert open_connection.ended(timeout=1.0)[:1] == ["reset"]
        finally:
            open_connection.stop()
        check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080), Probe(a, "udp", 4, 8081)])
        lapi.cscli("decisions", "delete", "--ip", a.v4)
        until(lambda: not held(name, a.v4), 10, "a deletion")
        check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(a, "tcp", 6, 8080)])
        # The LAPI restarts: polls fail meanwhile, and the set keeps what it had.
        lapi.stop()
        time.sleep(1.5)
        assert held(name, a.v6)
        lapi.start()
        lapi.cscli("decisions", "add", "--ip", a.v4, "--duration", "1h")
        until(lambda: held(name, a.v4), 15, "a ban after the LAPI restarted")
        # The bouncer is killed; a ban is lifted meanwhile; a new bouncer resyncs.
        bouncer.kill()
        lapi.cscli("decisions", "delete", "--range", "2001:db8:a::/48")
        assert held(name, a.v6)  # nobody has told the set yet
        bouncer.start()
        until(lambda: not held(name, a.v6), 30, "the resync after a crash")
        check_policy(svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(a, "tcp", 4, 8080)])
        metrics = subprocess.run(
            [*WRAPPER, "status", "--prometheus"], capture_output=True, text=True, timeout=60
        ).stdout
        assert "alfwrapper_crowdsec_resyncs_total 1" in metrics, metrics  # the new bouncer's
        assert "alfwrapper_crowdsec_entries 1" in metrics, metrics
    finally:
        output = finish(bouncer, name)
    assert "cannot be reached" in output or "in step" in output, output


def test_a_wrong_key_is_said_and_changes_nothing(lapi: Lapi, tmp_path: Path) -> None:
    name = f"csk{os.getpid()}"
    key = tmp_path / "key"
    write_key(key, "not-a-key\n")
    config = tmp_path / "bouncer.toml"
    config.write_text(bouncer_config(lapi, key, name, 0.2, f"{tmp_path}/m"))
    try:
        out = subprocess.run(
            ["timeout", "-s", "INT", "3", *WRAPPER, "crowdsec", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "refused the bouncer's key (check api-key-file)" in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1, out.stderr  # said once, not every poll
        assert sets.entries(name) == []
    finally:
        subprocess.run([*WRAPPER, "set", "destroy", name], capture_output=True, timeout=60)


def test_once_says_what_it_found(lapi: Lapi, tmp_path: Path) -> None:
    """--once: one resync and its exit code: 0; 78 for a key the LAPI refuses; 76 for
    a LAPI that is not there (each error one line)."""
    name = f"cso{os.getpid()}"
    key = tmp_path / "key"
    write_key(key, lapi.cscli("bouncers", "add", f"once{os.getpid()}", "-o", "raw"))
    lapi.cscli("decisions", "add", "--ip", "192.0.2.99", "--duration", "1h")
    config = tmp_path / "bouncer.toml"
    config.write_text(bouncer_config(lapi, key, name, 1, f"{tmp_path}/m"))
    once = [*WRAPPER, "crowdsec", "--once", "--config", str(config)]
    try:
        out = subprocess.run(once, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "holds the 1 bans" in out.stdout, out
        assert held(name, "192.0.2.99")
        write_key(key, "wrong\n")
        out = subprocess.run(once, capture_output=True, text=True, timeout=60)
        assert out.returncode == 78 and "refused the bouncer's key" in out.stderr, out
        lapi.stop()
        out = subprocess.run(once, capture_output=True, text=True, timeout=60)
        assert out.returncode == 76 and "cannot be reached" in out.stderr, out
        assert len(out.stderr.splitlines()) == 1, out.stderr
        assert held(name, "192.0.2.99")  # the set keeps what it had
    finally:
        subprocess.run([*WRAPPER, "set", "destroy", name], capture_output=True, timeout=60)


def test_a_ban_of_everyone_is_left_out_and_counted(lapi: Lapi, tmp_path: Path) -> None:
    """A mistyped `cscli decisions add --range` (0.0.0.0/0, ::/0, or wider than the
    widest-ipv4 /8 by default) is left out, counted in the metrics file and `status
    --prometheus`, and said in one line for the poll that brought it; the ban beside
    it is applied."""
    name = f"csw{os.getpid()}"
    key = tmp_path / "key"
    write_key(key, lapi.cscli("bouncers", "add", f"wide{os.getpid()}", "-o", "raw"))
    for wide in ("0.0.0.0/0", "::/0", "64.0.0.0/2"):
        lapi.cscli("decisions", "add", "--range", wide, "--duration", "1h")
    lapi.cscli("decisions", "add", "--ip", "192.0.2.77", "--duration", "1h")
    config = tmp_path / "bouncer.toml"
    Path(METRICS).parent.mkdir(exist_ok=True)
    config.write_text(bouncer_config(lapi, key, name, 0.3, METRICS))
    bouncer = Bouncer(config)
    output = ""
    try:
        bouncer.start()
        until(lambda: sets.exists(name) and held(name, "192.0.2.77"), 30, "the startup answer")

        def counted() -> bool:
            metrics = read_metrics()
            return bool(metrics and metrics.get("too_wide") == 3 and metrics.get("polls", 0) > 2)

        until(counted, 15, "the metrics file counting the wide bans")
        assert len(sets.entries(name)) == 1  # the /32 alone: nothing of the wide ones
        assert not held(name, "198.51.100.1") and not held(name, "2001:db8::1")
        metrics = subprocess.run(
            [*WRAPPER, "status", "--prometheus"], capture_output=True, text=True, timeout=60
        ).stdout
        assert "alfwrapper_crowdsec_decisions_too_wide_total 3" in metrics, metrics
        assert "alfwrapper_crowdsec_entries 1" in metrics, metrics
    finally:
        output = finish(bouncer, name)
    said = [line for line in output.splitlines() if "left out" in line]
    assert len(said) == 1, output  # one line for the poll that brought them, not one a ban
    assert "left out 3 bans wider than /8 (IPv4) or /32 (IPv6): " in said[0], said


@pytest.fixture
def metrics_path() -> Iterator[Path]:
    """The metrics file's place, emptied for the test and put back after."""
    path = Path(METRICS)
    path.parent.mkdir(exist_ok=True)
    kept = path.read_bytes() if path.is_file() and not path.is_symlink() else None
    path.unlink(missing_ok=True)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        if kept is not None:
            path.write_bytes(kept)


def test_status_reads_no_fifo_or_link_the_bouncers_user_plants(
    metrics_path: Path, tmp_path: Path
) -> None:
    """The bouncer's user owns the metrics file's folder: a FIFO there held root's
    `status --prometheus` (and alfwrapper-metrics.service) for ever, and a link led it
    to any file.  Each is passed over at once; a regular file is read."""
    counters = json.dumps({"polls": 4242, "entries": 7})

    def status() -> str:
        out = subprocess.run(
            [*WRAPPER, "status", "--prometheus"], capture_output=True, text=True, timeout=20
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    os.mkfifo(metrics_path)
    assert "alfwrapper_crowdsec" not in status()  # a FIFO no one writes: no wait
    # Counters in the pipe, its writer gone, kept alive by a reader: readable to the end.
    reader = os.open(metrics_path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        writer = os.open(metrics_path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(writer, counters.encode())
        os.close(writer)
        assert "alfwrapper_crowdsec" not in status()
    finally:
        os.close(reader)
    metrics_path.unlink()
    secret = tmp_path / "root-only.json"  # a file of root's the user cannot read
    secret.write_text(counters)
    secret.chmod(0o600)
    metrics_path.symlink_to(secret)
    assert "alfwrapper_crowdsec" not in status()
    metrics_path.unlink()
    metrics_path.write_text(counters)
    assert "alfwrapper_crowdsec_polls_total 4242" in status()


class _Answered:
    """A requests session whose every GET answers with ``body`` (poll_once's fetch)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def get(self, *args: object, **kwargs: object) -> _Answered:
        return self

    def __enter__(self) -> _Answered:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    status_code = 200
    headers: dict[str, str] = {}

    def iter_content(self, size: int) -> list[bytes]:
        return [self.body]


def test_metrics_say_what_the_set_holds_after_an_answer_stopped_half_way(
    bpf_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer the set cannot take whole (here its growth fails: ALFWRAPPER_FAIL_AT,
    the kernel's ENOMEM): every entry it can take still goes in (the hosts it has room
    for, and the range after them), the poll fails saying how many could not, every
    poll while that lasts (metrics: unstored), and the counters say what the set holds,
    not the 0 of a book that took nothing.  The next poll takes the answer whole."""
    name = f"c{os.getpid()}-{time.monotonic_ns() % 10**9}"
    sets.create(name, (), 4)
    try:
        bans = [{"id": i + 1, "origin": "crowdsec", "scope": "Ip", "type": "ban",
                 "value": f"2001:db8:c::{i + 1:x}", "duration": "1h", "scenario": "t"}
                for i in range(10)]  # fmt: skip
        bans.append({"id": 11, "origin": "crowdsec", "scope": "Range", "type": "ban",
                     "value": "2001:db8:d::/48", "duration": "1h", "scenario": "t"})  # fmt: skip
        session = _Answered(json.dumps({"new": bans, "deleted": None}).encode())
        config, book, counts = bouncer.Config(set=name), Book.empty(), bouncer.Counters()
        monkeypatch.setenv("ALFWRAPPER_FAIL_AT", "set-grown-pinned")
        said = []
        for _ in range(3):
            with pytest.raises(sets.NotWhole) as caught:
                bouncer.poll_once(session, config, book, False, counts)  # type: ignore[arg-type]
            assert caught.value.unstored == 6 and "6 entries could not be stored" in str(
                caught.value.line()
            )
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                bouncer.failed(caught.value, counts, False)
            said.append(stderr.getvalue())
        assert all("6 entries could not be stored" in line for line in said), said
        assert counts.unstored == 6
        held = {str(p) for p, _ in sets.entries(name)}
        assert len(held) == 5 and "2001:db8:d::/48" in held and counts.entries == 5, held
        monkeypatch.delenv("ALFWRAPPER_FAIL_AT")
        bouncer.poll_once(session, config, Book.empty(), False, counts)  # type: ignore[arg-type]
        assert counts.entries == 11 == len(sets.entries(name))
        # A LAPI that cannot be reached is said the first time, then every 60th poll.
        quiet, stderr = bouncer.Counters(), io.StringIO()
        with contextlib.redirect_stderr(stderr):
            for _ in range(3):
                bouncer.failed(AlfError("the CrowdSec LAPI", "cannot be reached"), quiet, False)
        assert stderr.getvalue().count("cannot be reached") == 1 and quiet.unstored == 0
    finally:
        sets.destroy(name)


def test_a_million_bans_then_one_more_reach_the_service(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """A stand-in LAPI whose startup answer holds 1,000,000 Ip bans (the denied host's
    IPv4 address among them), then one more (its IPv6 address): the bouncer, whose set
    starts at its default room of 65,536, grows it and applies both; the service drops
    the denied host on both families and serves the allowed one.  (The LAPI of issue
    49 held 70,000 bans: everything past 65,536 was lost.)"""
    import threading  # noqa: PLC0415
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: PLC0415
    from urllib.parse import parse_qs, urlsplit  # noqa: PLC0415

    a, b = network.allowed, network.denied
    count = 1_000_000

    def ban(i: int, value: str) -> str:
        return (
            f'{{"id":{i},"origin":"crowdsec","scope":"Ip","type":"ban","value":"{value}",'
            f'"duration":"4h","scenario":"test"}}'
        )

    many = [ban(i + 1, f"2001:db8:1:{i >> 16:x}:{i & 0xFFFF:x}::1") for i in range(count - 1)]
    startup = ('{"new":[' + ",".join([*many, ban(count, b.v4)]) + '],"deleted":null}').encode()
    answers = [ban(count + 1, b.v6).join(('{"new":[', '],"deleted":null}')).encode()]

    class Stand(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            empty = b'{"new":null,"deleted":null}'
            body = (
                startup
                if query.get("startup") == ["true"]
                else (answers.pop() if answers else empty)
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stand)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    name = f"cm{os.getpid()}"
    key = tmp_path / "key"
    write_key(key, "stand-in")
    config = tmp_path / "bouncer.toml"
    config.write_text(
        f'lapi-url = "http://127.0.0.1:{server.server_address[1]}"\napi-key-file = "{key}"\n'
        f'set = "{name}"\npoll-interval = 1\ntimeout = 120\n'
        f'metrics-file = "{tmp_path / "metrics.json"}"\n'
    )
    bouncer = Bouncer(config)
    try:
        bouncer.start()
        until(lambda: sets.exists(name) and held(name, b.v6), 120, "a million bans, then one")
        assert sets.count(name) == count + 1
        svc = start_echo(network, services, f"{name}-svc", "--deny-set", name)
        check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    finally:
        bouncer.kill()
        server.shutdown()
        sets.destroy(name)
