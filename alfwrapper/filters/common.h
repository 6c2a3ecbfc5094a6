/* common.h: what every alfwrapper filter shares.
 *
 * Return convention of a socket filter: the number of bytes of the packet to
 * keep.  ALF_DROP (0) drops it, ALF_PASS keeps all of it.  Never return a
 * smaller non-zero length: that would trim TCP segments.
 *
 * A filter on a TCP or UDP socket sees the packet from its transport header
 * on, so L3 fields are read relative to the network header
 * (BPF_HDR_START_NET; Linux 4.18), never at fixed offsets from skb->data.
 */
#ifndef ALF_COMMON_H
#define ALF_COMMON_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>

#define ALF_DROP 0
#define ALF_PASS (-1)

/* skb->protocol is big-endian. */
#define ALF_PROTO_IP4 __builtin_bswap16(ETH_P_IP)
#define ALF_PROTO_IP6 __builtin_bswap16(ETH_P_IPV6)

/* Copy the packet's L3 source address into addr (4 or 16 bytes, network
 * order).  Returns the family, 4 or 6, or 0 for a packet that is not IP or
 * whose header cannot be read.  IPv4 packets on a dual-stack IPv6 socket are
 * IPv4 here: the kernel hands the socket the IPv4 packet as it arrived. */
static __always_inline int alf_source_address(struct __sk_buff *skb, u8 addr[16])
{
    if (skb->protocol == ALF_PROTO_IP4) {
        if (bpf_skb_load_bytes_relative(skb, 12, addr, 4, BPF_HDR_START_NET) < 0)
            return 0;
        return 4;
    }
    if (skb->protocol == ALF_PROTO_IP6) {
        if (bpf_skb_load_bytes_relative(skb, 8, addr, 16, BPF_HDR_START_NET) < 0)
            return 0;
        return 6;
    }
    return 0;
}

#endif
