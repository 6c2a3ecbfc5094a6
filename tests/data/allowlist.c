/* allowlist.c: a developer-defined filter, test data.  It reads the ports
 * with bpf_skb_load_bytes(skb, 0, ...), as a filter written for a socket
 * does, on purpose: the tests check that alfwrapper keeps that meaning in
 * test runs too (filters/developer.h).  examples/filters/allowlist.c is the
 * same filter written the recommended way, with alf_parse_packet().
 *
 * Passes IPv4 packets whose source is a key of allowed4, IPv6 packets whose
 * source is a key of allowed6, and only to destination ports whose entry in
 * port_limits says so; drops everything else.  Maps are filled with --set:
 *
 *   --set allowed4 192.0.2.2 1
 *   --set allowed6 2001:db8:a::2 1
 *   --set port_limits 0 8080,1        struct {u16 port; u8 open;}
 *
 * Returns ALF_PASS or ALF_DROP (common.h).
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
    u8 addr[16] __attribute__((aligned(8))) = {};
    int family = alf_source_address(skb, addr);
    u8 *ok = 0;
    if (family == 4) {
        /* Keys are stored a whole 8-byte word at a time (common.h: Keys). */
        u64 key = 0;
        __builtin_memcpy(&key, addr, 4);
        ok = allowed4.lookup((u32 *)&key);
    } else if (family == 6) {
        union {
            struct addr6 key;
            u64 words[2];
        } k;
        alf_addr_words(addr, &k.words[0], &k.words[1]);
        ok = allowed6.lookup(&k.key);
    }
    if (!ok || !*ok)
        return ALF_DROP;
    u8 ports[4] = {};
    if (bpf_skb_load_bytes(skb, 0, ports, 4) < 0)
        return ALF_DROP;
    u16 dport = ((u16)ports[2] << 8) | ports[3];
    #pragma unroll
    for (u32 i = 0; i < 4; i++) {
        u64 index = i;
        struct port_limit *limit = port_limits.lookup((u32 *)&index);
        if (limit && limit->open && limit->port == dport)
            return ALF_PASS;
    }
    return ALF_DROP;
}
