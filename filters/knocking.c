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
 * Single-packet authorization (KNOCK_SPA 1) takes the place of sequences: a
 * source may open new connections while knock_state holds it open, which only
 * the service's SPA socket's program writes (spa.c, KNOCK_SPA 2, pasted after
 * this file); this program reads it and never writes it.
 *
 * Maps:
 *   knock_config  ARRAY[1] struct knock_config (timeouts, window, sizes; for
 *                 the SPA socket its shared key id and sender switch: spa.c)
 *   knock_ports   ARRAY[KNOCK_ROWS * KNOCK_MAX_STEPS] u32 ports, row-major
 *   knock_used    LRU_HASH u64 window -> u32: the secret windows that have opened
 *   knock_state   LRU_HASH struct knock_key -> struct knock_state,
 *                 KNOCK_SOURCES entries (a flood evicts the oldest)
 *   knock_listeners HASH u64 socket cookie -> u8, the TCP listeners this
 *                 program is attached to (KNOCK_LISTENERS entries)
 *
 * Macros: KNOCK_ROWS, KNOCK_SOURCES, KNOCK_SECRET (1 for secret rows),
 * KNOCK_LISTENERS, KNOCK_MAX_STEPS (the row width, knocking.MAX_STEPS),
 * KNOCK_SPA (0: sequences, 1: a socket SPA opens, 2: the SPA socket, whose
 * verdict is spa.c's knock_spa).
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

/* Does port knocking let this packet through?  Updates the knock state. */
static __always_inline int knock_pass(struct __sk_buff *skb, struct alf_packet *pkt)
{
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
