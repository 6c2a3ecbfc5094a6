"""Sockets the wrapper creates from --listen / --listen-datagram.

Creation is split in two so the filter goes on in between: ``open_socket``
makes an unbound socket, the caller attaches the filter, then ``bind_socket``
binds (and listens).  No packet can reach the socket before it is filtered.
"""

from __future__ import annotations

import errno
import socket

from alfwrapper.errors import EX_NOPERM, EX_OSERR, AlfError
from alfwrapper.policy.rules import ListenSpec


def open_socket(spec: ListenSpec) -> socket.socket:
    family = socket.AF_INET6 if spec.family == 6 else socket.AF_INET
    kind = socket.SOCK_STREAM if spec.kind == "stream" else socket.SOCK_DGRAM
    try:
        sock = socket.socket(family, kind)
    except OSError as err:
        raise AlfError(
            f"creating {spec}",
            err.strerror or str(err),
            "is IPv6 disabled on this host?"
            if family == socket.AF_INET6
            else "run `alfwrapper doctor`",
            EX_OSERR,
        ) from None
    if family == socket.AF_INET6 and spec.host == "::":
        # [::]:PORT means both families, whatever net.ipv6.bindv6only says.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    if kind == socket.SOCK_STREAM:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def bind_socket(sock: socket.socket, spec: ListenSpec) -> None:
    try:
        sock.bind((spec.host, spec.port))
        if spec.kind == "stream":
            sock.listen(socket.SOMAXCONN)
    except OSError as err:
        hints = {
            errno.EADDRINUSE: "another socket holds that port; stop it or choose another port",
            errno.EADDRNOTAVAIL: "that address is not configured on this host",
            errno.EACCES: "ports below 1024 need CAP_NET_BIND_SERVICE; let systemd bind them",
        }
        code = EX_NOPERM if err.errno == errno.EACCES else EX_OSERR
        raise AlfError(
            f"binding {spec}",
            err.strerror or str(err),
            hints.get(err.errno or 0, "check the address"),
            code,
        ) from None
