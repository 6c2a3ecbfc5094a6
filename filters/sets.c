/* sets.c: named sets, the host's lists of prefixes that any number of services
 * name (allow-set, deny-set) and `alfwrapper set` changes while they run.
 *
 * A set is two maps, pinned once for the host (alfwrapper/sets.py) and shared by
 * every program that names it:
 *
 *   hosts   HASH of struct alf_set_host -> u64: whole addresses (/32, /128)
 *   ranges  LPM_TRIE of struct alf_set_range -> u64: every shorter prefix
 *
 * Each value is the entry's expiry on the kernel's monotonic clock in ns, 0 for
 * never: an entry past it no longer matches, so a timeout needs no timer (user
 * space removes lapsed entries at leisure).  A range's value holds its prefix
 * length in its low 8 bits (the expiry is rounded up to 256 ns): an LPM trie
 * gives only the longest match, so past a lapsed range the lookup is made again
 * one bit shorter, for the range it was nested in, up to ALF_SET_NEST times; a
 * source still behind lapsed ranges after that counts as unreadable.  A program reaches its sets through
 * two arrays of maps, filled when it is loaded: deny sets at indexes 0 to
 * ALF_DENY_SETS - 1, allow sets after them.  A slot left empty fails closed: a
 * deny set that cannot be read drops, an allow set that cannot be read allows
 * nothing.
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
    !defined(ALF_SET_FLAGS)
#error "sets.c is compiled by alfwrapper, which defines its settings"
#endif

/* The inner maps' shapes (struct alf_set_host and alf_set_range, and their flags
 * ALF_SET_FLAGS, come from their one definition, bpf/parts.py); a set's own maps
 * are larger.  The flags hold BPF_F_RDONLY_PROG: the verifier refuses any program
 * that would write into a set (a user's filter, through the loader, included),
 * and a map without it does not fit these arrays. */
BPF_F_TABLE("hash", struct alf_set_host, u64, alf_set_host_shape, 1, ALF_SET_FLAGS);
BPF_F_TABLE("lpm_trie", struct alf_set_range, u64, alf_set_range_shape, 1, ALF_SET_FLAGS);
BPF_ARRAY_OF_MAPS(alf_set_hosts, "alf_set_host_shape", ALF_SETS);
BPF_ARRAY_OF_MAPS(alf_set_ranges, "alf_set_range_shape", ALF_SETS);

/* Does an entry standing until *expiry (0: for ever) still stand? */
static __always_inline int set_standing(const u64 *expiry)
{
    if (!expiry)
        return 0;
    u64 until = *expiry;
    return until == 0 || until > bpf_ktime_get_coarse_ns();
}

#define ALF_SET_NEST 4

/* 1 if the ranges hold the source (the range key prepared by the caller), 0 if not,
 * -1 if lapsed ranges nested ALF_SET_NEST deep hide what is behind them. */
static __always_inline int set_range_holds(void *ranges, const u64 *range)
{
    u64 key[3]; /* a copy, stored a word at a time (common.h) */
    key[0] = range[0];
    key[1] = range[1];
    key[2] = range[2];
    u64 *found = bpf_map_lookup_elem(ranges, key);
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
        key[0] = (32 + length - 1) | (key[0] & 0xffffffff00000000ULL);
        found = bpf_map_lookup_elem(ranges, key);
    }
    return found ? -1 : 0;
}

/* 1 if set number i holds the source (host and range keys prepared by the
 * caller), 0 if not, -1 if the set cannot be read. */
static __always_inline int set_holds(u32 i, const u64 *host, const u64 *range)
{
    u64 at = i; /* stored whole (common.h) */
    void *hosts = alf_set_hosts.lookup((u32 *)&at);
    void *ranges = alf_set_ranges.lookup((u32 *)&at);
    if (!hosts || !ranges)
        return -1;
    if (set_standing(bpf_map_lookup_elem(hosts, host)))
        return 1;
    return set_range_holds(ranges, range);
}

/* ALF_SET_DENY, ALF_SET_ALLOW or 0: what the sets say of the packet's source. */
static __always_inline u32 sets_verdict(const struct alf_packet *pkt, u32 runtime)
{
    u64 hi, lo;
    alf_addr_words(pkt->addr, &hi, &lo);
    u8 len = pkt->family == 4 ? 32 : 128;
    u64 host[3], range[3]; /* the keys, each stored a word at a time (common.h) */
    alf_key20(host, len, pkt->family, hi, lo);
    range[0] = (u64)(32 + len) | ((u64)pkt->family << 32);
    range[1] = hi;
    range[2] = lo;
#pragma unroll
    for (u32 i = 0; i < ALF_DENY_SETS; i++)
        if (set_holds(i, host, range))
            return ALF_SET_DENY; /* held, or unreadable: fail closed */
#if ALF_SETS > ALF_DENY_SETS
#pragma unroll
    for (u32 i = ALF_DENY_SETS; i < ALF_SETS; i++)
        if (set_holds(i, host, range) > 0)
            return ALF_SET_MEMBER;
    /* A runtime allow (alfwrapper allow) passes as an allow set's entry would. */
    return runtime == ALF_RUNTIME_ALLOW ? 0 : ALF_SET_OTHERS;
#else
    return 0;
#endif
}

#endif /* ALF_SETS_C */
