/* knocking.c: port knocking inside the socket filter, with no daemon.
 *
 * A knock is a new connection attempt (a TCP SYN, or any UDP datagram) to
 * this socket, sent from a source port of the sequence, in order.  Knock
 * packets are dropped.  Once source address S has sent the whole sequence,
 * each step within step_timeout of the one before, S may open new
 * connections for open_ns.  The packet that completes a TCP handshake
 * reaches the listening socket, like the SYN did, and is judged like it: it
 * passes only while its source is open (read-only; it is no knock).  TCP
 * segments of connections already admitted arrive on the accepted socket
 * (which inherited this filter) and always pass, so they outlive the window.
 * The listening sockets are told apart by their socket cookie
 * (bpf_get_socket_cookie, Linux 4.12), which the wrapper puts in
 * knock_listeners.  Headers are read through the network header
 * (alf_parse_packet), so a test run and a real socket agree.
 *
 * A repeat of the port just knocked (a SYN retransmission) is ignored; any
 * other wrong port resets S's progress.
 *
 * Static sequences use row 0 of knock_ports.  Secret-derived ones use one row
 * per time window: window w = (TAI + tai_to_utc_ns) / window_ns, row w -
 * first_window, and a knock may start in the row of w-1, w or w+1 (clock
 * skew).  Each secret window opens the door once: knock_used marks it, so a
 * sequence sniffed on the wire cannot be replayed.  With pinned state
 * (state.py), knock_state and knock_used outlive the
 * program: sources that knocked stay admitted across restarts and reloads
 * that keep the knock rules, and a used window stays used.  The wrapper hands
 * the program the pinned maps in place of fresh ones.
 *
 * Maps:
 *   knock_config  ARRAY[1] struct knock_config (timeouts, window, sizes)
 *   knock_ports   ARRAY[KNOCK_ROWS * KNOCK_MAX_STEPS] u32 ports, row-major
 *   knock_used    LRU_HASH u64 window -> u32: the secret windows that have opened
 *   knock_state   LRU_HASH struct knock_key -> struct knock_state,
 *                 KNOCK_SOURCES entries (a flood evicts the oldest)
 *   knock_listeners HASH u64 socket cookie -> u8, the TCP listeners this
 *                 program is attached to (KNOCK_LISTENERS entries)
 *
 * Single-packet authorization (KNOCK_SPA): instead of sequences, one UDP datagram
 * to the service's SPA socket, a socket of its own that the wrapper makes, whose
 * program (KNOCK_SPA 2) delivers nothing: it checks the datagram (knock_spa: its
 * format, in alfwrapper.policy(5); a SipHash-2-4 tag under the key its id names in
 * knock_spa_keys, the shared secret's or a client's own, siphash.h; a time within the window of the kernel's TAI clock made UTC;
 * a tag not seen before) and opens the address the datagram names (or, where the
 * policy lets it, the one it came from) for open_ns, in knock_state, which the
 * service's sockets' programs (KNOCK_SPA 1) read and never write.  What has been
 * seen is knock_spa_seen: a word a slot, the tag's high bits and the datagram's
 * second, slot by the tag's low bits.  A slot is taken only from a datagram the
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
 * Maps:
 *   knock_config  ARRAY[1] struct knock_config (timeouts, window, sizes, shared key id)
 *   knock_ports   ARRAY[KNOCK_ROWS * KNOCK_MAX_STEPS] u32 ports, row-major
 *   knock_used    LRU_HASH u64 window -> u32: the secret windows that have opened
 *   knock_state   LRU_HASH struct knock_key -> struct knock_state,
 *                 KNOCK_SOURCES entries (a flood evicts the oldest)
 *   knock_listeners HASH u64 socket cookie -> u8, the TCP listeners this
 *                 program is attached to (KNOCK_LISTENERS entries)
 *   knock_spa_seen ARRAY[KNOCK_SPA_SEEN] u64 (KNOCK_SPA 2)
 *   knock_spa_keys HASH u32 key id -> struct knock_spa_key, the socket's keys
 *   knock_spa_quota LRU_HASH u32 key id -> u64: period << 16 | datagrams taken
 *   knock_spa_since ARRAY[3] u64: [0] the widest window after knock_spa_seen
 *                 began (UTC ns), a datagram sent before is refused (a table that
 *                 took it may be lost); [1] the widest window, in seconds, of the
 *                 programs that have used knock_spa_seen; [2] when it began (the
 *                 wrapper raises them before loading: parts._spa_table_takes)
 *   knock_spa_counts PERCPU_ARRAY[KNOCK_SPA_REASONS] u64: SPA datagrams by verdict
 *
 * Macros: KNOCK_ROWS, KNOCK_SOURCES, KNOCK_SECRET (1 for secret rows),
 * KNOCK_LISTENERS, KNOCK_MAX_STEPS (the row width, knocking.MAX_STEPS),
 * KNOCK_SPA (0: sequences, 1: a socket SPA opens, 2: the SPA socket),
 * KNOCK_SPA_SEEN, KNOCK_SPA_KEYS, KNOCK_SPA_QUOTA, KNOCK_SPA_QUOTA_KEYS,
 * KNOCK_SPA_MAGIC1 and 2, KNOCK_SPA_REASONS and KNOCK_SPA_* (its verdicts: parts.py).
 * alfwrapper composes it: knock_pass() says whether knocking passes a
 * packet, and updates the state.  Needs CAP_BPF (LRU map).
 */
#ifndef ALF_KNOCKING_C
#define ALF_KNOCKING_C
#include "common.h"

#ifndef KNOCK_MAX_STEPS
#error "knocking.c is compiled by alfwrapper, which defines KNOCK_MAX_STEPS (knocking.py)"
#endif
#ifndef KNOCK_ROWS
#error "KNOCK_ROWS is defined by parts.py"
#endif
#ifndef KNOCK_SOURCES
#error "KNOCK_SOURCES is defined by parts.py (KnockRules.sources)"
#endif
#ifndef KNOCK_SECRET
#error "KNOCK_SECRET is defined by parts.py"
#endif
#ifndef KNOCK_LISTENERS
#define KNOCK_LISTENERS 64
#endif
#ifndef KNOCK_SPA
#error "KNOCK_SPA is defined by parts.py"
#endif

struct knock_config {
    u64 step_timeout_ns;
    u64 open_ns;
    u64 window_ns;
    s64 tai_to_utc_ns;
    u64 first_window;
    u32 steps;
    u32 rows;
    u64 spa_shared; /* KNOCK_SPA 2: 1 << 32 | the shared secret's key id, or 0: none */
    u64 spa_sender; /* 1: a datagram that names no address opens the one it came from */
};

struct knock_spa_key {
    u64 k0; /* the SipHash key, two little-endian words */
    u64 k1;
};

struct knock_key {
    u8 family;
    u8 pad[3];
    u8 addr[16];
};

struct knock_state {
    u64 last_ns;       /* time of the last accepted knock */
    u64 open_until_ns; /* new connections pass until then */
    u32 step;          /* knocks accepted so far */
    u32 row;           /* the row of knock_ports being followed */
};

/* struct knock_state as the three words it is stored as (common.h). */
static __always_inline void knock_state_words(u64 words[3], u64 last_ns, u64 open_until_ns,
                                              u32 step, u32 row)
{
    words[0] = last_ns;
    words[1] = open_until_ns;
    words[2] = (u64)step | ((u64)row << 32);
}

BPF_ARRAY(knock_config, struct knock_config, 1);
BPF_ARRAY(knock_ports, u32, KNOCK_ROWS * KNOCK_MAX_STEPS);
/* With pinned state, these two are shared by the service's sockets with the same
 * knock rules and kept across restarts and reloads (state.py, compiler.py). */
BPF_TABLE("lru_hash", u64, u32, knock_used, KNOCK_ROWS);
BPF_TABLE("lru_hash", struct knock_key, struct knock_state, knock_state, KNOCK_SOURCES);
BPF_HASH(knock_listeners, u64, u8, KNOCK_LISTENERS);
#if KNOCK_SPA == 2
BPF_ARRAY(knock_spa_seen, u64, KNOCK_SPA_SEEN);
BPF_ARRAY(knock_spa_since, u64, 3); /* [0] since, UTC ns; [1] the widest window, s */
BPF_HASH(knock_spa_keys, u32, struct knock_spa_key, KNOCK_SPA_KEYS);
/* Each key's datagrams taken in the current period (a widest window): the period's
 * number << 16 | the count.  Pinned beside knock_spa_seen, the service's. */
BPF_TABLE("lru_hash", u32, u64, knock_spa_quota, KNOCK_SPA_QUOTA_KEYS);
BPF_PERCPU_ARRAY(knock_spa_counts, u64, KNOCK_SPA_REASONS);
#endif

static __always_inline u32 knock_port(u32 row, u32 step)
{
    u64 index = row * KNOCK_MAX_STEPS + step; /* stored whole (common.h) */
    u32 *port = knock_ports.lookup((u32 *)&index);
    return port ? *port : 0;
}

/* The row a first knock from sport starts, or -1. */
static __always_inline s64 knock_first_row(struct knock_config *cfg, u32 sport)
{
#if KNOCK_SECRET
    u64 utc = bpf_ktime_get_tai_ns() + cfg->tai_to_utc_ns;
    u64 window = utc / cfg->window_ns;
    if (window < cfg->first_window)
        return -1;
    s64 now_row = window - cfg->first_window;
    #pragma unroll
    for (int delta = 0; delta < 3; delta++) {
        s64 row = now_row + (delta == 0 ? 0 : delta == 1 ? -1 : 1);
        if (row >= 0 && row < cfg->rows && knock_port(row, 0) == sport)
            return row;
    }
    return -1;
#else
    return knock_port(0, 0) == sport ? 0 : -1;
#endif
}

/* Is addr inside its open window now?  Read-only. */
static __always_inline int knock_is_open(struct knock_key *key)
{
    struct knock_state *st = knock_state.lookup(key);
    return st && bpf_ktime_get_ns() < st->open_until_ns;
}

#if KNOCK_SPA == 2
#include "siphash.h"

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
#endif

/* Does port knocking let this packet through?  Updates the knock state. */
static __always_inline int knock_pass(struct __sk_buff *skb, struct alf_packet *pkt)
{
#if KNOCK_SPA == 2
    return knock_spa(skb, pkt);
#endif
    if (!pkt->has_ports)
        return 0;
    union {
        struct knock_key key;
        u64 words[3];
    } k; /* stored a word at a time (common.h) */
    u64 hi, lo;
    alf_addr_words(pkt->addr, &hi, &lo);
    alf_key20(k.words, pkt->family, 0, hi, lo);
    struct knock_key *key = &k.key;
    if (pkt->proto == IPPROTO_TCP &&
        (pkt->tcp_flags & (ALF_TCP_SYN | ALF_TCP_ACK)) != ALF_TCP_SYN) {
        /* Not a new connection.  On the listening socket itself this is the
         * packet that completes a handshake (or a stray one): it is judged
         * like the SYN was, by the knock state, without changing it.  On an
         * accepted connection (another socket, which inherited this filter)
         * it belongs to a connection the filter already admitted. */
        u64 cookie = bpf_get_socket_cookie(skb);
        if (knock_listeners.lookup(&cookie))
            return knock_is_open(key);
        return 1;
    }
#if KNOCK_SPA == 1
    return knock_is_open(key); /* opened by an SPA datagram, or not at all */
#endif
    u32 sport = pkt->sport;

    u64 zero = 0; /* stored whole (common.h) */
    struct knock_config *cfg = knock_config.lookup((u32 *)&zero);
    if (!cfg || cfg->steps == 0 || cfg->steps > KNOCK_MAX_STEPS)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct knock_state *old = knock_state.lookup(key);
    if (old && now < old->open_until_ns)
        return 1;

    /* The state is worked on in registers and stored whole (common.h). */
    u64 last_ns = old ? old->last_ns : 0, open_until_ns = old ? old->open_until_ns : 0;
    u32 step = old ? old->step : 0, row = old ? old->row : 0;
    if (step && now - last_ns > cfg->step_timeout_ns)
        step = 0;
    if (step && step < KNOCK_MAX_STEPS) {
        if (sport == knock_port(row, step)) {
            step++;
            last_ns = now;
        } else if (sport == knock_port(row, step - 1)) {
            return 0; /* the same knock again: a retransmission */
        } else {
            step = 0;
        }
    }
    union {
        struct knock_state st;
        u64 words[3];
    } s;
    if (step == 0) {
        s64 first = knock_first_row(cfg, sport);
        if (first < 0) {
            if (old) { /* a wrong knock resets progress */
                knock_state_words(s.words, last_ns, open_until_ns, 0, row);
                knock_state.update(key, &s.st);
            }
            return 0;
        }
        row = first;
        step = 1;
        last_ns = now;
    }
    if (step >= cfg->steps) {
        step = 0;
#if KNOCK_SECRET
        u64 window = cfg->first_window + row; /* absolute, so it survives reloads */
        u64 one = 1; /* the u32 value 1, stored whole */
        if (knock_used.lookup(&window)) {
            knock_state_words(s.words, last_ns, open_until_ns, step, row);
            knock_state.update(key, &s.st); /* a replayed sequence opens nothing */
            return 0;
        }
        knock_used.update(&window, &one);
#endif
        open_until_ns = now + cfg->open_ns;
    }
    knock_state_words(s.words, last_ns, open_until_ns, step, row);
    knock_state.update(key, &s.st);
    return 0; /* knocks themselves are dropped */
}

#endif /* ALF_KNOCKING_C */
