"""Capability numbers (linux/capability.h) and which of them reach a filter: facts
only, no calls, so that the command line's help can name them without loading
what privileges.py needs to act on them."""

CAP_CHOWN = 0
CAP_DAC_OVERRIDE = 1
CAP_FOWNER = 3
CAP_SETGID = 6
CAP_SETUID = 7
CAP_NET_ADMIN = 12
CAP_SYS_MODULE = 16
CAP_SYS_CHROOT = 18
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39
# What reaches the filter, its maps or those who hold them; never the application's.
# (docs/daemons.md's table of them is checked against this one: tests/unit/test_confinement.py.)
REACHES_FILTER = {
    CAP_BPF: ("CAP_BPF", "loads programs and makes maps"),
    CAP_SYS_ADMIN: ("CAP_SYS_ADMIN", "finds programs and maps by id, mounts a BPF file "
                    "system, enters other namespaces"),
    CAP_PERFMON: ("CAP_PERFMON", "reads kernel memory through BPF"),
    CAP_SYS_PTRACE: ("CAP_SYS_PTRACE", "would reach into the interface watcher, which "
                     "holds the maps and CAP_BPF"),
    CAP_SYS_MODULE: ("CAP_SYS_MODULE", "loads kernel code"),
    CAP_NET_ADMIN: ("CAP_NET_ADMIN", "rewrites source addresses (NAT) before the filter "
                    "sees them, renames interfaces that --interface rules follow"),
}  # fmt: skip
REACHES_FILTER_MASK = sum(1 << cap for cap in REACHES_FILTER)
CAP_KILL = 5
# What gets past the file permissions that guard pinned state (state/), or past
# the user that guards the interface watcher and the log forwarder against signals.
PAST_GUARDS = {
    CAP_CHOWN: "CAP_CHOWN",
    CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE",
    CAP_FOWNER: "CAP_FOWNER",
    CAP_KILL: "CAP_KILL",
    CAP_SETUID: "CAP_SETUID",
}
CAP_LAST = 63
