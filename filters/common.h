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
    u64 *count = alf_counters.lookup(&reason);
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

/* One packet's headers, as every part sees them. */
struct alf_packet {
    u8 addr[16];   /* source address, network order; IPv4 in the first 4 bytes */
    u8 family;     /* 4 or 6 */
    u8 proto;      /* transport protocol: IPPROTO_TCP, IPPROTO_UDP, or another */
    u8 tcp_flags;  /* TCP only: FIN, SYN, RST, PSH, ACK, URG, ... */
    u8 has_ports;  /* 1 if sport and dport were read (TCP and UDP) */
    u16 sport;     /* host order */
    u16 dport;
    u32 l4_offset; /* transport header, bytes after the network header */
};

/* Read the network header, and the transport header's ports and flags.
 * Returns the family, 4 or 6, or 0 for a packet the filter must drop:
 * not IP, a header that cannot be read, an IPv6 source that is an
 * IPv4-mapped address (::ffff:0:0/96; no host sends those on the wire, and
 * the application would see them as the IPv4 address they name), or an
 * IPv6 extension-header chain longer than ALF_IPV6_EXT_MAX.  IPv4 packets on
 * a dual-stack IPv6 socket are IPv4 here: the kernel hands the socket the
 * IPv4 packet as it arrived. */
static __always_inline int alf_parse_packet(struct __sk_buff *skb, struct alf_packet *pkt)
{
    u8 head[40];
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
        u32 w0 = 0, w1 = 0, w2 = 0;
        __builtin_memcpy(&w0, head + 8, 4);
        __builtin_memcpy(&w1, head + 12, 4);
        __builtin_memcpy(&w2, head + 16, 4);
        if (w0 == 0 && w1 == 0 && w2 == __builtin_bswap32(0xffff))
            return 0;
        pkt->family = 6;
        u8 next = head[6];
        u32 offset = 40;
        #pragma unroll
        for (int i = 0; i < ALF_IPV6_EXT_MAX; i++) {
            u8 ext[2];
            if (next == 0 || next == 43 || next == 60) { /* hop-by-hop, routing, destination */
                if (bpf_skb_load_bytes_relative(skb, offset, ext, 2, BPF_HDR_START_NET) < 0)
                    return 0;
                next = ext[0];
                offset += ((u32)ext[1] + 1) * 8;
            } else if (next == 51) { /* authentication header */
                if (bpf_skb_load_bytes_relative(skb, offset, ext, 2, BPF_HDR_START_NET) < 0)
                    return 0;
                next = ext[0];
                offset += ((u32)ext[1] + 2) * 4;
            } else if (next == 44) { /* fragment: only a first fragment has ports */
                u8 frag[4];
                if (bpf_skb_load_bytes_relative(skb, offset, frag, 4, BPF_HDR_START_NET) < 0)
                    return 0;
                if ((frag[2] << 5 | frag[3] >> 3) != 0)
                    return 0;
                next = frag[0];
                offset += 8;
            } else {
                break;
            }
        }
        if (next == 0 || next == 43 || next == 60 || next == 51 || next == 44)
            return 0;
        pkt->proto = next;
        pkt->l4_offset = offset;
    } else {
        return 0;
    }
    pkt->has_ports = 0;
    if (pkt->proto == IPPROTO_TCP || pkt->proto == IPPROTO_UDP) {
        u8 l4[14] = {};
        u32 want = pkt->proto == IPPROTO_TCP ? 14 : 4;
        if (bpf_skb_load_bytes_relative(skb, pkt->l4_offset & 0xffff, l4, want,
                                        BPF_HDR_START_NET) < 0)
            return 0;
        pkt->sport = ((u16)l4[0] << 8) | l4[1];
        pkt->dport = ((u16)l4[2] << 8) | l4[3];
        pkt->tcp_flags = pkt->proto == IPPROTO_TCP ? l4[13] : 0;
        pkt->has_ports = 1;
    }
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
 * their one definition (droplog.py). */
BPF_RINGBUF_OUTPUT(alf_events, ALF_LOG_PAGES);
BPF_ARRAY(alf_log_bucket, struct alf_bucket, 1);

#define ALF_LOG_COST (1000000000ULL / ALF_LOG_RATE)

static __always_inline void alf_log(struct __sk_buff *skb, const struct alf_packet *pkt, u32 reason)
{
    u32 zero = 0;
    struct alf_bucket *bucket = alf_log_bucket.lookup(&zero);
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
    ev->sport = pkt->sport;
    ev->dport = pkt->dport;
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
