"""Daemons that bind their own sockets, with real traffic between namespace hosts: the
wrapper with no socket inherited and none to create intercepts COMMAND's binds and
listens (lifecycle/intercept.py), and a daemon that tries to get a receiving socket
past it (binder.py: an fd swapped during bind, a listen without bind, forked workers,
io_uring, the 32-bit entry points, a killed supervisor) gets none that a denied host
reaches."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, check_policy
from helpers.support import ECHO_SERVER, PROGRAMS, WRAPPER
from helpers.wrapping import allowed_in_denied_out

pytestmark = pytest.mark.netns

BINDER = [sys.executable, str(PROGRAMS / "binder.py")]
RULES = ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"]


def daemon(
    network: Network, services: list[Service], *command: str, ready: str = r"^ready"
) -> Service:
    svc = Service(network.server, [*WRAPPER, "--service", "bindself", *RULES, "--", *command])
    services.append(svc)
    svc.wait_for(ready)
    return svc


def bound(svc: Service, kind: str = "udp|tcp") -> list[int]:
    """The ports of the sockets binder.py got, of this kind, once each."""
    found = re.findall(rf"^bound (?:{kind}) (\d+)$", svc.output(), re.M)
    return sorted({int(p) for p in found})


def test_a_daemon_that_binds_its_own_sockets_is_filtered(
    network: Network, services: list[Service]
) -> None:
    """The echo server binding TCP 8080 and UDP 8081 itself (as nginx or a DNS server
    does), dual-stack: the allowed host is served on both, over IPv4 and IPv6; the
    denied host's packets never reach it."""
    svc = daemon(network, services, "env", "ECHO_BIND=web=tcp:8080,dns=udp:8081", *ECHO_SERVER)
    allowed_in_denied_out(svc, network, 8080, 8081)


def test_an_fd_swapped_during_bind_never_binds_an_unfiltered_socket(
    network: Network, services: list[Service]
) -> None:
    """200 binds of a UDP socket while another thread dup2s a TCP or UDP socket onto
    its fd: whatever got bound, the denied host reaches none of it."""
    svc = daemon(network, services, *BINDER, "race", "9000")
    udp = bound(svc, "udp")
    assert udp and all(9000 <= p < 9200 for p in udp), svc.output()
    probes = [Probe(network.denied, "udp", 4, p) for p in udp[:40]]
    check_policy(svc, served=[Probe(network.allowed, "udp", 4, udp[0])], dropped=probes)


def test_a_listen_without_bind_is_filtered(network: Network, services: list[Service]) -> None:
    """listen(2) on an unbound socket binds it to a port the kernel picks: filtered too."""
    svc = daemon(network, services, *BINDER, "autobind")
    (port,) = bound(svc)
    check_policy(
        svc,
        served=[Probe(network.allowed, "tcp", 6, port)],
        dropped=[Probe(network.denied, "tcp", 4, port), Probe(network.denied, "tcp", 6, port)],
    )


def test_forked_workers_binding_each_their_own_are_filtered(
    network: Network, services: list[Service]
) -> None:
    """Forty forked workers, each binding a UDP port of its own (the filters go with
    fork and exec): the denied host reaches none."""
    svc = daemon(network, services, *BINDER, "workers", "9300", "40")
    deadline = time.monotonic() + 30
    while len(bound(svc)) < 40 and time.monotonic() < deadline:
        time.sleep(0.1)
    ports = bound(svc)
    assert sorted(ports) == list(range(9300, 9340)), svc.output()
    check_policy(
        svc,
        served=[Probe(network.allowed, "udp", 4, 9300 + i) for i in (0, 39)],
        dropped=[Probe(network.denied, "udp", 4, p) for p in ports],
    )


def test_io_uring_and_the_32_bit_entry_points_are_refused(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """io_uring, which binds and listens without those system calls (Linux 6.11), is
    refused (ENOSYS); so are socketcall, bind and listen through int 0x80 (EPERM), while
    other 32-bit calls work."""
    svc = daemon(network, services, *BINDER, "io_uring")
    assert "refused io_uring 38" in svc.output(), svc.output()
    source = PROGRAMS / "bind32.c"
    binary = tmp_path / "bind32"
    subprocess.run(["gcc", "-O1", "-o", str(binary), str(source)], check=True, timeout=120)
    svc32 = Service(
        network.server, [*WRAPPER, "--service", "bind32", *RULES, "--", str(binary), "9400"]
    )
    services.append(svc32)
    svc32.wait_for(r"^done")
    assert re.search(r"^socketcall bind -1 1$", svc32.output(), re.M), svc32.output()
    assert re.search(r"^bind -1 1$", svc32.output(), re.M), svc32.output()
    # Every other 32-bit call works (the bpf(2) filter of privileges.py, too, has the
    # 32-bit entry points: it once killed any 32-bit call with SIGSYS).
    assert re.search(r"^getpid [1-9]\d* 0$", svc32.output(), re.M), svc32.output()


def test_with_its_supervisor_killed_the_daemon_binds_nothing(
    network: Network, services: list[Service]
) -> None:
    """SIGKILL to the supervisor: the daemon's next bind fails (ENOSYS), and nothing
    listens on its port."""
    svc = daemon(network, services, *BINDER, "after-signal", "9500", ready=r"^waiting")
    found = subprocess.run(
        ["pgrep", "-f", "alfwrapper-bind bindself"], capture_output=True, text=True, check=False
    )
    pids = [int(p) for p in found.stdout.split()]
    assert len(pids) == 1, found
    os.kill(pids[0], signal.SIGKILL)
    time.sleep(0.3)
    svc.proc.send_signal(signal.SIGUSR1)
    svc.wait_for(r"^ready")
    assert "refused bind 38 ENOSYS" in svc.output(), svc.output()
    assert bound(svc) == []


@pytest.mark.parametrize("point", ["intercept-taken", "intercept-attached"])
def test_a_supervisor_killed_at_each_step_leaves_nothing_unfiltered(
    network: Network, services: list[Service], point: str
) -> None:
    """A kill of the supervisor at each step of taking a socket: the daemon's bind
    fails, and no packet of the denied host's reaches it."""
    env = {**os.environ, "ALFWRAPPER_CRASH_AT": point}
    svc = Service(network.server, [*WRAPPER, "--service", "bindcrash", *RULES, "--", "env",
                                   "ECHO_BIND=dns=udp:8081", *ECHO_SERVER], env=env)  # fmt: skip
    services.append(svc)
    deadline = time.monotonic() + 20
    while svc.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert svc.proc.poll() is not None, "the daemon bound on with its supervisor gone"
    assert "Function not implemented" in svc.output() + svc.errors(), svc.errors()
    assert "ready" not in svc.output()  # it never served


def test_the_daemons_own_privileges_bind_not_the_supervisors(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """The supervisor binds as root, but a port below 1024 only for a daemon with its
    own CAP_NET_BIND_SERVICE (--no-capabilities: none); and a Unix socket's path is
    the daemon's: relative to its working directory, with its umask."""
    svc = Service(network.server, [*WRAPPER, "--service", "bindpriv", "--no-capabilities",
                                   *RULES, "--", *BINDER, "privileged", "53"])  # fmt: skip
    services.append(svc)
    svc.wait_for(r"^ready")
    assert "refused bind 13" in svc.output() and bound(svc) == [], svc.output()
    folder = tmp_path / "run"
    folder.mkdir()
    svc = daemon(network, services, *BINDER, "unix", str(folder))
    assert "unix 0o700" in svc.output(), svc.output()
    assert (folder / "daemon.sock").is_socket()


NGINX_CONF = """daemon off;
master_process on;
worker_processes 2;
pid {folder}/nginx.pid;
error_log stderr notice;
events {{ worker_connections 64; }}
http {{
    access_log {folder}/access.log;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    server {{
        {listens}
        location / {{ return 200 "served $remote_addr\\n"; }}
    }}
}}
"""


def http_get(host: object, address: str, port: int) -> str:
    """What an HTTP GET from the host gets: the body, or "timeout"."""
    url = f"http://[{address}]:{port}/" if ":" in address else f"http://{address}:{port}/"
    code = (
        "import urllib.request, sys\n"
        f"try: print(urllib.request.urlopen({url!r}, timeout=2).read().decode().strip())\n"
        "except Exception as err: print('timeout' if 'timed out' in str(err) else err)\n"
    )
    out = subprocess.run(
        host.command([sys.executable, "-c", code]),  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.strip().replace("::ffff:", "")  # IPv4 on a dual-stack socket


@pytest.mark.skipif(not Path("/usr/sbin/nginx").exists(), reason="nginx-light: make setup")
def test_debians_nginx_binding_its_own_sockets_and_a_reload_adding_one(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Debian's nginx, master and two workers, binding [::]:8080 itself: the allowed
    host is served over IPv4 and IPv6, the denied host's connections time out; then
    `alfwrapper reload` with a rule for tcp-8082, and `nginx -s reload` with a config
    adding [::]:8082: the new socket, bound by the master on reload, is filtered, by
    the rules of alfwrapper's reload."""
    conf = tmp_path / "nginx.conf"
    listen = "listen [::]:8080 ipv6only=off;"
    conf.write_text(NGINX_CONF.format(folder=tmp_path, listens=listen))
    svc = Service(
        network.server,
        [*WRAPPER, "--service", "nginx", *RULES, "--", "/usr/sbin/nginx", "-c", str(conf)],
    )
    services.append(svc)
    a, b = network.allowed, network.denied
    deadline = time.monotonic() + 20
    while http_get(a, a.server_v4, 8080) != f"served {a.v4}" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert http_get(a, a.server_v4, 8080) == f"served {a.v4}", svc.errors()
    assert http_get(a, a.server_v6, 8080) == f"served {a.v6}"
    assert http_get(b, b.server_v4, 8080) == "timeout"
    assert http_get(b, b.server_v6, 8080) == "timeout"
    # alfwrapper's reload first, with rules for a socket nginx has not bound yet: the
    # supervisor gives that socket the reload's rules when nginx binds it.
    out = subprocess.run(
        [*WRAPPER, "reload", "nginx", *RULES, "--deny", f"tcp-8082={a.v4}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    more = listen + " listen [::]:8082 ipv6only=off;"
    conf.write_text(NGINX_CONF.format(folder=tmp_path, listens=more))
    subprocess.run(
        network.server.command(["/usr/sbin/nginx", "-c", str(conf), "-s", "reload"]),
        check=True,
        timeout=30,
    )
    deadline = time.monotonic() + 20
    while http_get(a, a.server_v6, 8082) != f"served {a.v6}" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert http_get(a, a.server_v6, 8082) == f"served {a.v6}", svc.errors()
    assert http_get(a, a.server_v4, 8082) == "timeout"  # the reload's rule for tcp-8082
    assert http_get(a, a.server_v4, 8080) == f"served {a.v4}"
    for port in (8080, 8082):
        assert http_get(b, b.server_v4, port) == "timeout", port
        assert http_get(b, b.server_v6, port) == "timeout", port
    log = (tmp_path / "access.log").read_text()
    assert b.v4 not in log and b.v6 not in log, log


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WRAPPER, *argv], capture_output=True, text=True, timeout=120)


def test_an_operator_runs_a_daemons_own_sockets_as_any_others(
    network: Network, services: list[Service]
) -> None:
    """A daemon's own sockets are named tcp-PORT and udp-PORT: a policy gives one rules
    of its own by that name; `status` lists them; `deny` drops a host live on both;
    `explain SERVICE` agrees with the traffic; `reload` keeps the runtime rule and puts
    new rules in force (on a socket the daemon binds after it: the nginx test)."""
    a, b = network.allowed, network.denied
    options = [*RULES, "--allow", "udp-8081=198.51.100.0/24"]
    bind = "ECHO_BIND=web=tcp:8080,dns=udp:8081"
    argv = [*WRAPPER, "--service", "bindops", *options, "--", "env", bind, *ECHO_SERVER]
    svc = Service(network.server, argv)
    services.append(svc)
    svc.wait_for(r"^ready")
    out = cli("status", "bindops", "--json")
    assert out.returncode == 0, out.stderr
    names = {s["name"] for s in json.loads(out.stdout)["services"][0]["sockets"]}
    assert names == {"tcp-8080", "udp-8081"}, names
    check_policy(
        svc,
        served=[Probe(a, "tcp", 4, 8080), Probe(a, "udp", 6, 8081), Probe(b, "udp", 4, 8081)],
        dropped=[Probe(b, "tcp", 4, 8080), Probe(b, "tcp", 6, 8080)],
    )
    assert cli("deny", "bindops", a.v4).returncode == 0
    said = json.loads(
        cli(
            "explain", "bindops", "--from", a.v4, "--port", "8080", "--protocol", "tcp", "--json"
        ).stdout
    )
    assert said["verdict"] == "drop", said
    check_policy(
        svc,
        served=[Probe(a, "tcp", 6, 8080)],
        dropped=[Probe(a, "tcp", 4, 8080), Probe(a, "udp", 4, 8081)],
    )
    # A reload that takes the denied host's subnet off the UDP socket's rules.
    out = cli("reload", "bindops", *RULES)
    assert out.returncode == 0 and "kept 2 runtime rule" in out.stdout, out
    check_policy(
        svc,
        served=[Probe(a, "tcp", 6, 8080)],
        dropped=[Probe(a, "tcp", 4, 8080), Probe(b, "udp", 4, 8081)],
    )


# --- Debian's daemons that bind their own sockets, each under alfwrapper as it ships ---

EXCHANGE = """
import socket, sys
proto, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
payload = bytes.fromhex(sys.argv[4])
family = socket.AF_INET6 if ":" in address else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
s.settimeout(2)
try:
    if proto == "tcp":
        s.connect((address, port)); s.sendall(payload); reply = s.recv(4096)
    else:
        s.sendto(payload, (address, port)); reply = s.recv(4096)
    print(reply.hex())
except (TimeoutError, socket.timeout):
    print("timeout")
except OSError as err:
    print(f"error {err}")
"""


def exchange(host: object, address: str, port: int, payload: bytes, proto: str = "tcp") -> str:
    """The reply's bytes (hexadecimal) to one payload from the host, or "timeout"."""
    argv = [sys.executable, "-c", EXCHANGE, proto, address, str(port), payload.hex()]
    out = subprocess.run(host.command(argv), capture_output=True, text=True, timeout=30)  # type: ignore[attr-defined]
    return out.stdout.strip()


def gallery(network: Network, services: list[Service], name: str, command: list[str],
            port: int, payload: bytes, answer: bytes, proto: str = "tcp",
            sockets: tuple[str, ...] = ()) -> Service:  # fmt: skip
    """The daemon under alfwrapper, binding its own sockets (or taking ``sockets``, the
    wrapper's socket options): once it answers the allowed host (IPv4, then IPv6) with
    ``answer``, the denied host gets nothing (either family)."""
    argv = [*WRAPPER, "--service", name, *sockets, *RULES, "--", *command]
    svc = Service(network.server, argv)
    services.append(svc)
    a, b = network.allowed, network.denied
    deadline = time.monotonic() + 30
    got = ""
    while time.monotonic() < deadline:
        got = exchange(a, a.server_v4, port, payload, proto)
        if bytes.fromhex(
            got if got != "timeout" and not got.startswith("error") else ""
        ).startswith(answer):
            break
        time.sleep(0.3)
    assert bytes.fromhex(got).startswith(answer), (got, svc.output(), svc.errors())
    got = exchange(a, a.server_v6, port, payload, proto)
    assert got not in ("timeout", "") and bytes.fromhex(got).startswith(answer), got
    assert exchange(b, b.server_v4, port, payload, proto) == "timeout"
    assert exchange(b, b.server_v6, port, payload, proto) == "timeout"
    return svc


def needs(program: str) -> None:
    if not Path(program).exists():
        pytest.fail(f"{program} is missing: `make setup` installs it")


def test_debians_redis_binding_its_own(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    needs("/usr/bin/redis-server")
    gallery(network, services, "redis", ["/usr/bin/redis-server", "--port", "6379", "--bind",
            "* -::*", "--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir",
            str(tmp_path)], 6379, b"PING\r\n", b"+PONG")  # fmt: skip


def test_debians_haproxy_binding_its_own(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    needs("/usr/sbin/haproxy")
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(
        "defaults\n  mode http\n  timeout client 5s\n  timeout connect 5s\n"
        "  timeout server 5s\nfrontend web\n  bind :::8091 v4v6\n"
        "  http-request return status 200 content-type text/plain "
        'string "served"\n'
    )
    gallery(network, services, "haproxy", ["/usr/sbin/haproxy", "-db", "-f", str(conf)], 8091,
            b"GET / HTTP/1.0\r\n\r\n", b"HTTP/1.1 200")  # fmt: skip


def test_debians_dnsmasq_answering_dns_over_udp(network: Network, services: list[Service]) -> None:
    needs("/usr/sbin/dnsmasq")
    # A query for example.test, type A, class IN (id 0x1234, recursion desired).
    query = (
        bytes.fromhex("123401000001000000000000")
        + b"\x07example\x04test\x00"
        + bytes.fromhex("00010001")
    )
    gallery(network, services, "dnsmasq", ["/usr/sbin/dnsmasq", "-k", "--no-resolv",
            "--no-hosts", "--port=5353", "--address=/example.test/192.0.2.99", "--user=root",
            "--pid-file="], 5353, query, bytes.fromhex("1234"), proto="udp")  # fmt: skip


APACHE_CONF = """ServerRoot "/etc/apache2"
LoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
ServerName localhost
Listen 8092
PidFile {folder}/apache.pid
ErrorLog {folder}/error.log
DefaultRuntimeDir {folder}
Mutex file:{folder}
User www-data
Group www-data
DocumentRoot {folder}
"""


def test_debians_apache_binding_its_own(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Apache's event MPM: its parent binds, its children (www-data) serve."""
    needs("/usr/sbin/apache2")
    conf = tmp_path / "apache.conf"
    conf.write_text(APACHE_CONF.format(folder=tmp_path))
    gallery(network, services, "apache", ["/usr/sbin/apache2", "-f", str(conf), "-DFOREGROUND"],
            8092, b"GET / HTTP/1.0\r\n\r\n", b"HTTP/1.1 ")  # fmt: skip


def test_nginx_takes_the_wrappers_sockets_in_its_own_variable(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """nginx given a socket (--listen, as a socket unit would) takes it from NGINX, the
    variable of its own binary upgrade, and binds nothing itself: no supervisor runs,
    and `nginx -s reload` keeps the socket, still filtered."""
    needs("/usr/sbin/nginx")
    conf = tmp_path / "nginx.conf"
    conf.write_text(NGINX_CONF.format(folder=tmp_path, listens="listen [::]:8093 ipv6only=off;"))
    command = ["/usr/sbin/nginx", "-c", str(conf), "-p", str(tmp_path)]
    svc = gallery(network, services, "nginx-handover", command, 8093, b"GET / HTTP/1.0\r\n\r\n",
                  b"HTTP/1.1 200", sockets=("--listen", "[::]:8093"))  # fmt: skip
    assert 'using inherited sockets from "3;"' in svc.errors(), svc.errors()
    assert "alfwrapper-bind nginx-handover" not in subprocess.run(["ps", "-eo", "args"],
        capture_output=True, text=True).stdout  # fmt: skip
    subprocess.run(network.server.command([*command, "-s", "reload"]), check=True, timeout=30)
    deadline = time.monotonic() + 20  # the master's new workers started
    while "gracefully shutting down" not in svc.errors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "gracefully shutting down" in svc.errors(), svc.errors()
    a, b = network.allowed, network.denied
    served = bytes.fromhex(exchange(a, a.server_v4, 8093, b"GET / HTTP/1.0\r\n\r\n"))
    assert served.startswith(b"HTTP/1.1 200"), svc.errors()
    assert exchange(b, b.server_v6, 8093, b"GET / HTTP/1.0\r\n\r\n") == "timeout"
    log = (tmp_path / "access.log").read_text()
    assert "192.0.2.2" in log and "198.51.100.2" not in log and "2001:db8:b::2" not in log, log


def test_nginx_cannot_add_reuseport_siblings_beside_a_handed_socket(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """`listen ... reuseport` with a handed socket: nginx would set SO_REUSEPORT on it
    and bind a sibling for each further worker, unfiltered, sharing its connections.
    Setting SO_REUSEPORT fails (EPERM) for an application handed sockets, so nginx's
    siblings cannot bind and it does not start: nothing is served, nothing unfiltered."""
    needs("/usr/sbin/nginx")
    conf = tmp_path / "nginx.conf"
    listen = "listen [::]:8096 ipv6only=off reuseport;"
    conf.write_text(NGINX_CONF.format(folder=tmp_path, listens=listen))
    svc = Service(network.server, [*WRAPPER, "--service", "nginx-reuse", "--listen", "[::]:8096",
                                   *RULES, "--", "/usr/sbin/nginx", "-c", str(conf)])  # fmt: skip
    services.append(svc)
    assert svc.proc.wait(timeout=60) != 0, svc.errors()
    assert "setsockopt(SO_REUSEPORT)" in svc.errors() and "(1: " in svc.errors(), svc.errors()


def test_haproxy_takes_the_wrappers_sockets_by_fd(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """HAProxy's `bind fd@3`, `bind fd@4`: the wrapper's sockets, in the order given."""
    needs("/usr/sbin/haproxy")
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(
        "defaults\n  mode http\n  timeout client 5s\n  timeout connect 5s\n"
        "  timeout server 5s\nfrontend web\n  bind fd@3\n  bind fd@4\n"
        "  http-request return status 200 content-type text/plain "
        'string "served"\n'
    )
    gallery(network, services, "haproxy-fd", ["/usr/sbin/haproxy", "-W", "-db", "-f",
            str(conf)], 8094, b"GET / HTTP/1.0\r\n\r\n", b"HTTP/1.1 200",
            sockets=("--listen", "[::]:8094", "--listen", "0.0.0.0:8095"))  # fmt: skip
    a, b = network.allowed, network.denied
    assert bytes.fromhex(exchange(a, a.server_v4, 8095, b"GET / HTTP/1.0\r\n\r\n")).startswith(
        b"HTTP/1.1 200"
    )
    assert exchange(b, b.server_v4, 8095, b"GET / HTTP/1.0\r\n\r\n") == "timeout"


POSTGRES = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))


def test_debians_postgresql_as_its_own_user(network: Network, services: list[Service]) -> None:
    """PostgreSQL runs as the user postgres (the supervisor, root, takes the sockets of
    another user's process) and binds TCP 5433 and its Unix socket itself: the TCP
    socket answers the allowed host's SSLRequest (N: no SSL) and never the denied
    host's; the Unix socket is made by the daemon's user, in its folder."""
    if not POSTGRES:
        pytest.fail("postgresql is missing: `make setup` installs it")
    import pwd  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    postgres = pwd.getpwnam("postgres")
    data = Path(tempfile.mkdtemp(prefix="alfwrapper-pg-", dir="/var/tmp"))
    try:
        os.chown(data, postgres.pw_uid, postgres.pw_gid)
        initdb = POSTGRES[-1].with_name("initdb")
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(initdb), "-D", str(data / "db"), "-A", "trust"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        command = ["runuser", "-u", "postgres", "--", str(POSTGRES[-1]), "-D", str(data / "db"),
                   "-p", "5433", "-c", "listen_addresses=*", "-k", str(data)]  # fmt: skip
        ssl_request = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")
        gallery(network, services, "postgres", command, 5433, ssl_request, b"N")
        unix = data / ".s.PGSQL.5433"
        assert unix.is_socket() and unix.stat().st_uid == postgres.pw_uid
    finally:
        for svc in services:
            svc.stop()
        shutil.rmtree(data, ignore_errors=True)


def test_a_restart_takes_its_own_rules_not_an_earlier_runs_reload(
    network: Network, services: list[Service]
) -> None:
    """A run reloaded with a deny, then killed (its state not collected yet); the next
    run, started with the rules alone, filters its socket by those, not by the earlier
    run's reload."""
    a = network.allowed
    bind = "ECHO_BIND=dns=udp:8081"
    first = Service(
        network.server,
        [*WRAPPER, "--service", "bindstale", *RULES, "--", "env", bind, *ECHO_SERVER],
    )
    services.append(first)
    first.wait_for(r"^ready")
    out = cli("reload", "bindstale", *RULES, "--deny", f"udp-8081={a.v4}")
    assert out.returncode == 0, out.stderr
    first.proc.kill()
    first.proc.wait(timeout=30)
    second = Service(
        network.server,
        [*WRAPPER, "--service", "bindstale", *RULES, "--", "env", bind, *ECHO_SERVER],
    )
    services.append(second)
    second.wait_for(r"^ready")
    check_policy(
        second, served=[Probe(a, "udp", 4, 8081)], dropped=[Probe(network.denied, "udp", 4, 8081)]
    )
