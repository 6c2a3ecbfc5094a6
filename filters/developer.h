/* developer.h: the packet as a developer's filter (--filter FILE.c) sees it.
 *
 * alfwrapper pastes this in front of a developer's filter.  A socket filter
 * on a TCP or UDP socket sees the packet from the transport header on, so a
 * filter written for one reads the ports at offset 0.  In a test run
 * (BPF_PROG_TEST_RUN, which alfwrapper uses to judge connections queued
 * before the filter, and for `explain`) the packet starts at the network
 * header instead.  So that both give the same verdict, the filter's packet
 * reads are redirected here: offsets from 0 up are from the transport header
 * in both contexts, SKF_NET_OFF + n is the network header, SKF_LL_OFF + n the
 * link-layer header.  The composed program puts the transport header's
 * offset in skb->cb[ALF_L4_CB] before calling the filter (socket filters may
 * use cb[] as scratch: the kernel saves and restores it around them).
 *
 * Covered: bpf_skb_load_bytes() and BCC's load_byte(), load_half() and
 * load_word().  bpf_skb_load_bytes_relative() reads as documented.
 */
#ifndef ALF_DEVELOPER_H
#define ALF_DEVELOPER_H
#include "common.h"

#ifndef ALF_L4_CB
#error "developer.h is compiled by alfwrapper, which defines ALF_L4_CB (parts.py)"
#endif
#ifndef SKF_NET_OFF
#define SKF_NET_OFF (-0x100000)
#define SKF_LL_OFF (-0x200000)
#endif

static __always_inline int alf_dev_load_bytes(struct __sk_buff *skb, s64 off, void *to, u32 len)
{
    if (off >= SKF_NET_OFF && off < 0)
        return bpf_skb_load_bytes_relative(skb, off - SKF_NET_OFF, to, len, BPF_HDR_START_NET);
    if (off >= SKF_LL_OFF && off < SKF_NET_OFF)
        return bpf_skb_load_bytes_relative(skb, off - SKF_LL_OFF, to, len, BPF_HDR_START_MAC);
    if (off < 0)
        return -22; /* -EINVAL */
    return bpf_skb_load_bytes_relative(skb, off + skb->cb[ALF_L4_CB], to, len, BPF_HDR_START_NET);
}

/* BCC's load_byte/half/word: big-endian loads, 0 when out of the packet. */
static __always_inline u64 alf_dev_load_n(struct __sk_buff *skb, s64 off, u32 size)
{
    u8 b[4] = {};
    if (size == 1) {
        if (alf_dev_load_bytes(skb, off, b, 1) < 0)
            return 0;
        return b[0];
    }
    if (size == 2) {
        if (alf_dev_load_bytes(skb, off, b, 2) < 0)
            return 0;
        return ((u64)b[0] << 8) | b[1];
    }
    if (alf_dev_load_bytes(skb, off, b, 4) < 0)
        return 0;
    return ((u64)b[0] << 24) | ((u64)b[1] << 16) | ((u64)b[2] << 8) | b[3];
}

#define bpf_skb_load_bytes(skb, off, to, len) alf_dev_load_bytes((void *)(skb), (off), (to), (len))
#define load_byte(skb, off) alf_dev_load_n((void *)(skb), (off), 1)
#define load_half(skb, off) alf_dev_load_n((void *)(skb), (off), 2)
#define load_word(skb, off) alf_dev_load_n((void *)(skb), (off), 4)

#endif /* ALF_DEVELOPER_H */
