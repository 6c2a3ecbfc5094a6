/* no_options.c: test data, a developer's filter that reads more than addresses: it
 * drops IPv4 packets that carry IP options, and passes every other packet.  A test
 * run on headers made up from a queued datagram's addresses has no options, so
 * such a filter cannot judge what was queued before it (backlog.py).
 * Returns ALF_PASS or ALF_DROP (common.h). */
#include "common.h"

int filter(struct __sk_buff *skb)
{
    u64 first = 0; /* version and header length; stored whole (common.h) */
    if (bpf_skb_load_bytes(skb, SKF_NET_OFF, &first, 1) < 0)
        return ALF_DROP;
    if (((first >> 4) & 0xf) == 4 && (first & 0xf) > 5)
        return ALF_DROP;
    return ALF_PASS;
}
