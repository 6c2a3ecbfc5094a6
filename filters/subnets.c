/* subnets.c: source-subnet allow/deny filter.
 *
 * Passes an IPv4 or IPv6 packet whose source address the rules allow; drops
 * every other packet, non-IP packets included.  Deny wins over allow; with
 * no allow rules, everything not denied passes.  The wrapper resolves that
 * into one verdict per address block before loading (subnet_table.py), so
 * this program only reads tables:
 *
 *   subnet_v4      lines of 64 IPv4 blocks (mmapable ARRAY of struct
 *                  subnet_line), indexed by the first V4_ROOT_BITS bits of a
 *                  source: per block a DESCEND and a PASS bit, and per line
 *                  the index of its first leaf.
 *   subnet_leaves  ARRAY of u64 (mmapable): V4_LEAVES bitmaps of V4_LEAF_BYTES
 *                  bytes, end to end, one bit per address of a block the rules
 *                  split; a block's leaf is its line's first plus the DESCEND
 *                  bits before it.  Read a word at a time, by lookup: a pointer
 *                  moved by a variable offset into a map value would make a
 *                  verifier without CAP_PERFMON stop merging paths that differ
 *                  in any number (explore_alu_limits), for the whole program.
 *   subnet_roots   ARRAY[SUBNET_ROOT_SLOTS] of u32, indexed by the first 16
 *                  bits of an IPv6 source.
 *   subnet_v6      ARRAY[V6_BUCKETS] of one-cache-line buckets (mmapable): the
 *                  IPv6 levels of up to 8 bytes, each a region of buckets of 7
 *                  (key, value) slots, keyed by the address's first bytes.
 *   subnet_nodes   HASH of struct subnet_key -> u32, the IPv6 levels deeper
 *                  than 8 bytes.
 *
 * IPv4 costs one line read and at most one leaf read.  For IPv6 a node is
 * SUBNET_PASS and/or SUBNET_DESCEND; SUBNET_DESCEND means "look one level
 * deeper", and where the deeper level has no entry, the node's own
 * SUBNET_PASS bit decides.  An entry exists only under a node that descends,
 * so the deepest entry found decides: the bucket levels are probed each on
 * its own (no read waits for another's), one cache line each (a second only
 * past a full bucket), then any deeper levels one hash lookup each.  None of
 * it depends on the number of rules.
 *
 * Macros (sizes only; the rules themselves live in the maps):
 *   V4_ROOT_BITS, V4_LEAVES, V4_LEAF_BYTES  the IPv4 table's shape
 *   SUBNET_NODES  max_entries of subnet_nodes (at least 1)
 *   V6_BUCKETS    max_entries of subnet_v6 (at least 1)
 *   V6_STEPS      SUBNET_PROBE(n, offset, bits, m1, m2) for each bucket level,
 *                 then SUBNET_STEP(n) for each hash level, n = bytes of prefix
 *   SUBNET_ROOT_SLOTS, SUBNET_PASS, SUBNET_DESCEND:
 *                 constants shared with subnet_table.py, handed over from there
 *
 * alfwrapper composes it: subnets_pass() says whether the rules pass a source.
 */
#ifndef ALF_SUBNETS_C
#define ALF_SUBNETS_C
#include "common.h"

/* Sizes and layouts come from alfwrapper (parts.py), defined there once:
 * the macros above as -D settings, and struct subnet_key as generated C
 * before this file. */
#if !defined(SUBNET_NODES) || !defined(SUBNET_ROOT_SLOTS) || !defined(V4_ROOT_BITS)
#error "subnets.c is compiled by alfwrapper, which defines its settings"
#endif

struct subnet_line {
    u64 descend;
    u64 pass;
    u64 first_leaf;
    u64 pad; /* 32 bytes: a line never straddles two cache lines */
};

BPF_F_TABLE("array", u32, struct subnet_line, subnet_v4, 1 << (V4_ROOT_BITS - 6), BPF_F_MMAPABLE);
#define V4_LEAF_WORDS (V4_LEAF_BYTES / 8)
BPF_F_TABLE("array", u32, u64, subnet_leaves, V4_LEAVES * V4_LEAF_WORDS, BPF_F_MMAPABLE);
struct subnet_bucket {
    u64 key[7];
    u64 tail; /* byte i: slot i's value (i < 7); byte 7: how many slots are used */
};

BPF_ARRAY(subnet_roots, u32, SUBNET_ROOT_SLOTS);
BPF_F_TABLE("array", u32, struct subnet_bucket, subnet_v6, V6_BUCKETS, BPF_F_MMAPABLE);
BPF_HASH(subnet_nodes, struct subnet_key, u32, SUBNET_NODES);

static __always_inline int subnets_pass_v4(const u8 addr[16])
{
    u32 address = ((u32)addr[0] << 24) | ((u32)addr[1] << 16) | ((u32)addr[2] << 8) | addr[3];
    u32 index = address >> (32 - V4_ROOT_BITS);
    u64 line_index = index >> 6; /* keys are stored whole (common.h) */
    struct subnet_line *line = subnet_v4.lookup((u32 *)&line_index);
    if (!line)
        return 0;
    u64 block = 1ULL << (index & 63);
    if (!(line->descend & block))
        return (line->pass & block) != 0;
    u32 leaf_index = line->first_leaf + __builtin_popcountll(line->descend & (block - 1));
    u64 word_index = leaf_index * V4_LEAF_WORDS + ((address & (V4_LEAF_BYTES * 8 - 1)) >> 6);
    u64 *word = subnet_leaves.lookup((u32 *)&word_index);
    if (!word)
        return 0;
    return (*word >> (address & 63)) & 1; /* little-endian: bit i of the leaf */
}

/* The node one level deeper: the entry for the address's first nb bytes (hi and lo
 * are the address's two words, alf_addr_words), or the node's own verdict.  The key
 * is stored a word at a time (common.h), its address bytes past nb zero. */
static __always_inline u32 subnet_child(int family, int nb, u64 hi, u64 lo, u32 node)
{
    u64 keep_hi = nb >= 8 ? ~0ULL : (1ULL << (8 * nb)) - 1;
    u64 keep_lo = nb >= 16 ? ~0ULL : nb <= 8 ? 0 : (1ULL << (8 * (nb - 8))) - 1;
    union {
        struct subnet_key key;
        u64 words[3];
    } k;
    alf_key20(k.words, nb, family, hi & keep_hi, lo & keep_lo);
    u32 *child = subnet_nodes.lookup(&k.key);
    return child ? *child : (node & SUBNET_PASS);
}

/* Which slot of a bucket holds key, written out slot by slot and kept a scalar: each
 * read is at a fixed offset from the lookup's pointer, and the value is taken from
 * the tail word by shifting.  (Indexing the slots lets clang compute one pointer
 * from the matching slot, or step one through them, and with two lookups inlined
 * that is pointer arithmetic across paths, which the verifier refuses to a loader
 * without CAP_PERFMON.) */
#define SUBNET_SLOT(I)                                                          \
    if (slot < 0 && I < count && bucket->key[I] == key)                         \
        slot = I;

/* 1 and the entry's value in *node if bucket index holds key; 2 if it does not and
 * is full (the key may be in its second bucket); 0 if it does not. */
static __always_inline int subnet_in_bucket(u32 index, u64 key, u32 *node)
{
    u64 at = index; /* stored whole (common.h) */
    struct subnet_bucket *bucket = subnet_v6.lookup((u32 *)&at);
    if (!bucket)
        return 0;
    u64 tail = bucket->tail;
    u32 count = tail >> 56;
    int slot = -1;
    SUBNET_SLOT(0) SUBNET_SLOT(1) SUBNET_SLOT(2) SUBNET_SLOT(3)
    SUBNET_SLOT(4) SUBNET_SLOT(5) SUBNET_SLOT(6)
    if (slot >= 0) {
        *node = (tail >> ((slot & 7) * 8)) & 0xff;
        return 1;
    }
    return count >= 7 ? 2 : 0;
}

/* The first NB bytes of an IPv6 address as a big-endian integer. */
static __always_inline u64 subnet_prefix(const u8 addr[16], int nb)
{
    u64 word;
    __builtin_memcpy(&word, addr, 8);
    return __builtin_bswap64(word) >> (64 - 8 * nb);
}

#define SUBNET_PROBE(NB, OFFSET, BITS, M1, M2)                                  \
    {                                                                           \
        u64 k = subnet_prefix(addr, NB);                                        \
        if (subnet_in_bucket(OFFSET + (u32)((k * M1) >> (64 - BITS)), k, &node) \
            == 2)                                                               \
            subnet_in_bucket(OFFSET + (u32)((k * M2) >> (64 - BITS)), k, &node); \
    }

#define SUBNET_STEP(NB)                                \
    if (node & SUBNET_DESCEND)                         \
        node = subnet_child(family, NB, hi, lo, node);

/* Does the subnet rule set pass a packet from addr? */
static __always_inline int subnets_pass(int family, const u8 addr[16])
{
    if (family == 4)
        return subnets_pass_v4(addr);
    u64 index = ((u32)addr[0] << 8) | addr[1]; /* stored whole (common.h) */
    u32 *root = subnet_roots.lookup((u32 *)&index);
    if (!root)
        return 0;
    u32 node = *root;
    u64 hi, lo;
    alf_addr_words(addr, &hi, &lo);
    V6_STEPS
    return node & SUBNET_PASS;
}

#endif /* ALF_SUBNETS_C */
