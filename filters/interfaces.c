/* interfaces.c: ingress-interface allow-list.
 *
 * Passes a packet that arrived on one of the allowed interfaces and drops
 * every other one.  Loopback is an interface like any other: traffic over
 * `lo` passes only if `lo` is allowed.
 *
 *   iface_allowed  HASH u32 ifindex -> u32 (1), O(1) whatever its size.
 *
 * The wrapper fills it from interface names, and a small watcher process
 * keeps it following those names: an interface that is deleted leaves the
 * map at once, one re-created under the name enters it with its new index
 * (interfaces.py, watcher.py).
 *
 *   iface_alive    PROG_ARRAY[1]: the composed program's body.  Composed,
 *                  the entry point tail-calls it and drops the packet if the
 *                  call fails.  Only the watcher holds this array open, and
 *                  the kernel empties a program array when its last user
 *                  reference goes: if the watcher dies, no interface passes
 *                  (fail closed) rather than the map freezing as it was.
 *   iface_lease    ARRAY[1] u64: until when (CLOCK_MONOTONIC, ns) the map is
 *                  known to be current.  The watcher renews it every second
 *                  for IFACE_LEASE_NS ahead; a watcher that is stopped
 *                  (SIGSTOP, by an application of its own user) stops
 *                  renewing, and after that no interface passes either.
 *
 * Macros: IFACE_SLOTS, max_entries of iface_allowed (parts.py's Interfaces).
 * The coarse clock read per packet (Linux 5.11) is a jiffy behind at most.
 * alfwrapper composes it: interfaces_pass() says whether the packet's
 * interface is allowed.
 */
#ifndef ALF_INTERFACES_C
#define ALF_INTERFACES_C
#include "common.h"

#ifndef IFACE_SLOTS
#error "IFACE_SLOTS is defined by parts.py (Interfaces.MIN_SLOTS or more)"
#endif

BPF_HASH(iface_allowed, u32, u32, IFACE_SLOTS);
BPF_PROG_ARRAY(iface_alive, 1);
BPF_ARRAY(iface_lease, u64, 1);

/* Did the packet arrive on an allowed interface, by a map that is current? */
static __always_inline int interfaces_pass(struct __sk_buff *skb)
{
    u64 zero = 0; /* stored whole (common.h) */
    u64 *until = iface_lease.lookup((u32 *)&zero);
    if (!until || bpf_ktime_get_coarse_ns() > *until)
        return 0;
    u64 ifindex = skb->ingress_ifindex;
    return iface_allowed.lookup((u32 *)&ifindex) != NULL;
}

#endif /* ALF_INTERFACES_C */
