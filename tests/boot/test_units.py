"""The boot tier: alfwrapper's Debian package in a Debian 12 and a Debian 13 guest
booted with the real systemd as PID 1 (guest.sh, nspawn: this host's kernel), every
shipped and gallery unit started exactly as shipped (no drop-in touches their
sandboxing), and real clients from outside the guest, allowed and denied, TCP and UDP,
IPv4 and IPv6.

The tests share one guest and run in order: each starts what it tests and stops it."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest
from helpers.guest import (
    ALLOW4,
    ALLOW6,
    DENY4,
    DENY6,
    FIRST,
    GUEST4,
    GUEST6,
    OTHER4,
    Guest,
    a_failing_start_stops_its_socket,
    a_named_set_under_the_template,
    expect,
    never_accepted,
    platform_line,
    served_and_dropped,
    stop,
    tftp_served,
)
from helpers.support import PROGRAMS

pytestmark = pytest.mark.boot

# The exposure systemd-analyze security gave each unit before this tier existed: none
# may get worse.  One deliberate exception: the loader went from 1.6 to 1.8 for
# Delegate=memory and ProtectControlGroups=no, which kernel-counted per-user quotas
# need (its cgroup subtree is the only part of /sys/fs/cgroup its user owns).
EXPOSURE = {
    "alfwrapper-echo.service": 2.3,
    "alfwrapper-echo-accept@.service": 2.3,
    "alfwrapper-multi.service": 2.3,
    "alfwrapper-proxy.service": 2.3,
    "alfwrapper@.service": 2.3,
    "alfwrapper-loader.service": 1.8,
    "alfwrapper-crowdsec.service": 3.0,
    "alfwrapper-metrics.service": 2.2,
    "alfwrapper-tftp.service": 5.5,
    "alfwrapper-nginx.service": 4.7,  # root, its binds intercepted: 4.7 when it shipped
    "alfwrapper-dnsmasq.service": 4.7,  # likewise
    "alfwrapper-apache2.service": 4.7,  # likewise
    "alfwrapper-redis.service": 4.6,  # likewise, as the user redis
    "alfwrapper-postgresql@15-main.service": 4.6,  # likewise, as the user postgres
    "alfwrapper-nginx-handover.service": 4.1,  # root, on a socket unit's sockets
    "alfwrapper-haproxy.service": 4.1,  # likewise
    "alfwrapper-git@.service": 4.1,
    "alfwrapper-sshd@.service": 9.6,
}
GALLERY = "/usr/share/alfwrapper/units"
HERE = Path(__file__).resolve().parent


def test_the_package_installs_offline_and_doctor_passes(guest: Guest) -> None:
    assert guest.run("ps -o comm= -p 1").strip() == "systemd"
    assert guest.run("systemctl is-system-running --wait", check=False).strip() in (
        "running",
        "degraded",
    )
    code, out = guest.status("alfwrapper doctor")
    assert code == 0, out
    assert "kernel headers" in out and "/usr/src/linux-headers-" in out, out
    assert platform_line(guest) in out, out


def test_units_are_no_more_exposed_than_before(guest: Guest) -> None:
    guest.run(f"cp {GALLERY}/* /etc/systemd/system/ && systemctl daemon-reload")
    for unit, before in EXPOSURE.items():
        out = guest.run(f"systemd-analyze security --no-pager {unit} | tail -n 1")
        level = float(re.search(r"exposure level for \S+: (\d+\.\d+)", out).group(1))  # type: ignore[union-attr]
        assert level <= before, f"{unit}: exposure {level}, was {before}"


def test_echo_serves_the_allowed_and_drops_the_denied(guest: Guest) -> None:
    guest.run("systemctl start alfwrapper-echo.socket")
    try:
        served_and_dropped(guest, "alfwrapper-echo.service", 8080)
        # The start told systemd (STATUS=, with Type=simple and NotifyAccess=main) and
        # the journal what is in force.
        told = guest.run("systemctl show -P StatusText alfwrapper-echo.service")
        assert told.startswith("alfwrapper: filters in force for alfwrapper-echo after "), told
        journal = guest.journal("alfwrapper-echo.service", 200)
        assert re.search(
            r"filters in force for alfwrapper-echo after [0-9.]+ s: echo \(tcp "
            r"\[::\]:8080\): subnets 4 allow, 0 deny; echo \(udp",
            journal,
        ), journal
        status = guest.run("alfwrapper status alfwrapper-echo")
        assert re.search(r"\(pid \d+; program \d+\)", status), status
        assert re.search(r"subnets [1-9]", status), status
    finally:
        stop(guest, "alfwrapper-echo.socket", "alfwrapper-echo.service")


def test_echo_restart_crash_reactivation_and_reload(guest: Guest) -> None:
    unit = "alfwrapper-echo.service"
    guest.run("systemctl start alfwrapper-echo.socket")
    try:
        expect(guest, unit, "answered", "tcp", ALLOW4, GUEST4, "8080", FIRST)
        guest.run(f"systemctl restart {unit}")
        served_and_dropped(guest, unit, 8080, udp=False)
        # A crash: Restart=on-failure starts it again 100 ms later, too soon for a poll
        # to be sure to see it inactive; the main process changing says it crashed.
        pid = guest.run(f"systemctl show -P MainPID {unit}").strip()
        assert pid not in ("", "0"), pid
        guest.run(f"systemctl kill --signal=SIGKILL {unit}")
        guest.wait(f'test "$(systemctl show -P MainPID {unit})" != {pid}')
        served_and_dropped(guest, unit, 8080, udp=False)
        guest.run(f"systemctl stop {unit}")  # as an idle exit leaves it: the socket listens
        served_and_dropped(guest, unit, 8080, udp=False)
        guest.run(f"systemctl stop {unit} && systemctl restart alfwrapper-echo.socket")
        served_and_dropped(guest, unit, 8080, udp=False)  # a new socket, filtered afresh
        # An administrator's drop-in, put in force by a reload, with a drop log.
        guest.run(
            "mkdir -p /etc/alfwrapper/policy/alfwrapper-echo.toml.d && printf "
            + shlex.quote(f'deny = ["{ALLOW6}"]\nlog-drops = 100\n')
            + " > /etc/alfwrapper/policy/alfwrapper-echo.toml.d/test.toml"
        )
        guest.run(f"systemctl reload {unit}")
        expect(guest, unit, "timeout", "tcp", ALLOW6, GUEST6, "8080", "4")
        expect(guest, unit, "answered", "tcp", ALLOW4, GUEST4, "8080", "20")
        # The drop log's forwarder writes to the journal under the unit itself.
        dropped = guest.wait(f"journalctl -b -u {unit} -o cat | grep -F {ALLOW6}", seconds=20)
        assert "subnets" in dropped, dropped
    finally:
        guest.run("rm -rf /etc/alfwrapper/policy/alfwrapper-echo.toml.d", check=False)
        stop(guest, "alfwrapper-echo.socket", unit)


def test_echo_accept_serves_one_instance_per_allowed_connection(guest: Guest) -> None:
    guest.run("systemctl start alfwrapper-echo-accept.socket")
    try:
        unit = "alfwrapper-echo-accept@*"
        expect(guest, unit, "answered", "tcp", ALLOW4, GUEST4, "8083", FIRST)
        expect(guest, unit, "answered", "tcp", ALLOW6, GUEST6, "8083", FIRST)
        # A denied peer is never accepted: the policy is the socket's IPAddressAllow=.
        never_accepted(guest, "alfwrapper-echo-accept.socket", "8083")
    finally:
        stop(guest, "alfwrapper-echo-accept.socket")


def test_multi_and_proxy(guest: Guest) -> None:
    guest.run("systemctl start alfwrapper-multi-web.socket alfwrapper-multi-admin.socket")
    try:
        unit = "alfwrapper-multi.service"
        expect(guest, unit, "answered", "tcp", DENY4, GUEST4, "8081", FIRST)
        expect(guest, unit, "timeout", "tcp", OTHER4, GUEST4, "8081", "4")
        expect(guest, unit, "answered", "tcp", ALLOW4, GUEST4, "8082", "20")
        expect(guest, unit, "timeout", "tcp", DENY4, GUEST4, "8082", "4")
    finally:
        stop(
            guest,
            "alfwrapper-multi-web.socket",
            "alfwrapper-multi-admin.socket",
            "alfwrapper-multi.service",
        )
    guest.run(
        "systemd-run --quiet --unit=alfcheck-backend ncat -lk 127.0.0.1 9000 -e /bin/cat && "
        "systemctl start alfwrapper-proxy.socket"
    )
    try:
        unit = "alfwrapper-proxy.service"
        expect(guest, unit, "answered", "tcp", ALLOW4, GUEST4, "8085", FIRST)
        expect(guest, unit, "timeout", "tcp", DENY4, GUEST4, "8085", "4")
    finally:
        stop(guest, "alfwrapper-proxy.socket", "alfwrapper-proxy.service", "alfcheck-backend")


def test_the_template_with_an_instance_file(guest: Guest) -> None:
    guest.run(
        "printf '[Socket]\\nListenStream=8084\\n' > /etc/systemd/system/alfwrapper@8084.socket && "
        "mkdir -p /etc/alfwrapper && printf "
        + shlex.quote(
            "ALF_RULES=--allow 192.0.2.0/24 --allow 2001:db8:a::/48\n"
            "ALF_COMMAND=/usr/bin/python3 /usr/share/alfwrapper/echo_server.py\n"
        )
        + " > /etc/alfwrapper/8084.env && systemctl daemon-reload && "
        "systemctl start alfwrapper@8084.socket"
    )
    try:
        served_and_dropped(guest, "alfwrapper@8084.service", 8084, udp=False)
    finally:
        stop(guest, "alfwrapper@8084.socket", "alfwrapper@8084.service")


def test_a_named_set_under_the_template(guest: Guest) -> None:
    a_named_set_under_the_template(guest, 8086, FIRST)


def test_the_crowdsec_bouncer_as_shipped(guest: Guest) -> None:
    """alfwrapper-crowdsec.service as shipped (its own user, CAP_BPF alone, the key as a
    credential, the sets' tree bound in) fills a set a service denies from, against a
    stand-in LAPI in the guest (stand_in_lapi.py; the real one: test_crowdsec.py)."""
    guest.put(PROGRAMS / "stand_in_lapi.py", "/root/stand_in_lapi.py")
    key = "0123456789abcdef0123456789abcdef"
    guest.run(
        "mkdir -p /etc/alfwrapper && umask 077 && "
        f"printf '%s\\n' {key} > /etc/alfwrapper/crowdsec.key && printf '%s\\n' "
        "'lapi-url = \"http://127.0.0.1:18080/\"' 'api-key-file = \"/nonexistent\"' "
        "'set = \"crowdsec-boot\"' 'poll-interval = 1' > /etc/alfwrapper/crowdsec.toml && "
        "chmod 644 /etc/alfwrapper/crowdsec.toml && "
        f"systemd-run --quiet --unit=alf-lapi python3 /root/stand_in_lapi.py 18080 {key} "
        f"{ALLOW4} && systemctl start alfwrapper-crowdsec.service"
    )
    try:
        guest.wait(f"alfwrapper set list crowdsec-boot | grep -q '^{ALLOW4}/32'", seconds=120)
        owner = guest.run("stat -c %U /sys/fs/bpf/alfwrapper-sets /sys/fs/bpf/alfwrapper-sets/*")
        assert set(owner.split()) == {"alfwrapper-sets"}, owner
        guest.run(
            "printf '[Socket]\\nListenStream=8087\\n' > "
            "/etc/systemd/system/alfwrapper@8087.socket && printf "
            + shlex.quote(
                "ALF_RULES=--deny-set crowdsec-boot\n"
                "ALF_COMMAND=/usr/bin/python3 /usr/share/alfwrapper/echo_server.py\n"
            )
            + " > /etc/alfwrapper/8087.env && systemctl daemon-reload && "
            "systemctl start alfwrapper@8087.socket"
        )
        expect(guest, "alfwrapper@8087.service", "answered", "tcp", ALLOW6, GUEST6, "8087", FIRST)
        expect(guest, "alfwrapper@8087.service", "timeout", "tcp", ALLOW4, GUEST4, "8087", "2")
        metrics = guest.run("alfwrapper status --prometheus")
        assert "alfwrapper_crowdsec_entries 1" in metrics, metrics
    finally:
        print(guest.journal("alfwrapper-crowdsec.service"))
        stop(
            guest,
            "alfwrapper@8087.socket",
            "alfwrapper@8087.service",
            "alfwrapper-crowdsec.service",
            "alf-lapi",
        )
        guest.run(
            "alfwrapper set destroy crowdsec-boot; rm -f /etc/alfwrapper/crowdsec.*", check=False
        )


def test_an_ordinary_user_filters_a_service_through_the_loader(guest: Guest) -> None:
    """The user's own service, with no capability at all, its filter made by the
    loader as shipped, naming root's deny set, which root then changes: the loader
    reads the set (the unit's bind and group) and the service follows it."""
    app, name = "alfcheck-app.service", "boot-loader"
    guest.run("id alfcheck >/dev/null 2>&1 || useradd -m alfcheck")
    guest.run(f"alfwrapper set create {name} && systemctl start alfwrapper-loader.socket")
    try:
        code, out = guest.status("cd / && runuser -u alfcheck -- alfwrapper doctor")
        assert code == 0 and "through the loader" in out, out
        guest.run(
            "systemd-run --quiet --uid=alfcheck --unit=alfcheck-app "
            "--property=NoNewPrivileges=yes /usr/bin/alfwrapper --service alfcheck-app "
            f"--listen :8090 --allow 192.0.2.0/24 --allow 2001:db8:a::/48 --deny-set {name} "
            "-- /usr/bin/python3 /usr/share/alfwrapper/echo_server.py"
        )
        guest.wait("ss -Hltn 'sport = :8090' | grep -q LISTEN", seconds=60)  # bound once filtered
        served_and_dropped(guest, app, 8090, udp=False)
        status = guest.run("cd / && runuser -u alfcheck -- alfwrapper status alfcheck-app")
        assert "alfcheck-app" in status, status
        guest.run(f"alfwrapper set add {name} {ALLOW4}")
        expect(guest, app, "timeout", "tcp", ALLOW4, GUEST4, "8090", "2")
        expect(guest, app, "answered", "tcp", ALLOW6, GUEST6, "8090", "20")
        guest.run(f"alfwrapper set del {name} {ALLOW4}")
        expect(guest, app, "answered", "tcp", ALLOW4, GUEST4, "8090", "20")
    finally:
        print(guest.journal("alfwrapper-loader.service"))
        stop(guest, "alfcheck-app", "alfwrapper-loader.socket", "alfwrapper-loader.service")
        guest.run(f"alfwrapper set destroy {name}", check=False)


def test_the_metrics_timer_writes_the_counters(guest: Guest) -> None:
    guest.run(
        "mkdir -p /var/lib/prometheus/node-exporter && "
        "rm -f /var/lib/prometheus/node-exporter/alfwrapper.prom && "
        "systemctl start alfwrapper-metrics.timer"
    )
    try:
        out = guest.wait("cat /var/lib/prometheus/node-exporter/alfwrapper.prom", seconds=60)
        assert "alfwrapper_packets_total" in out, out
    finally:
        stop(guest, "alfwrapper-metrics.timer", "alfwrapper-metrics.service")


def test_gallery_sshd_tftp_and_git(guest: Guest) -> None:
    guest.run(f"cp {GALLERY}/* /etc/systemd/system/ && systemctl daemon-reload")
    guest.run("systemctl start alfwrapper-sshd.socket")
    try:
        unit = "alfwrapper-sshd@*"
        expect(guest, unit, "answered SSH-2.0-", "banner", ALLOW4, GUEST4, "22", FIRST)
        never_accepted(guest, "alfwrapper-sshd.socket", "22", "banner")
    finally:
        stop(guest, "alfwrapper-sshd.socket")
    guest.run(
        "mkdir -p /srv/tftp && echo 'hello from tftp' > /srv/tftp/hello.txt && "
        "systemctl start alfwrapper-tftp.socket"
    )
    try:
        unit = "alfwrapper-tftp.service"
        tftp_served(guest, unit, "hello from tftp", ALLOW4, GUEST4, "hello.txt")
        expect(
            guest, unit, "answered DATA hello from tftp", "tftp", ALLOW6, GUEST6, "20", "hello.txt"
        )
        expect(guest, unit, "timeout", "tftp", DENY4, GUEST4, "3", "hello.txt")
        expect(guest, unit, "timeout", "tftp", DENY6, GUEST6, "3", "hello.txt")
    finally:
        stop(guest, "alfwrapper-tftp.socket", "alfwrapper-tftp.service")
    if guest.suite == "trixie":
        trixies_tftp_loses_its_first_request_alone(guest, "hello from tftp", "hello.txt")
    guest.run(
        "mkdir -p /srv/git && { [ -d /srv/git/repo.git ] || git init -q --bare "
        "/srv/git/repo.git; } && touch /srv/git/repo.git/git-daemon-export-ok && "
        "systemctl start alfwrapper-git.socket"
    )
    try:
        unit = "alfwrapper-git@*"
        expect(guest, unit, "answered", "git", ALLOW4, GUEST4, "/repo.git", FIRST)
        # Nothing at all reaches a denied peer: systemd never accepts its connection.
        never_accepted(guest, "alfwrapper-git.socket", "/repo.git", "git")
    finally:
        stop(guest, "alfwrapper-git.socket")


def trixies_tftp_loses_its_first_request_alone(guest: Guest, text: str, name: str) -> None:
    """Debian 13's in.tftpd loses the first request it reads with no alfwrapper in front
    too: a plain transient socket unit, the same command."""
    guest.run(
        "systemd-run --unit alf-plain-tftp --socket-property=ListenDatagram=69 "
        "-p StandardInput=socket /usr/sbin/in.tftpd --secure --user tftp "
        "/srv/tftp"
    )
    try:
        tftp_served(guest, "alf-plain-tftp.service", text, ALLOW4, GUEST4, name)
    finally:
        stop(guest, "alf-plain-tftp.socket", "alf-plain-tftp.service")


def test_gallery_nginx_binding_its_own_sockets(guest: Guest) -> None:
    """Debian's nginx under alfwrapper-nginx.service as shipped: no socket unit, nginx
    binds port 80 itself (its default site, IPv4 and IPv6); the allowed host gets the
    page, the denied host's connections time out; after `systemctl reload` too."""
    guest.run(f"cp {GALLERY}/* /etc/systemd/system/ && systemctl daemon-reload")
    unit = "alfwrapper-nginx.service"
    request = "GET / HTTP/1.0\n"
    guest.run(f"systemctl start {unit}")
    try:
        # The wrapper compiles the policy's program before nginx starts and binds.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if guest.client("tcp", ALLOW4, GUEST4, "80", "5", request).startswith("answered"):
                break
            time.sleep(1)
        level = guest.run(f"systemd-analyze security --no-pager {unit} | tail -n 1")
        print(f"{unit}: {level}")
        for _ in range(2):
            expect(guest, unit, "answered HTTP/1.1 200", "tcp", ALLOW4, GUEST4, "80", "10", request)
            expect(guest, unit, "answered HTTP/1.1 200", "tcp", ALLOW6, GUEST6, "80", "10", request)
            for source, target in ((DENY4, GUEST4), (DENY6, GUEST6)):
                # Once in six runs (the first boot of a new image) the denied host's
                # IPv6 SYN was answered with a reset rather than dropped, and never
                # since in five restarts: not understood yet (noted in the commit).
                # Neither is service; the access log below shows nothing reached nginx.
                got = guest.client("tcp", source, target, "80", "3", request)
                if got == "refused":
                    got = guest.client("tcp", source, target, "80", "3", request)
                assert got == "timeout", f"{source}: {got}\n" + guest.journal(unit)
            guest.run(f"systemctl reload {unit}")
        names = guest.run("alfwrapper status alfwrapper-nginx --json")
        assert '"tcp-80"' in names, names
        log = guest.run("cat /var/log/nginx/access.log")
        assert ALLOW4 in log and DENY4 not in log and DENY6 not in log, log
    finally:
        stop(guest, unit)


def test_gallery_dnsmasq_answering_dns_binding_its_own(guest: Guest) -> None:
    """dnsmasq under alfwrapper-dnsmasq.service as shipped, a UDP daemon binding port 53
    itself and then running as the user dnsmasq: the allowed host's queries are
    answered over IPv4 and IPv6, the denied host's never."""
    guest.run(f"cp {GALLERY}/* /etc/systemd/system/ && systemctl daemon-reload")
    guest.run(
        "mkdir -p /etc/alfwrapper && echo 'address=/example.test/192.0.2.99' "
        "> /etc/alfwrapper/dnsmasq.conf"
    )
    unit = "alfwrapper-dnsmasq.service"
    guest.run(f"systemctl start {unit}")
    try:
        deadline = time.monotonic() + 120  # the program compiled, then dnsmasq binds
        while time.monotonic() < deadline:
            if guest.client("dns", ALLOW4, GUEST4, "3", "example.test").startswith("answered"):
                break
            time.sleep(1)
        expect(guest, unit, "answered A 192.0.2.99", "dns", ALLOW4, GUEST4, "5", "example.test")
        expect(guest, unit, "answered A 192.0.2.99", "dns", ALLOW6, GUEST6, "5", "example.test")
        expect(guest, unit, "timeout", "dns", DENY4, GUEST4, "3", "example.test")
        expect(guest, unit, "timeout", "dns", DENY6, GUEST6, "3", "example.test")
        status = guest.run("alfwrapper status alfwrapper-dnsmasq --json")
        assert '"udp-53"' in status, status
        level = guest.run(f"systemd-analyze security --no-pager {unit} | tail -n 1")
        print(f"{unit}: {level}")
    finally:
        stop(guest, unit)


def daemon_served(guest: Guest, unit: str, port: str, want: str, *client: str) -> None:
    """The daemon under ``unit`` answers the allowed host ``want`` over IPv4 and IPv6
    (waiting for a first answer: the wrapper compiles its program before the daemon
    starts), and the denied host's connections time out, IPv4 and IPv6."""
    kind, *rest = client or ("tcp",)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if guest.client(kind, ALLOW4, GUEST4, port, "5", *rest).startswith(want):
            break
        time.sleep(1)
    expect(guest, unit, want, kind, ALLOW4, GUEST4, port, "10", *rest)
    expect(guest, unit, want, kind, ALLOW6, GUEST6, port, "10", *rest)
    for source, target in ((DENY4, GUEST4), (DENY6, GUEST6)):
        got = guest.client(kind, source, target, port, "3", *rest)
        assert got.startswith("timeout"), f"{source}: {got}\n" + guest.journal(unit)


def exposure(guest: Guest, unit: str) -> None:
    level = guest.run(f"systemd-analyze security --no-pager {unit} | tail -n 1")
    print(f"{unit}: {level}")


def served_across_a_reload(guest: Guest, unit: str, port: str, want: str) -> None:
    """daemon_served for an HTTP GET, then `systemctl reload`, then again."""
    for _ in range(2):
        daemon_served(guest, unit, port, want, "tcp", "GET / HTTP/1.0\n")
        guest.run(f"systemctl reload {unit}")
    exposure(guest, unit)


def test_gallery_nginx_on_a_socket_units_sockets(guest: Guest) -> None:
    """Debian's nginx the other way, as shipped: alfwrapper-nginx-handover.socket's
    sockets, IPv4 and IPv6 apart as Debian's default site listens, reach nginx through
    NGINX; no bind supervisor runs; `systemctl reload` keeps them filtered."""
    guest.run(f"cp {GALLERY}/* /etc/systemd/system/ && systemctl daemon-reload")
    unit = "alfwrapper-nginx-handover.service"
    guest.run("systemctl start alfwrapper-nginx-handover.socket " + unit)
    try:
        served_across_a_reload(guest, unit, "80", "answered HTTP/1.1 200")
        journal = guest.journal(unit, 200)
        assert 'using inherited sockets from "3;4;"' in journal, journal
        assert "alfwrapper-bind" not in guest.run("ps -eo args"), guest.run("ps -eo args")
        log = guest.run("cat /var/log/nginx/access.log")
        assert DENY4 not in log and DENY6 not in log, log
        # A listen the socket unit does not give, below 1024: nginx has no
        # CAP_NET_BIND_SERVICE to bind it unfiltered, and keeps its sockets.
        guest.run(
            "sed -i 's/listen 80 default_server;/&\\n\\tlisten 81;/' "
            "/etc/nginx/sites-enabled/default && systemctl reload " + unit
        )
        guest.wait("grep -q ':81 failed (13: Permission denied)' /var/log/nginx/error.log")
        assert ":81 " not in guest.run("ss -ltn")
        daemon_served(guest, unit, "80", "answered HTTP/1.1 200", "tcp", "GET / HTTP/1.0\n")
    finally:
        guest.run("sed -i '/listen 81;/d' /etc/nginx/sites-enabled/default", check=False)
        stop(guest, unit, "alfwrapper-nginx-handover.socket")


def test_gallery_haproxy_taking_its_socket_by_fd(guest: Guest) -> None:
    """HAProxy under alfwrapper-haproxy.service as shipped, its configuration binding
    fd@3, the socket unit's dual-stack port 8088: served and dropped, and still after
    `systemctl reload` (a new worker)."""
    guest.run(f"cp {GALLERY}/* /etc/systemd/system/ && systemctl daemon-reload")
    guest.run(
        "mkdir -p /etc/alfwrapper && printf '%s\\n' defaults '  mode http' "
        "'  timeout client 5s' '  timeout connect 5s' '  timeout server 5s' "
        "'frontend web' '  bind fd@3' '  http-request return status 200 "
        "content-type text/plain string served' > /etc/alfwrapper/haproxy.cfg"
    )
    unit = "alfwrapper-haproxy.service"
    guest.run(f"systemctl start alfwrapper-haproxy.socket {unit}")
    try:
        served_across_a_reload(guest, unit, "8088", "answered HTTP/1.1 200")
    finally:
        stop(guest, unit, "alfwrapper-haproxy.socket")


def test_gallery_apache_redis_and_postgresql_binding_their_own(guest: Guest) -> None:
    """Debian's Apache (port 80, its own configuration, and a graceful restart), Redis
    (6379, as the user redis) and PostgreSQL (Debian's cluster, as the user postgres,
    answering an SSLRequest) under their gallery units as shipped: each binds
    its own sockets; the allowed host is served, the denied host's SYNs dropped."""
    guest.run(f"cp {GALLERY}/* /etc/systemd/system/ && systemctl daemon-reload")
    unit = "alfwrapper-apache2.service"
    guest.run(f"systemctl start {unit}")
    try:
        served_across_a_reload(guest, unit, "80", "answered HTTP/1.1 ")
        assert '"tcp-80"' in guest.run("alfwrapper status alfwrapper-apache2 --json")
    finally:
        stop(guest, unit)
    unit = "alfwrapper-redis.service"
    guest.run(f"systemctl start {unit}")
    try:
        daemon_served(guest, unit, "6379", "answered +PONG", "tcp", "PING")
        assert guest.run("ps -o user= -C redis-server").split() == ["redis"]
        exposure(guest, unit)
    finally:
        stop(guest, unit)
    cluster = guest.run("pg_lsclusters -h | awk '{print $1 \"-\" $2; exit}'").strip()
    unit = f"alfwrapper-postgresql@{cluster}.service"
    guest.run(f"systemctl stop postgresql; systemctl start {unit}")
    try:
        ssl_request = "0000000804d2162f"  # answered S: Debian's cluster has ssl = on
        daemon_served(guest, unit, "5432", "answered S", "bytes", ssl_request)
        assert "postgres" in guest.run("ps -o user= -C postgres").split()
        exposure(guest, unit)
    finally:
        stop(guest, unit)


def test_the_readme_tour_as_written(guest: Guest) -> None:
    """The README's five minutes, on the installed package, each command as written."""
    readme = (HERE.parent.parent / "README.md").read_text()
    tour = readme.split("## Five minutes with it", 1)[1].split("Your own service", 1)[0]
    lines = [
        line
        for block in tour.split("```sh\n")[1:]
        for line in block.split("```", 1)[0].splitlines()
        if line.strip()
    ]
    assert len(lines) >= 9, lines
    try:
        as_written(guest, lines)
    finally:
        stop(guest, "alfwrapper-echo.socket", "alfwrapper-echo.service")


def test_the_guides_opening_examples_as_written(guest: Guest) -> None:
    """The example a guide opens with, where it runs on the package alone (rules and
    policies; operating a running service), each command as written."""
    for guide in ("rules.md", "operating.md"):
        text = (HERE.parent.parent / "docs" / guide).read_text()
        block = text.split("```sh\n", 1)[1].split("```", 1)[0]
        lines = [line for line in block.splitlines() if line.strip()]
        assert len(lines) >= 3, (guide, lines)
        try:
            as_written(guest, lines)
        finally:
            stop(guest, "alfwrapper-echo.socket", "alfwrapper-echo.service")


def as_written(guest: Guest, lines: list[str]) -> None:
    """Each line run as written; its comment says what it must do (`echo hello` back; a
    time-out, never refused; with "...", text its output must hold); any other line
    must succeed."""
    for line in lines:
        command, _, said = line.partition("  #")
        said = said.strip()
        code, out = guest.status(command, timeout=300)
        if said.startswith("echo hello"):
            assert code == 0 and out.strip() == "echo hello", (line, out)
        elif "times out" in said:
            assert code != 0 and "TIMEOUT" in out and "refused" not in out, (line, out)
        elif said.startswith("..."):
            assert code == 0 and said[3:].strip() in out, (line, out)
        else:
            assert code == 0, (line, out)


def test_a_unit_that_cannot_start_stops_its_socket(guest: Guest) -> None:
    a_failing_start_stops_its_socket(guest, "30", 120)
