"""One side of a race between starts and gcs: ROUNDS times, a process of its own (as a
start is) collects what gone sockets left, as every start does first, then makes the
state of a new socket of SERVICE, and ends.  Prints how many of them failed.

    python gc_race.py SERVICE ROUNDS
"""

import os
import socket
import sys
import traceback

from alfwrapper import state

service, rounds = sys.argv[1], int(sys.argv[2])
state.live_cookies()  # its modules loaded once, for every child
failed = 0
for _ in range(rounds):
    child = os.fork()
    if child == 0:
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
                state.store_in_use().gc()
                state.store_in_use().create(service, sock, "race_t0")
            os._exit(0)
        except BaseException:  # noqa: BLE001  (a forked child never returns into pytest)
            traceback.print_exc()
            os._exit(1)
    failed += os.waitpid(child, 0)[1] != 0
print(f"failed {failed}")
