"""Named sets: lists of prefixes kept once for the host, which any number of services
name (allow-set, deny-set) and which change while they run (alfwrapper set).

A set is a folder in a pinned tree of its own (alfwrapper/state/), which belongs to the
user alfwrapper-sets: the CrowdSec bouncer runs as it, so a bouncer taken over by
what it reads from the network reaches the sets and nothing of the services':

    /sys/fs/bpf/alfwrapper-sets/NAME/
      hosts     HASH: whole addresses (/32 and /128) -> expiry
      ranges    LPM_TRIE: every shorter prefix -> expiry
      sieve     ARRAY: a Bloom filter of the whole addresses, a word each (sets.c)
      hosts_at  ARRAY_OF_MAPS: one slot, the hosts map in force (it grows)

Every program that names the set holds these maps (sets.c reads them through its
arrays of maps), so a change here reaches every such service at its next packet,
and twenty services share one copy.  The sieve is what keeps a set cheap for a
packet: an address's two bits go in before its entry does, and are taken out only
by a rebuild from what the hash holds (a resync, a flush, a sweep, or after as many
removals as the sieve has words), so no entry ever lacks its bits; a removed
entry's bits left in place cost an address that shares them a hash lookup.

An expiry is the kernel's monotonic clock in ns (what bpf_ktime_get_coarse_ns()
reads), 0 for none: an entry lapses without a timer, and `set list` and the next
add past a full map remove lapsed entries.

A set comes from `alfwrapper set create NAME [FILE]`, or, the first time a service
names it, from /etc/alfwrapper/sets/NAME.list (one CIDR a line, # comments) if
that file exists.  Its maps are filled and pinned in a folder of their own
(NAME~making), which one rename puts in place, so a set is there whole or not at
all (create).

The package, a module a job, each importing only those above it here:

    bloom.py     the sieve: a blocked Bloom filter (its layout: bpf/parts.py)
    tree.py      where sets live: the tree, a set's folder, pins, lock and slot
    content.py   what a set holds: entries, their keys and values, growth
    creation.py  a set made whole, mended, made from its list file for a start

What other layers use is named below; the rest is the modules' own.
"""

from alfwrapper.sets.content import (
    NotWhole,
    add,
    assign,
    count,
    delete,
    entries,
    flush,
    hold,
    holding,
    load_bulk,
    now_ns,
    sweep,
)
from alfwrapper.sets.creation import check_env, create, fill_env, read_list
from alfwrapper.sets.tree import (
    DEFAULT_SIZE,
    check_name,
    collect_unfinished,
    destroy,
    exists,
    list_file,
    make_tree,
    names,
    open_role,
    root,
    use_root,
)

__all__ = [
    "DEFAULT_SIZE",
    "NotWhole",
    "add",
    "assign",
    "check_env",
    "check_name",
    "collect_unfinished",
    "count",
    "create",
    "delete",
    "destroy",
    "entries",
    "exists",
    "fill_env",
    "flush",
    "hold",
    "holding",
    "list_file",
    "load_bulk",
    "make_tree",
    "names",
    "now_ns",
    "open_role",
    "read_list",
    "root",
    "sweep",
    "use_root",
]
