/* spa.c: single-packet authorization, the SPA socket's program (KNOCK_SPA 2).
 *
 * One UDP datagram to the service's SPA socket, a socket of its own that the
 * wrapper makes, takes the place of knock sequences.  Its program delivers
 * nothing: it checks the datagram (knock_spa: its format, in alfwrapper.policy(5);
 * a SipHash-2-4 tag under the key its id names in knock_spa_keys, the shared
 * secret's or a client's own, siphash.h; a time within the window of the kernel's
 * TAI clock made UTC; a tag not seen before) and opens the address the datagram
 * names (or, where the policy lets it, the one it came from) for open_ns, in
 * knocking.c's knock_state, which the service's sockets' programs (KNOCK_SPA 1)
 * read and never write.  What has been seen is knock_spa_seen: a word a slot, the
 * tag's high bits and the datagram's second, slot by the tag's low bits.  A slot is taken only from a datagram the
 * window refuses by now (or from none), atomically (a datagram sent twice at once
 * opens once), and a datagram whose slot holds a live one of another tag is
 * refused (busy): what has been seen is never forgotten while it could be replayed.
 * A slot is live while its second is within the widest window of any program that
 * has used the table (knock_spa_since[1], which only grows): with pinned state the
 * table is the service's, one for all its SPA sockets whatever their rules, so a
 * datagram taken at one is a replay at every other, and after a reload that widens
 * the window; it outlives restarts and reloads, as knock_used does.  A key takes at
 * most KNOCK_SPA_QUOTA datagrams a period (knock_spa_quota, shared like the table),
 * so that one holder of a key cannot fill the table against the others.
 *
 * Maps (besides knocking.c's, pasted before this file: knock_config, whose
 * window, tai_to_utc_ns, open_ns, spa_shared and spa_sender it reads, and
 * knock_state, which it writes):
 *   knock_spa_seen ARRAY[KNOCK_SPA_SEEN] u64: the datagrams seen, a word a slot
 *   knock_spa_keys HASH u32 key id -> struct knock_spa_key, the socket's keys
 *   knock_spa_quota LRU_HASH u32 key id -> u64: period << 16 | datagrams taken
 *   knock_spa_since ARRAY[3] u64: [0] the widest window after knock_spa_seen
 *                 began (UTC ns), a datagram sent before is refused (a table that
 *                 took it may be lost); [1] the widest window, in seconds, of the
 *                 programs that have used knock_spa_seen; [2] when it began (the
 *                 wrapper raises them before loading: parts._spa_table_takes)
 *   knock_spa_counts PERCPU_ARRAY[KNOCK_SPA_REASONS] u64: SPA datagrams by verdict
 *
 * Macros: KNOCK_SPA_SEEN, KNOCK_SPA_BYTES, KNOCK_SPA_KEYS, KNOCK_SPA_QUOTA,
 * KNOCK_SPA_QUOTA_KEYS, KNOCK_SPA_MAGIC1 and 2, KNOCK_SPA_REASONS and
 * KNOCK_SPA_* (its verdicts: parts.py), besides knocking.c's.
 * alfwrapper composes it after knocking.c, on the SPA socket alone: knock_spa()
 * checks a datagram, counts it by its verdict, opens what a sound one names, and
 * returns 0: nothing reaches the SPA socket.  Needs CAP_BPF (LRU map).
 */
#ifndef ALF_SPA_C
#define ALF_SPA_C
#ifndef ALF_KNOCKING_C
#error "spa.c is pasted after knocking.c, whose maps it shares (parts.py)"
#endif
#if KNOCK_SPA != 2
#error "spa.c is the SPA socket's program alone: KNOCK_SPA 2 (parts.py)"
#endif
#include "siphash.h"

struct knock_spa_key {
    u64 k0; /* the SipHash key, two little-endian words */
    u64 k1;
};

BPF_ARRAY(knock_spa_seen, u64, KNOCK_SPA_SEEN);
BPF_ARRAY(knock_spa_since, u64, 3); /* [0] since, UTC ns; [1] the widest window, s */
BPF_HASH(knock_spa_keys, u32, struct knock_spa_key, KNOCK_SPA_KEYS);
/* Each key's datagrams taken in the current period (a widest window): the period's
 * number << 16 | the count.  Pinned beside knock_spa_seen, the service's. */
BPF_TABLE("lru_hash", u32, u64, knock_spa_quota, KNOCK_SPA_QUOTA_KEYS);
BPF_PERCPU_ARRAY(knock_spa_counts, u64, KNOCK_SPA_REASONS);

static __always_inline int knock_spa_said(u32 verdict)
{
    u64 at = verdict; /* stored whole (common.h) */
    u64 *count = knock_spa_counts.lookup((u32 *)&at);
    if (count)
        *count += 1;
    return 0; /* nothing reaches the SPA socket */
}

/* An SPA datagram (alfwrapper.policy(5), SPA DATAGRAMS): checked, counted by its
 * verdict, and if it is sound, the address it names opened.  Always 0: dropped. */
static __always_inline int knock_spa(struct __sk_buff *skb, struct alf_packet *pkt)
{
    u64 d[8]; /* the UDP length, then the datagram's 56 bytes: d[1..7] */
    alf_clear(d);
    if (pkt->proto != IPPROTO_UDP ||
        bpf_skb_load_bytes_relative(skb, pkt->l4_offset & 0xffff, d, 8, BPF_HDR_START_NET) < 0)
        return knock_spa_said(KNOCK_SPA_MALFORMED);
    u64 length = ((d[0] >> 32) & 0xff) << 8 | ((d[0] >> 40) & 0xff); /* big-endian */
    if (length != 8 + KNOCK_SPA_BYTES ||
        bpf_skb_load_bytes_relative(skb, (pkt->l4_offset + 8) & 0xffff, &d[1], KNOCK_SPA_BYTES,
                                    BPF_HDR_START_NET) < 0)
        return knock_spa_said(KNOCK_SPA_MALFORMED);
    u64 zero = 0; /* stored whole (common.h) */
    struct knock_config *cfg = knock_config.lookup((u32 *)&zero);
    if (!cfg)
        return knock_spa_said(KNOCK_SPA_MALFORMED);
    /* Which key: version 2 names it (bytes 16 to 19, big-endian); version 1 is the
     * shared secret's, if there is one. */
    u64 id; /* stored whole (common.h) */
    if ((d[1] & 0xffffffffffULL) == KNOCK_SPA_MAGIC2) /* "ALFK", version 2 */
        id = __builtin_bswap32((u32)d[3]);
    else if ((d[1] & 0xffffffffffULL) == KNOCK_SPA_MAGIC1 && cfg->spa_shared)
        id = (u32)cfg->spa_shared;
    else
        return knock_spa_said(KNOCK_SPA_MALFORMED);
    /* The tag before anything else: of a datagram from someone without the key,
     * nothing more is read, and nothing is remembered (a key revoked is none). */
    struct knock_spa_key *key = knock_spa_keys.lookup((u32 *)&id);
    if (!key)
        return knock_spa_said(KNOCK_SPA_BAD_MAC);
    u64 tag = alf_siphash48(key->k0, key->k1, &d[1]);
    if (tag != d[7])
        return knock_spa_said(KNOCK_SPA_BAD_MAC);
    u64 family = (d[1] >> 40) & 0xff;
    u64 port = ((d[1] >> 48) & 0xff) << 8 | d[1] >> 56;
    u64 hi = d[5], lo = d[6]; /* the address to open, network order */
    if (port != pkt->dport) /* the SPA socket's, as the client sent it there */
        return knock_spa_said(KNOCK_SPA_MALFORMED);
    if (family == 4) {
        if ((hi >> 32) || lo)
            return knock_spa_said(KNOCK_SPA_MALFORMED);
    } else if (family == 6) {
        if (hi == 0 && (u32)lo == __builtin_bswap32(0xffff)) /* ::ffff:0:0/96 */
            return knock_spa_said(KNOCK_SPA_MALFORMED);
    } else if (family == 0 && cfg->spa_sender && !(hi | lo)) {
        family = pkt->family; /* the policy's weaker way: the sender */
        alf_addr_words(pkt->addr, &hi, &lo);
    } else {
        return knock_spa_said(KNOCK_SPA_MALFORMED);
    }
    /* Its time, UTC ns, within the window of now. */
    u64 sent = __builtin_bswap64(d[2]);
    u64 now = bpf_ktime_get_tai_ns() + cfg->tai_to_utc_ns;
    if (sent > now + cfg->window_ns || sent + cfg->window_ns < now)
        return knock_spa_said(KNOCK_SPA_STALE);
    /* Sent before what has been seen began (made a window after the table, since a
     * datagram is taken up to a window before its time): an earlier table that took
     * it may be gone (a service with none of its SPA sockets left, or a reboot):
     * refused, as a replay could be. */
    u64 *since = knock_spa_since.lookup((u32 *)&zero);
    if (!since || sent < *since)
        return knock_spa_said(KNOCK_SPA_STALE);
    u64 one = 1; /* stored whole (common.h) */
    u64 *widest = knock_spa_since.lookup((u32 *)&one);
    if (!widest)
        return knock_spa_said(KNOCK_SPA_STALE);
    /* Seen before?  A slot holds a tag's high bits and its datagram's second. */
    u64 slot = tag & (KNOCK_SPA_SEEN - 1);
    u64 *seen = knock_spa_seen.lookup((u32 *)&slot);
    if (!seen)
        return knock_spa_said(KNOCK_SPA_MALFORMED);
    u64 old = *seen;
    u64 mine = ((tag | (1ULL << 63)) & ~0xfffffULL) | ((sent / 1000000000ULL) & 0xfffff);
    if ((old & ~0xfffffULL) == (mine & ~0xfffffULL))
        return knock_spa_said(KNOCK_SPA_REPLAYED);
    if (old) {
        /* Live while a datagram of its second could still pass the time test of
         * any program sharing the table: within the widest window, or this one's. */
        u64 reach = cfg->window_ns / 1000000000ULL;
        u64 wide = *widest;
        if (wide > reach)
            reach = wide;
        reach += 2;
        u64 age = ((now / 1000000000ULL) - old) & 0xfffff;
        if (age <= reach || age >= 0x100000 - reach)
            return knock_spa_said(KNOCK_SPA_BUSY);
    }
    /* The key's share: at most KNOCK_SPA_QUOTA datagrams taken a period (the widest
     * window), so that one key cannot hold the table against the others (parts.py,
     * SPA_QUOTA); over it, or racing its own key on another CPU: busy. */
    u64 period = (now / 1000000000ULL) / (*widest ? *widest : 1);
    u64 *taken = knock_spa_quota.lookup((u32 *)&id);
    if (!taken) {
        u64 none = 0; /* stored whole (common.h) */
        knock_spa_quota.update((u32 *)&id, &none);
        taken = knock_spa_quota.lookup((u32 *)&id);
        if (!taken)
            return knock_spa_said(KNOCK_SPA_BUSY);
    }
    u64 was = *taken;
    u64 count = (was >> 16) == period ? (was & 0xffff) : 0;
    if (count >= KNOCK_SPA_QUOTA)
        return knock_spa_said(KNOCK_SPA_BUSY);
    if (__sync_val_compare_and_swap(taken, was, (period << 16) | (count + 1)) != was)
        return knock_spa_said(KNOCK_SPA_BUSY);
    if (__sync_val_compare_and_swap(seen, old, mine) != old)
        return knock_spa_said(KNOCK_SPA_REPLAYED); /* the same, sent twice at once */
    union {
        struct knock_key key;
        u64 words[3];
    } k; /* stored a word at a time (common.h) */
    alf_key20(k.words, family, 0, hi, lo);
    union {
        struct knock_state st;
        u64 words[3];
    } st;
    u64 mono = bpf_ktime_get_ns();
    knock_state_words(st.words, mono, mono + cfg->open_ns, 0, 0);
    knock_state.update(&k.key, &st.st);
    return knock_spa_said(KNOCK_SPA_ACCEPTED);
}

#endif /* ALF_SPA_C */
