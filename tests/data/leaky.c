/* leaky.c: test data, a filter the verifier takes from root but refuses to a loader
 * with CAP_BPF alone (the shipped units, the loader): it writes a map value's
 * address into the map, a pointer leak that only CAP_PERFMON allows.  Passes
 * every packet (ALF_PASS). */
#include "common.h"

BPF_ARRAY(leak, u64, 1);

int filter(struct __sk_buff *skb)
{
    u64 zero = 0;
    u64 *slot = leak.lookup((u32 *)&zero);
    if (slot)
        *slot = (u64)slot;
    return ALF_PASS;
}
