/* lpm_reference.c: the plain BPF LPM trie, for comparison only (not used by alfwrapper).
 * Passes IPv4 packets whose source is in lpm_allow.  Macros: LPM_SIZE. */
#include "common.h"

struct lpm_key4 {
    u32 prefixlen;
    u8 addr[4];
};

BPF_LPM_TRIE(lpm_allow, struct lpm_key4, u32, LPM_SIZE);

int filter(struct __sk_buff *skb)
{
    u8 addr[16] = {};
    if (alf_source_address(skb, addr) != 4)
        return ALF_DROP;
    struct lpm_key4 key = {.prefixlen = 32};
    __builtin_memcpy(key.addr, addr, 4);
    return lpm_allow.lookup(&key) ? ALF_PASS : ALF_DROP;
}
