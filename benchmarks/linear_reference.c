/* linear_reference.c: a re-implementation of the 2018 proof of concept's matching,
 * for comparison only: for each rule, a hash lookup by its index and a prefix
 * compare, unrolled, IPv6, at most 23 rules (where the original stopped).
 * Macros: RULES (1 to 23).  Passes packets whose source matches a rule. */
#include "common.h"

struct linear_rule {
    u64 addr[2];
    u64 mask[2];
};

BPF_HASH(linear_rules, u32, struct linear_rule, 23);

int filter(struct __sk_buff *skb)
{
    u64 addr[2] = {};
    if (alf_source_address(skb, (u8 *)addr) != 6)
        return ALF_DROP;
    #pragma unroll
    for (u32 i = 0; i < RULES; i++) {
        u32 index = i;
        struct linear_rule *rule = linear_rules.lookup(&index);
        if (rule && ((addr[0] ^ rule->addr[0]) & rule->mask[0]) == 0 &&
            ((addr[1] ^ rule->addr[1]) & rule->mask[1]) == 0)
            return ALF_PASS;
    }
    return ALF_DROP;
}
