/* common.h: what every alfwrapper filter shares.
 *
 * Return convention of a socket filter: the number of bytes of the packet to
 * keep.  ALF_DROP (0) drops it, ALF_PASS keeps all of it.  Never return a
 * smaller non-zero length: that would trim TCP segments.
 *
 * Where the packet starts: on a TCP or UDP socket, skb->data points at the
 * transport header; in a BPF_PROG_TEST_RUN of a socket filter it points at
 * the network header.  So every header is read relative to the network
 * header (BPF_HDR_START_NET, the helper form of SKF_NET_OFF; Linux 4.18),
 * never at a fixed offset from skb->data: then a test run and a real socket
 * give the same verdict for the same packet.  alf_parse_packet() does that
 * once for the IP and transport headers; a filter of your own should use it
 * rather than bpf_skb_load_bytes(skb, 0, ...).
 */
#ifndef ALF_COMMON_H
#define ALF_COMMON_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>

#define ALF_DROP 0
#define ALF_PASS (-1)

/* Verdict counters, per CPU so the hot path has no atomics: index
 * ALF_REASON_PASSED, or the reason a packet was dropped (ALF_REASON_*:
 * malformed, interfaces, subnets, knocking, filter; parts.REASONS hands them
 * over).  A developer's filter that includes this file alone gets none. */
#ifdef ALF_REASONS
BPF_PERCPU_ARRAY(alf_counters, u64, ALF_REASONS); /* with pinned state: the socket's own */

static __always_inline int alf_count(u32 reason)
{
    u64 key = reason; /* a 4-byte key in a word stored whole (below: Keys) */
    u64 *count = alf_counters.lookup((u32 *)&key);
    if (count)
        *count += 1;
    return reason == ALF_REASON_PASSED ? ALF_PASS : ALF_DROP;
}
#endif

/* skb->protocol is big-endian. */
#define ALF_PROTO_IP4 __builtin_bswap16(ETH_P_IP)
#define ALF_PROTO_IP6 __builtin_bswap16(ETH_P_IPV6)

/* IPv6 extension headers walked before giving up (the packet is then
 * malformed to us, and dropped). */
#define ALF_IPV6_EXT_MAX 8

#define ALF_TCP_FIN 0x01
#define ALF_TCP_SYN 0x02
#define ALF_TCP_RST 0x04
#define ALF_TCP_ACK 0x10

/* One packet's headers, as every part sees them.  Aligned so that the address
 * reads as two 64-bit words (alf_addr_words). */
struct alf_packet {
    u8 addr[16] __attribute__((aligned(8))); /* source address, network order; IPv4 in the first 4 bytes */
    u8 family;     /* 4 or 6 */
    u8 proto;      /* transport protocol: IPPROTO_TCP, IPPROTO_UDP, or another */
    u8 tcp_flags;  /* TCP only: FIN, SYN, RST, PSH, ACK, URG, ... */
    u8 has_ports;  /* 1 if sport and dport were read (TCP and UDP) */
    u16 sport;     /* host order */
    u16 dport;
    u32 l4_offset; /* transport header, bytes after the network header */
};

/* What the verifiers of the README's kernels need, the oldest being Debian 12's 6.1,
 * from a loader without CAP_PERFMON (the shipped units, and the loader for users):
 *
 * No pointer moved by a variable offset (map value + index): the verifier then
 * stops merging paths that differ in any number, for the whole program
 * (explore_alu_limits), and its work grows a hundredfold.  Index by map lookup.
 * (6.1 also loses the bound of such an index through `|`.)
 *
 * No test of what the verifier already knows on that path (the protocol, tested
 * again): it explores the other way too, as speculative execution.
 *
 * Keys: 6.1 refuses any write of less than 8 bytes into a stack slot that holds
 * a spilled register ("attempt to corrupt spilled pointer on stack", scalars
 * too; Linux 6.3 lets scalars be), and the compiler reuses slots freely.  So keys
 * are built a 64-bit word at a time, in registers, and stored whole
 * (little-endian words: x86-64 and arm64); a 4-byte key (an array index) is kept
 * in a u64 and passed as (u32 *); a buffer a helper fills is cleared first
 * (alf_clear).  The kernel tier (tests/kernel) loads every program alfwrapper
 * generates in 6.1's verifier and the host's to hold this up. */

/* A helper's write into a stack buffer is checked byte by byte, like a store: so a
 * buffer a helper fills is zeroed first, by 8-byte stores the compiler must keep
 * (the asm says the buffer is read), which take the slots back from any register
 * spilled there. */
#define alf_clear(buf)                                                          \
    do {                                                                        \
        __builtin_memset(buf, 0, sizeof(buf));                                  \
        asm volatile("" : : "r"(buf) : "memory");                               \
    } while (0)

/* An address (16 bytes, network order) as the two 64-bit words it is in memory. */
static __always_inline void alf_addr_words(const u8 addr[16], u64 *hi, u64 *lo)
{
    __builtin_memcpy(hi, addr, 8);
    __builtin_memcpy(lo, addr + 8, 8);
}

/* The 20-byte key {u8 a; u8 b; u8 pad[2]; u8 addr[16]} (the subnet and knock
 * keys), as three words stored whole; `words` must be 24 bytes, 8-aligned. */
static __always_inline void alf_key20(u64 words[3], u8 a, u8 b, u64 hi, u64 lo)
{
    words[0] = (u64)a | ((u64)b << 8) | (hi << 32);
    words[1] = (hi >> 32) | (lo << 32);
    words[2] = lo >> 32;
}

/* Read the network header, and (with ALF_PORTS) the transport header's ports and
 * flags.  Returns the family, 4 or 6, or 0 for a packet the filter must drop:
 * not IP, a header that cannot be read, an IPv6 source that is an
 * IPv4-mapped address (::ffff:0:0/96; no host sends those on the wire, and
 * the application would see them as the IPv4 address they name), or an
 * IPv6 extension-header chain longer than ALF_IPV6_EXT_MAX.  IPv4 packets on
 * a dual-stack IPv6 socket are IPv4 here: the kernel hands the socket the
 * IPv4 packet as it arrived. */
static __always_inline int alf_parse_packet(struct __sk_buff *skb, struct alf_packet *pkt)
{
    /* Every header is read into this one buffer, whose bytes every path has then
     * written: a verifier without CAP_PERFMON compares stack bytes exactly when it
     * prunes, so buffers of their own, written on some paths only, would keep the
     * paths apart and multiply its work. */
    u64 words[5];
    alf_clear(words);
    u8 *head = (u8 *)words;
    if (skb->protocol == ALF_PROTO_IP4) {
        if (bpf_skb_load_bytes_relative(skb, 0, head, 20, BPF_HDR_START_NET) < 0)
            return 0;
        if ((head[0] >> 4) != 4 || (head[0] & 0xf) < 5)
            return 0;
        __builtin_memcpy(pkt->addr, head + 12, 4);
        pkt->family = 4;
        pkt->proto = head[9];
        pkt->l4_offset = (head[0] & 0xf) * 4;
        /* A later fragment carries no transport header (a socket only ever
         * sees reassembled packets, so this happens in test runs only). */
        if ((head[6] & 0x1f) || head[7])
            return 0;
    } else if (skb->protocol == ALF_PROTO_IP6) {
        if (bpf_skb_load_bytes_relative(skb, 0, head, 40, BPF_HDR_START_NET) < 0)
            return 0;
        if ((head[0] >> 4) != 6)
            return 0;
        __builtin_memcpy(pkt->addr, head + 8, 16);
        if (words[1] == 0 && (u32)words[2] == __builtin_bswap32(0xffff))
            return 0; /* ::ffff:0:0/96 */
        pkt->family = 6;
        u8 next = head[6];
        u32 offset = 40;
        #pragma unroll
        for (int i = 0; i < ALF_IPV6_EXT_MAX; i++) {
            if (next == 0 || next == 43 || next == 60) { /* hop-by-hop, routing, destination */
                if (bpf_skb_load_bytes_relative(skb, offset, head, 2, BPF_HDR_START_NET) < 0)
                    return 0;
                next = head[0];
                offset += ((u32)head[1] + 1) * 8;
            } else if (next == 51) { /* authentication header */
                if (bpf_skb_load_bytes_relative(skb, offset, head, 2, BPF_HDR_START_NET) < 0)
                    return 0;
                next = head[0];
                offset += ((u32)head[1] + 2) * 4;
            } else if (next == 44) { /* fragment: only a first fragment has ports */
                if (bpf_skb_load_bytes_relative(skb, offset, head, 4, BPF_HDR_START_NET) < 0)
                    return 0;
                if ((head[2] << 5 | head[3] >> 3) != 0)
                    return 0;
                next = head[0];
                offset += 8;
            } else {
                break;
            }
            /* A longer chain than we walk is dropped, tested here, on the header
             * just read: a test after the loop would ask again what the verifier
             * knows on every path out of it (see the transport header below). */
            if (i == ALF_IPV6_EXT_MAX - 1 &&
                (next == 0 || next == 43 || next == 60 || next == 51 || next == 44))
                return 0;
        }
        pkt->proto = next;
        pkt->l4_offset = offset;
    } else {
        return 0;
    }
    pkt->has_ports = 0;
#ifndef ALF_PORTS
    /* No part reads the transport header (alfwrapper defines ALF_PORTS where
     * knocking or a developer's filter does; the drop log reads an event's ports on
     * its own): the kernel checked it before the socket's filter runs, and a test
     * run's frames are judged by address. */
    pkt->tcp_flags = 0;
    pkt->sport = 0;
    pkt->dport = 0;
    return pkt->family;
#endif
    /* Each protocol on its own path: a test of a value the verifier already knows
     * (the protocol, again) makes a verifier without CAP_PERFMON explore the other
     * way too, as speculative execution, and that multiplies its work. */
    if (pkt->proto == IPPROTO_TCP) {
        if (bpf_skb_load_bytes_relative(skb, pkt->l4_offset & 0xffff, head, 14,
                                        BPF_HDR_START_NET) < 0)
            return 0;
        pkt->tcp_flags = head[13];
    } else if (pkt->proto == IPPROTO_UDP) {
        if (bpf_skb_load_bytes_relative(skb, pkt->l4_offset & 0xffff, head, 4,
                                        BPF_HDR_START_NET) < 0)
            return 0;
        pkt->tcp_flags = 0;
    } else {
        return pkt->family;
    }
    pkt->sport = ((u16)head[0] << 8) | head[1];
    pkt->dport = ((u16)head[2] << 8) | head[3];
    pkt->has_ports = 1;
    return pkt->family;
}

#ifdef ALF_LOG_RATE
/* The drop log (--log-drops RATE): one event per dropped packet into a ring
 * buffer (Linux 5.8), at most ALF_LOG_RATE a second with as many again in a
 * burst (a token bucket in alf_log_bucket, counted in nanoseconds of credit);
 * events past that, and events that find the ring buffer full, are counted,
 * not sent, and the next event sent says how many were suppressed before it.  The bucket is shared by all CPUs without
 * atomics: under a flood two CPUs may both spend the last token, so the rate
 * can be overshot by the number of CPUs, never more.  The event says when
 * (ts_ns), where (ifindex), why (reason) and from whom (family, proto, addr,
 * sport, dport). */
/* struct alf_event and struct alf_bucket are generated before this file, from
 * their one definition (bpf/parts.py). */
BPF_RINGBUF_OUTPUT(alf_events, ALF_LOG_PAGES);
BPF_ARRAY(alf_log_bucket, struct alf_bucket, 1);

#define ALF_LOG_COST (1000000000ULL / ALF_LOG_RATE)

static __always_inline void alf_log(struct __sk_buff *skb, const struct alf_packet *pkt, u32 reason)
{
    u64 zero = 0; /* stored whole (common.h) */
    struct alf_bucket *bucket = alf_log_bucket.lookup((u32 *)&zero);
    if (!bucket)
        return;
    /* The coarse clock (Linux 5.11; jiffies, a few ms) is half the price of
     * bpf_ktime_get_ns() and fine for a rate of events a second. */
    u64 now = bpf_ktime_get_coarse_ns();
    u64 credit = bucket->credit_ns + (now - bucket->last_ns);
    if (credit > ALF_LOG_COST * ALF_LOG_RATE || bucket->last_ns == 0)
        credit = ALF_LOG_COST * ALF_LOG_RATE; /* a burst of one second's worth */
    bucket->last_ns = now;
    if (credit < ALF_LOG_COST) {
        bucket->credit_ns = credit;
        bucket->pending += 1;
        bucket->suppressed += 1;
        return;
    }
    bucket->credit_ns = credit - ALF_LOG_COST;
    u16 sport = pkt->sport, dport = pkt->dport;
#ifndef ALF_PORTS
    /* No part read the transport header: its ports are read here, for an event that
     * is sent, so that neither a passed packet nor a drop beyond the rate pays for it. */
    if (pkt->proto == IPPROTO_TCP || pkt->proto == IPPROTO_UDP) {
        u64 head[1];
        alf_clear(head);
        if (bpf_skb_load_bytes_relative(skb, pkt->l4_offset & 0xffff, head, 4,
                                        BPF_HDR_START_NET) == 0) {
            u8 *at = (u8 *)head;
            sport = ((u16)at[0] << 8) | at[1];
            dport = ((u16)at[2] << 8) | at[3];
        }
    }
#endif
    /* Written in place in the ring buffer: no copy. */
    struct alf_event *ev = alf_events.ringbuf_reserve(sizeof(struct alf_event));
    if (!ev) { /* the buffer is full (nobody reads the log): counted, never lost unseen */
        bucket->pending += 1;
        bucket->suppressed += 1;
        return;
    }
    ev->ts_ns = now;
    ev->ifindex = skb->ingress_ifindex;
    ev->suppressed = bucket->pending;
    ev->sport = sport;
    ev->dport = dport;
    ev->reason = reason;
    ev->family = pkt->family;
    ev->proto = pkt->proto;
    ev->pad = 0;
    __builtin_memcpy(ev->addr, pkt->addr, 16);
    alf_events.ringbuf_submit(ev, 0);
    bucket->pending = 0;
}
#endif

#ifdef ALF_REASONS
/* Count a dropped packet by its reason, and log it if asked to. */
static __always_inline int alf_drop(struct __sk_buff *skb, const struct alf_packet *pkt, u32 reason)
{
#ifdef ALF_LOG_RATE
    alf_log(skb, pkt, reason);
#endif
    return alf_count(reason);
}
#endif

/* The packet's source address only (4 or 16 bytes, network order), with
 * the same checks as alf_parse_packet().  Returns 4, 6 or 0 (drop). */
static __always_inline int alf_source_address(struct __sk_buff *skb, u8 addr[16])
{
    struct alf_packet pkt = {};
    int family = alf_parse_packet(skb, &pkt);
    __builtin_memcpy(addr, pkt.addr, 16);
    return family;
}

#endif
