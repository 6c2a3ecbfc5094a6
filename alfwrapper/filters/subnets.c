/* subnets.c: source-subnet allow/deny filter.
 *
 * Passes an IPv4 or IPv6 packet whose source address the rules allow; drops
 * every other packet, non-IP packets included.  Deny wins over allow; with
 * no allow rules, everything not denied passes.  The wrapper resolves that
 * into one verdict per address block before loading (subnet_table.py), so
 * this program only walks a multibit trie:
 *
 *   subnet_roots  ARRAY[131072] of u32, indexed by the first 16 address bits
 *                 (IPv6 at +65536).
 *   subnet_nodes  HASH of struct subnet_key -> u32, the deeper levels.
 *
 * A node is SUBNET_PASS and/or SUBNET_DESCEND.  SUBNET_DESCEND means "look
 * one level deeper"; where the deeper level has no entry, the node's own
 * SUBNET_PASS bit decides.  Cost: one array lookup plus at most one hash
 * lookup per level, whatever the number of rules.
 *
 * Macros (sizes only; the rules themselves live in the maps):
 *   SUBNET_NODES  max_entries of subnet_nodes (at least 1)
 *   V4_STEPS      SUBNET_STEP(n) for each IPv4 hash level, n = bytes of prefix
 *   V6_STEPS      the same for IPv6
 *
 * Alone, the entry point `filter` returns ALF_PASS or ALF_DROP (common.h).
 * Composed (ALF_PART defined), alfwrapper calls subnets_pass() instead.
 */
#ifndef ALF_SUBNETS_C
#define ALF_SUBNETS_C
#include "common.h"

#ifndef SUBNET_NODES
#define SUBNET_NODES 1
#endif
#ifndef V4_STEPS
#define V4_STEPS
#endif
#ifndef V6_STEPS
#define V6_STEPS
#endif

#define SUBNET_PASS 1
#define SUBNET_DESCEND 2
#define SUBNET_ROOT_SLOTS 65536

struct subnet_key {
    u8 nbytes;   /* how many leading address bytes are in addr */
    u8 family;   /* 4 or 6 */
    u8 pad[2];
    u8 addr[16]; /* leading bytes of the address, the rest zero */
};

BPF_ARRAY(subnet_roots, u32, 2 * SUBNET_ROOT_SLOTS);
BPF_HASH(subnet_nodes, struct subnet_key, u32, SUBNET_NODES);

static __always_inline u32 subnet_child(struct subnet_key *key, u32 node)
{
    u32 *child = subnet_nodes.lookup(key);
    return child ? *child : (node & SUBNET_PASS);
}

#define SUBNET_STEP(NB)                                \
    if (node & SUBNET_DESCEND) {                       \
        key.nbytes = NB;                               \
        __builtin_memcpy(key.addr, addr, NB);          \
        node = subnet_child(&key, node);               \
    }

/* Does the subnet rule set pass a packet from addr? */
static __always_inline int subnets_pass(int family, const u8 addr[16])
{
    u32 index = ((u32)addr[0] << 8) | addr[1];
    if (family == 6)
        index += SUBNET_ROOT_SLOTS;
    u32 *root = subnet_roots.lookup(&index);
    if (!root)
        return 0;
    u32 node = *root;
    struct subnet_key key = {};
    key.family = family;
    if (family == 4) {
        V4_STEPS
    } else {
        V6_STEPS
    }
    return node & SUBNET_PASS;
}

#ifndef ALF_PART /* alone, not composed with other parts by alfwrapper */
int filter(struct __sk_buff *skb)
{
    u8 addr[16] = {};
    int family = alf_source_address(skb, addr);
    if (!family)
        return ALF_DROP;
    return subnets_pass(family, addr) ? ALF_PASS : ALF_DROP;
}
#endif
#endif /* ALF_SUBNETS_C */
