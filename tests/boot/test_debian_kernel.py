"""The boot tier on Debian 12's own kernel: the same guest image booted by qemu with
Debian's 6.1 (emulated, TCG: /dev/kvm here is nested PVM, which cannot boot it), the
`.deb` installed, the echo unit as shipped serving allowed clients and dropping denied
ones, the loader compiling and loading for an ordinary user, and a unit whose every
start fails stopping its socket instead of being started for each waiting client.

Under TCG everything is 10 to 30 times slower: a start compiles for about a minute."""

from __future__ import annotations

from guest import Guest, a_failing_start_stops_its_socket, served_and_dropped, stop

FIRST = "400"  # seconds for a first client: the service compiles under emulation
ECHO = "alfwrapper-echo.service"


def test_echo_on_debians_own_kernel(guest61: Guest) -> None:
    g = guest61
    assert g.run("uname -r").startswith("6.1."), g.run("uname -r")
    code, out = g.status("alfwrapper doctor", timeout=900)
    assert code == 0, out
    g.run("systemctl start alfwrapper-echo.socket")
    try:
        served_and_dropped(g, ECHO, 8080, first=FIRST)
    finally:
        stop(g, "alfwrapper-echo.socket", ECHO)


def test_the_loader_on_debians_own_kernel(guest61: Guest) -> None:
    g = guest61
    g.run("id alfcheck >/dev/null 2>&1 || useradd -m alfcheck")
    g.run("systemctl start alfwrapper-loader.socket")
    try:
        code, out = g.status("cd / && runuser -u alfcheck -- alfwrapper doctor", timeout=900)
        assert code == 0 and "through the loader" in out, out + g.journal(
            "alfwrapper-loader.service"
        )
    finally:
        stop(g, "alfwrapper-loader.socket", "alfwrapper-loader.service")


def test_a_slow_failing_start_stops_its_socket(guest61: Guest) -> None:
    """Where a start takes seconds (here, emulation), systemd's default start limit (5
    in 10 s) never hits, and a waiting client had the service started again and again.
    The shipped limit (10 in 5 minutes) stops it."""
    a_failing_start_stops_its_socket(guest61, "5", 400)
