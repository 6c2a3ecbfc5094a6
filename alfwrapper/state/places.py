"""Where a service's and a socket's state are in a tree: the folders' names.
A tree (trust.ROOT, or a user's: user_base) holds, for each service:

    SERVICE/                          0700 (dots written %2E)
      knock-HASH/                     knock state of the sockets sharing knock rules
      knock-spa/                      the service's SPA replay table (parts.SPA_TABLE)
      sock-COOKIE/                    one socket, by its SO_COOKIE
        dispatch                      the program attached and locked on the socket
        slot                          PROG_ARRAY[1]: the policy program in force
        meta                          ARRAY[1]: JSON about the socket (meta.py)
        counters                      PERCPU_ARRAY: verdicts by reason
        runtime, runtime_count        LPM_TRIE and ARRAY[1]: live allow and deny (runtime.py)
"""

from __future__ import annotations

from pathlib import Path

from alfwrapper.policy.rules import valid_service
from alfwrapper.record import Record
from alfwrapper.state.trust import ROOT, USERS_ROOT

# Early drop's tree (sets/early.py): a folder an interface, IFNAME@NETNS (the network
# namespace's cookie in hex).  Here, so that a start asks whether early drop is in use
# in its namespace without importing what early drop needs.
EARLY_ROOT = Path("/sys/fs/bpf/alfwrapper-early")


def early_folder(ifname: str, netns: int) -> Path:
    return EARLY_ROOT / f"{ifname}@{netns:x}"


def early_in(netns: int) -> bool:
    """Has some interface of this network namespace early drop?"""
    try:
        return any(p.name.endswith(f"@{netns:x}") for p in EARLY_ROOT.iterdir())
    except OSError:
        return False  # no tree, or not ours to read (a user's start: not told)


def user_base(uid: int, top: Path = USERS_ROOT) -> Path:
    """Where the state of user ``uid``'s services is kept."""
    return top / str(uid)


def folder_name(service: str) -> str:
    """A service's folder: bpffs reserves names with a dot (EPERM), so dots are
    written %2E."""
    return service.replace(".", "%2E")


def service_of(folder: str) -> str:
    return folder.replace("%2E", ".")


class SocketState(Record):
    """Where one socket's pinned state is."""

    service: str
    cookie: int
    base: Path = ROOT  # the tree it is in: ROOT, or a user's (user_base)

    @property
    def dir(self) -> Path:
        return self.service_dir / f"sock-{self.cookie}"

    @property
    def service_dir(self) -> Path:
        return self.base / folder_name(self.service)

    def path(self, name: str) -> str:
        return str(self.dir / name)


def is_service_folder(path: Path) -> bool:
    """A folder alfwrapper made for a service: not the users' trees, nor anything
    else someone left in the tree (which would otherwise break every listing)."""
    name = service_of(path.name)
    return path.is_dir() and valid_service(name)
