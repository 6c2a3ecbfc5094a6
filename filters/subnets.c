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
 *   SUBNET_ROOT_SLOTS, SUBNET_PASS, SUBNET_DESCEND: constants shared with
 *                 subnet_table.py, handed over from there
 *
 * alfwrapper composes it: subnets_pass() says whether the rules pass a source.
 */
#ifndef ALF_SUBNETS_C
#define ALF_SUBNETS_C
#include "common.h"

/* Sizes and layouts come from alfwrapper (parts.py), defined there once:
 * SUBNET_NODES, SUBNET_ROOT_SLOTS, SUBNET_PASS, SUBNET_DESCEND, V4_STEPS,
 * V6_STEPS as -D settings, and struct subnet_key as generated C before this
 * file. */
#if !defined(SUBNET_NODES) || !defined(SUBNET_ROOT_SLOTS) || !defined(SUBNET_PASS)
#error "subnets.c is compiled by alfwrapper, which defines its settings"
#endif

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

#endif /* ALF_SUBNETS_C */
