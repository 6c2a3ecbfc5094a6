/* sets.c: named sets, the host's lists of prefixes that any number of services
 * name (allow-set, deny-set) and `alfwrapper set` changes while they run.
 *
 * A set is three maps, pinned once for the host (alfwrapper/sets/) and shared by
 * every program that names it:
 *
 *   hosts   HASH of struct alf_set_host -> u64: whole addresses (/32, /128)
 *   ranges  LPM_TRIE of struct alf_set_range -> u64: every shorter prefix
 *   sieve   ARRAY of u64: a blocked Bloom filter of the whole addresses (two
 *           bits of one word each; the layout: SIEVE_* in bpf/parts.py), and in
 *           each word two bits that say whether the ranges may hold IPv4 and
 *           IPv6 prefixes
 *
 * A source whose block lacks its bits is in no host entry: it costs one cache line
 * and no hash lookup, and where the ranges hold none of its family, no trie walk.
 * The program's own alf_set_shifts holds each sieve's shift (from its size, which
 * never changes, and which sets/bloom.py makes a header word and a power of two; 0, a
 * slot not filled, fails closed).
 * The sieve's lines of every set the program names are read before any of them is
 * tested, so the sets' misses overlap instead of following each other.  User space
 * sets an address's bits before its entry goes in, and clears bits only where no
 * entry still needs them (a resync, a flush), so a bit is never missing for an
 * entry: the sieve can only send a packet on to the hash for nothing.
 *
 * Each value is the entry's expiry on the kernel's monotonic clock in ns, 0 for
 * never: an entry past it no longer matches, so a timeout needs no timer (user
 * space removes lapsed entries at leisure).  A range's value holds its prefix
 * length in its low 8 bits (the expiry is rounded up to 256 ns): an LPM trie
 * gives only the longest match, so past a lapsed range the lookup is made again
 * one bit shorter, for the range it was nested in, up to ALF_SET_NEST times; a
 * source still behind lapsed ranges after that counts as unreadable.  A program reaches a set's
 * ranges through an array of maps, its sieve as a map of its own (alf_set_sieve_word,
 * made with the placeholders by bpf/parts.py, whose places the sets' sieves take as
 * the program loads: a packet's one read of each set is then a lookup the verifier
 * inlines, with no helper call and no map to find first), and its hosts through the
 * set's own hosts_at, an array of maps of one slot bound the same way
 * (alf_set_hosts_of): a full hosts map is replaced there by a larger copy, for every
 * program at once, while they run (sets/content.py: _grow).  Deny sets at indexes 0 to
 * ALF_DENY_SETS - 1, allow sets after them.  A slot left empty
 * fails closed: a deny set that cannot be read drops, an allow set that cannot be
 * read allows nothing (a placeholder holds no word past its header).
 *
 * Macros: ALF_SETS (deny and allow sets), ALF_DENY_SETS, ALF_SET_MEMBER (what
 * membership of an allow set says: ALF_SET_ALLOW, or 0 where the subnet rules
 * still judge), ALF_SET_OTHERS (what a source in no allow set gets:
 * ALF_SET_DENY, or 0 with no allow sets to pass), ALF_SET_ALLOW, ALF_SET_DENY.
 */
#ifndef ALF_SETS_C
#define ALF_SETS_C
#include "common.h"

#if !defined(ALF_SETS) || !defined(ALF_DENY_SETS) || !defined(ALF_SET_MEMBER) || \
    !defined(ALF_SET_FLAGS) || !defined(ALF_SIEVE_FLAGS) || !defined(ALF_SIEVE_MIX)
#error "sets.c is compiled by alfwrapper, which defines its settings"
#endif
#if ALF_SETS > 64
#error "at most 64 named sets: sets_verdict keeps a bit for each in a word"
#endif

/* The inner maps' shapes (struct alf_set_host and alf_set_range, and their flags
 * ALF_SET_FLAGS, come from their one definition, bpf/parts.py); a set's own maps
 * are larger.  The flags hold BPF_F_RDONLY_PROG: the verifier refuses any program
 * that would write into a set (a user's filter, through the loader, included),
 * and a map without it does not fit these arrays.  A sieve has it too, which
 * sets.open_role checks before one is bound. */
BPF_F_TABLE("hash", struct alf_set_host, u64, alf_set_host_shape, 1, ALF_SET_FLAGS);
BPF_F_TABLE("lpm_trie", struct alf_set_range, u64, alf_set_range_shape, 1, ALF_SET_FLAGS);
BPF_ARRAY_OF_MAPS(alf_set_ranges, "alf_set_range_shape", ALF_SETS);
BPF_ARRAY(alf_set_shifts, u64, ALF_SETS);

/* Does an entry standing until *expiry (0: for ever) still stand? */
static __always_inline int set_standing(const u64 *expiry)
{
    if (!expiry)
        return 0;
    u64 until = *expiry;
    return until == 0 || until > bpf_ktime_get_coarse_ns();
}

/* A packet's keys, and the words its lookups take their keys from: one of each for
 * the program, however many sets it names (an unrolled loop's locals would each
 * take stack of their own, and 32 sets would pass the 512 bytes a program has). */
struct alf_set_keys {
    u64 host[3];  /* struct alf_set_host, stored a word at a time (common.h) */
    u64 range[3]; /* struct alf_set_range */
    u64 probe[3]; /* the range key as set_range_holds shortens it */
    u64 at;       /* an array's index, stored whole (common.h) */
};

#define ALF_SET_NEST 4

/* 1 if the ranges hold the source, 0 if not, -1 if lapsed ranges nested
 * ALF_SET_NEST deep hide what is behind them. */
static __always_inline int set_range_holds(void *ranges, struct alf_set_keys *k)
{
    k->probe[0] = k->range[0];
    k->probe[1] = k->range[1];
    k->probe[2] = k->range[2];
    u64 *found = bpf_map_lookup_elem(ranges, k->probe);
#pragma unroll
    for (int step = 0; step < ALF_SET_NEST; step++) {
        if (!found)
            return 0;
        u64 value = *found;
        u64 until = value & ~0xffULL;
        if (until == 0 || until > bpf_ktime_get_coarse_ns())
            return 1;
        u64 length = value & 0xff;
        if (length == 0)
            return 0;
        k->probe[0] = (32 + length - 1) | (k->probe[0] & 0xffffffff00000000ULL);
        found = bpf_map_lookup_elem(ranges, k->probe);
    }
    return found ? -1 : 0;
}

#define ALF_SIEVE_HOST 1       /* the block has the source's bits: ask the hash */
#define ALF_SIEVE_RANGE 2      /* the ranges may hold the source's family: ask the trie */
#define ALF_SIEVE_UNREADABLE 4 /* the set cannot be read */
/* What set i's sieve said, from sets_verdict's bits a set. */
#define ALF_SIEVE_SAID(i) (((hosts >> (i)) & 1) | ((ranges >> (i)) & 1) << 1)

/* 1 if set number i holds the source, 0 if not, -1 if the set cannot be read;
 * ``sieved``: what its sieve said (set_sieve). */
static __always_inline int set_holds(u32 i, u64 sieved, struct alf_set_keys *k)
{
    if (sieved & ALF_SIEVE_HOST) {
        k->at = 0;
        void *hosts = alf_set_hosts_of(i, (u32 *)&k->at);
        if (!hosts)
            return -1;
        if (set_standing(bpf_map_lookup_elem(hosts, k->host)))
            return 1;
    }
    if (!(sieved & ALF_SIEVE_RANGE))
        return 0;
    k->at = i;
    void *ranges = alf_set_ranges.lookup((u32 *)&k->at);
    if (!ranges)
        return -1;
    return set_range_holds(ranges, k);
}

/* Set number i's sieve, for a source whose key (sets_verdict) is ``key``: ALF_SIEVE_*
 * bits.  No branch waits for the word's line, only for pointers, so the caller's
 * next set's line is fetched while this one's is on its way. */
static __always_inline u64 set_sieve(u32 i, u64 key, u8 family, struct alf_set_keys *k)
{
    k->at = i;
    u64 *shift = alf_set_shifts.lookup((u32 *)&k->at);
    if (!shift || !*shift) /* 0: not bound (Sets.bind) */
        return ALF_SIEVE_UNREADABLE;
    u64 hash = key * ALF_SIEVE_MULTIPLIER;
    k->at = 1 + (hash >> (*shift & 63));
    u64 *word = alf_set_sieve_word(i, (u32 *)&k->at);
    if (!word)
        return ALF_SIEVE_UNREADABLE;
    u64 bits = *word;
    u64 bit1 = ((hash >> ALF_SIEVE_BIT1) & 0x3fff) % 62;
    u64 bit2 = ((hash >> ALF_SIEVE_BIT2) & 0x7fff) % 62;
    u64 host = (bits >> bit1) & (bits >> bit2) & ALF_SIEVE_HOST;
    u64 range = (bits >> (family == 4 ? ALF_SIEVE_RANGE4 : ALF_SIEVE_RANGE6)) & 1;
    return host | range << 1; /* ALF_SIEVE_RANGE */
}

/* A source address's keys (its words ``hi`` and ``lo``, family 4 or 6) into ``k``;
 * returns the sieve's key: the address's bits in network order, IPv6 folded.
 * (sets_verdict, and early.c's XDP program.) */
static __always_inline u64 set_keys(struct alf_set_keys *k, u8 family, u64 hi, u64 lo)
{
    u8 len = family == 4 ? 32 : 128;
    alf_key20(k->host, len, family, hi, lo);
    k->range[0] = (u64)(32 + len) | ((u64)family << 32);
    k->range[1] = hi;
    k->range[2] = lo;
    return family == 4 ? (u64)__builtin_bswap32((u32)hi)
                       : __builtin_bswap64(hi) ^ (__builtin_bswap64(lo) * ALF_SIEVE_MIX);
}

/* ALF_SET_DENY, ALF_SET_ALLOW or 0: what the sets say of the packet's source.
 *
 * Kept linear for the verifier, which walks every path: a set that cannot be read
 * ends its path at once (a deny set drops) or adds nothing (an allow set allows
 * nothing), so what the sieves said is never a value known on one path and another
 * on the next (the verifier would then keep both, and twice as many paths for each
 * set after it: twelve sets took 745,000 of its million steps). */
static __always_inline u32 sets_verdict(const struct alf_packet *pkt, u32 runtime)
{
    struct alf_set_keys k;
    u64 hi, lo;
    alf_addr_words(pkt->addr, &hi, &lo);
    u64 key = set_keys(&k, pkt->family, hi, lo);
    /* Every set's sieve first, so that their misses overlap: what each said, a bit a
     * set. */
    u64 hosts = 0, ranges = 0;
#pragma unroll
    for (u32 i = 0; i < ALF_SETS; i++) {
        u64 said = set_sieve(i, key, pkt->family, &k);
        if (said & ALF_SIEVE_UNREADABLE) {
            if (i < ALF_DENY_SETS)
                return ALF_SET_DENY; /* fail closed */
            continue;
        }
        hosts |= (said & ALF_SIEVE_HOST) << i;
        ranges |= ((said & ALF_SIEVE_RANGE) >> 1) << i;
        /* Opaque to the compiler from here on: it could otherwise hold each set's
         * word, or its bits, apart for later, each in a stack slot of its own (32
         * sets would pass the program's 512 bytes).  Debian 12's LLVM no longer
         * does (the most sets with every part load without it, `make mutate`
         * found): kept for other compilers, which tests/kernel would show. */
        asm volatile("" : "+r"(hosts), "+r"(ranges));
    }
#if ALF_SETS > ALF_DENY_SETS
    if (!(hosts | ranges)) /* in no set: quick */
        return runtime == ALF_RUNTIME_ALLOW ? 0 : ALF_SET_OTHERS;
#else
    if (!(hosts | ranges))
        return 0;
#endif
#pragma unroll
    for (u32 i = 0; i < ALF_DENY_SETS; i++)
        if (set_holds(i, ALF_SIEVE_SAID(i), &k))
            return ALF_SET_DENY; /* held, or unreadable: fail closed */
#if ALF_SETS > ALF_DENY_SETS
#pragma unroll
    for (u32 i = ALF_DENY_SETS; i < ALF_SETS; i++)
        if (set_holds(i, ALF_SIEVE_SAID(i), &k) > 0)
            return ALF_SET_MEMBER;
    /* A runtime allow (alfwrapper allow) passes as an allow set's entry would. */
    return runtime == ALF_RUNTIME_ALLOW ? 0 : ALF_SET_OTHERS;
#else
    return 0;
#endif
}

#endif /* ALF_SETS_C */
