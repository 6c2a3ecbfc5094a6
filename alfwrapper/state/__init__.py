"""Per-socket state that outlives the wrapper, pinned in bpffs, and the one place it is kept.

Restarts, reloads, live allow/deny, status and gc all find a socket's state here by
its cookie, in one of three trees:

    /sys/fs/bpf/alfwrapper/             0700, owned by the alfwrapper user (root's services)
      SERVICE/sock-COOKIE/...           a service's sockets' state (places.py)
    /sys/fs/bpf/alfwrapper-users/       0700, owned by the alfwrapper-loader user
      UID/SERVICE/...                   the same, for the services of user UID, kept by
                                        the loader (loader/) on that user's requests
    /sys/fs/bpf/alfwrapper-sets/        0700, owned by the alfwrapper-sets user: the
      NAME/hosts, NAME/ranges           named sets (sets/), which the CrowdSec
                                        bouncer runs as, reaching nothing else

The modules, from the ground up: trust (whose the trees are, each folder checked),
places (the folders' names, SocketState), liveness (sock_diag, /proc), inuse (the
store meta and runtime rules open pins through), meta, runtime (live allow and deny),
lock (a service folder's flock), collection (gc), store (Store, the store in use).
Other layers use what is named here.
"""

from __future__ import annotations

from alfwrapper.state.inuse import open_pin
from alfwrapper.state.liveness import (
    alive,
    live_cookies,
    live_everywhere,
    netns_cookie,
    socket_cookie,
)
from alfwrapper.state.meta import META_SIZE, check_meta_room, mark_judged, read_meta, write_meta
from alfwrapper.state.places import EARLY_ROOT, SocketState, early_folder, early_in, user_base
from alfwrapper.state.runtime import inherit_runtime, runtime_key, runtime_rules, set_runtime
from alfwrapper.state.store import Store, Taken, store_in_use, use_store, user_stores
from alfwrapper.state.trust import (
    OWNER,
    ROOT,
    SETS_ROOT,
    USERS_ROOT,
    check_bpffs,
    give_dir,
    hidden,
    modes,
    owner,
    see_sets_tree,
    see_users_tree,
    state_root,
    trusted_dir,
)

__all__ = [
    "EARLY_ROOT",
    "early_folder",
    "early_in",
    "META_SIZE",
    "OWNER",
    "ROOT",
    "SETS_ROOT",
    "USERS_ROOT",
    "SocketState",
    "Store",
    "Taken",
    "alive",
    "check_bpffs",
    "check_meta_room",
    "give_dir",
    "hidden",
    "inherit_runtime",
    "live_cookies",
    "live_everywhere",
    "mark_judged",
    "modes",
    "netns_cookie",
    "open_pin",
    "owner",
    "read_meta",
    "runtime_key",
    "runtime_rules",
    "see_sets_tree",
    "see_users_tree",
    "set_runtime",
    "socket_cookie",
    "state_root",
    "store_in_use",
    "trusted_dir",
    "use_store",
    "user_base",
    "user_stores",
    "write_meta",
]
