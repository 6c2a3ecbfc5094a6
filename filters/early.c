/* early.c: early drop, the deny sets enforced at XDP on one interface
 * (alfwrapper set early; alfwrapper/sets/early.py attaches and feeds it).
 *
 * A frame is dropped here only where the socket it is addressed to would drop it
 * anyway: a TCP SYN (no ACK) or a UDP datagram, to a socket that the kernel's own
 * lookup finds (bpf_sk_lookup_tcp/udp: the socket the stack would hand it to), whose
 * bound address and port alf_early_ports lists with the sets that every socket there
 * denies, from a source that one of those sets holds, to one of this host's own
 * unicast addresses.  A deny set drops whatever
 * else a socket's program allows (sets.c), so the frame's fate is the same, decided
 * before the stack allocates anything for it.  Everything else passes unchanged:
 * other protocols, fragments, IPv6 extension headers, VLAN tags, packets of
 * connections, and a set that cannot be read (the socket's program then fails
 * closed on its own).
 *
 * Maps (their keys' layouts: EARLY_* in bpf/parts.py), filled by user space:
 *   alf_early_ports  (family, protocol, port, bound address) -> the sets' bits
 *   alf_early_local  (family, address) -> 1: this host's addresses
 *   alf_early_counts per CPU: dropped by set i at i, judged and passed at ALF_SETS
 *
 * Macros: sets.c's, with ALF_SETS == ALF_DENY_SETS; ALF_EARLY_PORTS and
 * ALF_EARLY_LOCAL, the maps' sizes.
 */
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#if !defined(ALF_EARLY_PORTS) || !defined(ALF_EARLY_LOCAL) || ALF_SETS != ALF_DENY_SETS
#error "early.c is compiled by alfwrapper, for deny sets alone"
#endif

BPF_F_TABLE("hash", struct alf_early_port, u64, alf_early_ports, ALF_EARLY_PORTS, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct alf_early_local, u64, alf_early_local, ALF_EARLY_LOCAL, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(alf_early_counts, u64, ALF_SETS + 1);

static __always_inline int early_count(u64 *at, int verdict)
{
    u64 *count = alf_early_counts.lookup((u32 *)at);
    if (count)
        *count += 1;
    return verdict;
}

/* The socket a frame is addressed to, as the stack would find it: its family, bound
 * address and port, as alf_early_ports' key (three words, stored whole: common.h);
 * 0 if none, or a TCP socket that is not listening (a SYN for a connection: the
 * stack's business). */
static __always_inline int early_socket(struct xdp_md *ctx, u64 tuple[5], u32 size, u8 proto,
                                        u64 key[3])
{
    struct bpf_sock *sk = proto == IPPROTO_TCP
        ? bpf_sk_lookup_tcp(ctx, (struct bpf_sock_tuple *)tuple, size, BPF_F_CURRENT_NETNS, 0)
        : bpf_sk_lookup_udp(ctx, (struct bpf_sock_tuple *)tuple, size, BPF_F_CURRENT_NETNS, 0);
    if (!sk)
        return 0;
    int found = proto != IPPROTO_TCP || sk->state == BPF_TCP_LISTEN;
    u8 family = sk->family == AF_INET ? 4 : 6;
    u64 hi, lo;
    if (family == 4) {
        hi = sk->src_ip4;
        lo = 0;
    } else {
        hi = (u64)sk->src_ip6[0] | (u64)sk->src_ip6[1] << 32;
        lo = (u64)sk->src_ip6[2] | (u64)sk->src_ip6[3] << 32;
    }
    u64 port = sk->src_port & 0xffff;
    bpf_sk_release(sk);
    alf_key20(key, family, proto, hi, lo);
    key[0] |= port << 16;
    return found;
}

int alf_early(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return XDP_PASS;
    u64 tuple[5]; /* struct bpf_sock_tuple: 36 bytes */
    alf_clear(tuple);
    u64 src_hi = 0, src_lo = 0, dst_hi = 0, dst_lo = 0;
    u8 family, proto;
    u32 size;
    void *l4;
    if (eth->h_proto == ALF_PROTO_IP4) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end || ip->ihl < 5 || (ip->frag_off & bpf_htons(0x3fff)))
            return XDP_PASS; /* fragments: their ports are not in every one */
        family = 4;
        proto = ip->protocol;
        l4 = (void *)ip + ip->ihl * 4;
        src_hi = ip->saddr;
        dst_hi = ip->daddr;
        size = sizeof(((struct bpf_sock_tuple *)0)->ipv4);
    } else if (eth->h_proto == ALF_PROTO_IP6) {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > end)
            return XDP_PASS;
        family = 6;
        proto = ip6->nexthdr; /* an extension header passes: the stack reads the chain */
        l4 = (void *)(ip6 + 1);
        __builtin_memcpy(&src_hi, &ip6->saddr, 8);
        __builtin_memcpy(&src_lo, (u8 *)&ip6->saddr + 8, 8);
        __builtin_memcpy(&dst_hi, &ip6->daddr, 8);
        __builtin_memcpy(&dst_lo, (u8 *)&ip6->daddr + 8, 8);
        size = sizeof(((struct bpf_sock_tuple *)0)->ipv6);
    } else {
        return XDP_PASS;
    }
    u64 ports;
    if (proto == IPPROTO_TCP) {
        struct tcphdr *tcp = l4;
        if ((void *)(tcp + 1) > end || !tcp->syn || tcp->ack)
            return XDP_PASS; /* a connection's packets: its socket judges them */
        ports = (u64)tcp->source | (u64)tcp->dest << 16;
    } else if (proto == IPPROTO_UDP) {
        struct udphdr *udp = l4;
        if ((void *)(udp + 1) > end)
            return XDP_PASS;
        ports = (u64)udp->source | (u64)udp->dest << 16;
    } else {
        return XDP_PASS;
    }
    /* The tuple, as bpf_sock_tuple lays it out: addresses, then ports (network
     * order), each family's words stored whole. */
    if (family == 4) {
        tuple[0] = (src_hi & 0xffffffff) | dst_hi << 32;
        tuple[1] = ports; /* sport, dport */
    } else {
        tuple[0] = src_hi;
        tuple[1] = src_lo;
        tuple[2] = dst_hi;
        tuple[3] = dst_lo;
        tuple[4] = ports;
    }
    u64 key[3];
    if (!early_socket(ctx, tuple, size, proto, key))
        return XDP_PASS;
    u64 *bits = alf_early_ports.lookup((struct alf_early_port *)key);
    if (!bits || !*bits)
        return XDP_PASS;
    u64 deny = *bits;
    /* Only frames to one of this host's unicast addresses: a socket bound to any
     * address would otherwise take frames the host forwards, and one bound to a
     * multicast or broadcast address shares each frame with every socket there. */
    u64 local[3];
    alf_key20(local, family, 0, dst_hi, dst_lo);
    if (!alf_early_local.lookup((struct alf_early_local *)local))
        return XDP_PASS;
    struct alf_set_keys k;
    u64 sieve_key = set_keys(&k, family, src_hi, src_lo);
    u64 at;
#pragma unroll
    for (u32 i = 0; i < ALF_SETS; i++) {
        if ((deny >> i) & 1) {
            u64 said = set_sieve(i, sieve_key, family, &k);
            if (!(said & ALF_SIEVE_UNREADABLE) && set_holds(i, said, &k) > 0) {
                at = i;
                return early_count(&at, XDP_DROP);
            }
        }
    }
    at = ALF_SETS;
    return early_count(&at, XDP_PASS);
}
