#!/usr/bin/python3
"""A daemon trying to get a receiving socket past alfwrapper's bind interception, run as
its COMMAND.  Each way it tries, then it serves what it got (UDP echo, TCP accept) and
prints one line for each packet that reached it, as the echo server does:

    binder.py race PORT         one thread binds a UDP socket to PORT while another
                                swaps the fd between a UDP and a TCP socket (dup2),
                                200 times, each time on PORT + i
    binder.py autobind          TCP listen with no bind (the kernel picks the port)
    binder.py workers PORT N    N forked workers, each binding UDP PORT + i
    binder.py io_uring          io_uring_setup(2)
    binder.py after-signal PORT binds UDP PORT once SIGUSR1 comes (after the
                                supervisor was killed)
    binder.py privileged PORT   binds UDP PORT (below 1024: run without capabilities)
    binder.py unix FOLDER       binds a Unix socket by a relative path in FOLDER,
                                with umask 077

It prints "bound udp|tcp PORT" for each socket it got, "refused WHAT ERRNO" for each call
refused, then "ready", then "udp NAME PEER MESSAGE" / "tcp NAME PEER MESSAGE" lines."""

import ctypes
import errno
import os
import selectors
import signal
import socket
import sys
import threading
import time

LIBC = ctypes.CDLL(None, use_errno=True)


def say(*words: object) -> None:
    """One line in one write(2): forked workers share the pipe."""
    os.write(1, (" ".join(map(str, words)) + "\n").encode())


def dual(kind: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, kind)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    return sock


def swap(stop: threading.Event, udp: socket.socket, tcp: socket.socket, fd: int) -> None:
    n = 0
    while not stop.is_set() and n < 10_000:
        os.dup2((udp if n % 2 else tcp).fileno(), fd)
        n += 1


def race(base: int) -> list[socket.socket]:
    """Bind fd F to PORT while another thread dup2s a TCP or a UDP socket onto F."""
    got = []
    for i in range(200):
        udp, tcp = dual(socket.SOCK_DGRAM), dual(socket.SOCK_STREAM)
        target = dual(socket.SOCK_DGRAM)
        fd = target.fileno()
        stop = threading.Event()

        thread = threading.Thread(target=swap, args=(stop, udp, tcp, fd))
        thread.start()
        try:
            target.bind(("::", base + i))
        except OSError as err:
            say("refused bind", err.errno)
        stop.set()
        thread.join()
        for sock in (udp, tcp, target):
            try:
                if sock.getsockname()[1]:
                    got.append(sock)
                    continue
            except OSError:
                pass
            sock.close()
    return got


def main() -> int:  # noqa: C901
    how = sys.argv[1]
    got: list[socket.socket] = []
    if how == "race":
        got = race(int(sys.argv[2]))
    elif how == "autobind":
        sock = dual(socket.SOCK_STREAM)
        sock.listen(8)
        got = [sock]
    elif how == "workers":
        base, count = int(sys.argv[2]), int(sys.argv[3])
        for i in range(count):
            if os.fork() == 0:
                sock = dual(socket.SOCK_DGRAM)
                try:
                    sock.bind(("::", base + i))
                except OSError as err:
                    say("refused bind", err.errno)
                    os._exit(1)
                say("bound", "udp", base + i)
                while True:  # each worker echoes what reaches it, as the main one does
                    data, peer = sock.recvfrom(100)
                    say("udp", f"w{i}", peer[0].removeprefix("::ffff:"), data.decode().strip())
                    sock.sendto(b"echo " + data, peer)
        time.sleep(1)
    elif how == "io_uring":
        params = ctypes.create_string_buffer(120)
        fd = LIBC.syscall(425, 8, params)
        say("refused io_uring" if fd < 0 else "got io_uring", ctypes.get_errno() if fd < 0 else fd)
    elif how == "privileged":  # a port below 1024, without CAP_NET_BIND_SERVICE
        sock = dual(socket.SOCK_DGRAM)
        try:
            sock.bind(("::", int(sys.argv[2])))
            got = [sock]
        except OSError as err:
            say("refused bind", err.errno)
    elif how == "unix":  # a Unix socket by a relative path, in a folder of its own
        os.chdir(sys.argv[2])
        os.umask(0o077)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind("daemon.sock")
        sock.listen(4)
        say("unix", oct(os.stat("daemon.sock").st_mode & 0o777))
    elif how == "after-signal":
        seen = threading.Event()
        signal.signal(signal.SIGUSR1, lambda *_: seen.set())
        say("waiting")
        seen.wait(60)
        sock = dual(socket.SOCK_DGRAM)
        try:
            sock.bind(("::", int(sys.argv[2])))
            got = [sock]
        except OSError as err:
            say("refused bind", err.errno, errno.errorcode.get(err.errno, ""))
    for sock in got:  # the kind of the socket its fd names now (a swap changed some)
        kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        say("bound", "udp" if kind == socket.SOCK_DGRAM else "tcp", sock.getsockname()[1])
    say("ready")
    select = selectors.DefaultSelector()
    for sock in got:
        sock.setblocking(False)
        select.register(sock, selectors.EVENT_READ)
    while got:
        for key, _ in select.select():
            sock = key.fileobj
            try:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM:
                    conn, peer = sock.accept()
                    conn.settimeout(2)
                    data = conn.recv(100)
                    say("tcp", "any", peer[0].removeprefix("::ffff:"), data.decode().strip())
                    conn.sendall(b"echo " + data)
                    conn.close()
                else:
                    data, peer = sock.recvfrom(100)
                    say("udp", "any", peer[0].removeprefix("::ffff:"), data.decode().strip())
                    sock.sendto(b"echo " + data, peer)
            except OSError:
                continue
    while True:
        time.sleep(60)


if __name__ == "__main__":
    sys.exit(main())
