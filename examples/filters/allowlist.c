/* allowlist.c: a developer's filter, the template to copy (alfwrapper --filter).
 *
 * Passes IPv4 packets whose source is a key of allowed4 and IPv6 packets
 * whose source is a key of allowed6, to the destination ports whose entry in
 * port_limits is open; drops everything else.  Maps are filled with --set
 * (or `set = [...]` in a policy file):
 *
 *   --set allowed4 192.0.2.2 1
 *   --set allowed6 2001:db8:a::2 1
 *   --set port_limits 0 8080,1        struct {u16 port; u8 open;}
 *
 * Return convention: the number of bytes to keep, ALF_PASS (all) or
 * ALF_DROP (0); common.h.  The packet arrives already parsed and checked by
 * alfwrapper (malformed packets never reach a filter); alf_parse_packet()
 * gives the source address, protocol, ports and TCP flags.  Map names
 * starting with subnet_, iface_, knock_ or alf_ are alfwrapper's.
 */
#include "common.h"

struct addr6 {
    u8 bytes[16];
};

struct port_limit {
    u16 port;
    u8 open;
};

BPF_HASH(allowed4, u32, u8, 64);
BPF_HASH(allowed6, struct addr6, u8, 64);
BPF_ARRAY(port_limits, struct port_limit, 4);

int filter(struct __sk_buff *skb)
{
    struct alf_packet pkt = {};
    int family = alf_parse_packet(skb, &pkt);
    u8 *ok = 0;
    if (family == 4) {
        /* Keys are stored a whole 8-byte word at a time (common.h: Keys). */
        u64 key = 0;
        __builtin_memcpy(&key, pkt.addr, 4);
        ok = allowed4.lookup((u32 *)&key);
    } else if (family == 6) {
        union {
            struct addr6 key;
            u64 words[2];
        } k;
        alf_addr_words(pkt.addr, &k.words[0], &k.words[1]);
        ok = allowed6.lookup(&k.key);
    }
    if (!ok || !*ok || !pkt.has_ports)
        return ALF_DROP;
    #pragma unroll
    for (u32 i = 0; i < 4; i++) {
        u64 index = i;
        struct port_limit *limit = port_limits.lookup((u32 *)&index);
        if (limit && limit->open && limit->port == pkt.dport)
            return ALF_PASS;
    }
    return ALF_DROP;
}
