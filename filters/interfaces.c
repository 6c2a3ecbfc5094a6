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
 *
 * Macros: IFACE_SLOTS, max_entries of iface_allowed (default 4096).
 * alfwrapper composes it: interfaces_pass() says whether the packet's
 * interface is allowed.
 */
#ifndef ALF_INTERFACES_C
#define ALF_INTERFACES_C
#include "common.h"

#ifndef IFACE_SLOTS
#define IFACE_SLOTS 4096
#endif

BPF_HASH(iface_allowed, u32, u32, IFACE_SLOTS);
BPF_PROG_ARRAY(iface_alive, 1);

/* Did the packet arrive on an allowed interface? */
static __always_inline int interfaces_pass(struct __sk_buff *skb)
{
    u64 ifindex = skb->ingress_ifindex; /* stored whole (common.h) */
    return iface_allowed.lookup((u32 *)&ifindex) != NULL;
}

#endif /* ALF_INTERFACES_C */
