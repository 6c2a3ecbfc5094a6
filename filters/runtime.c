/* runtime.c: allow and deny rules added to a running service (alfwrapper
 * allow / deny / revoke), without recompiling.
 *
 *   alf_runtime        LPM_TRIE struct alf_runtime_key -> u8 verdict, per
 *                      socket, pinned (state.py): ALF_RUNTIME_ALLOW or
 *                      ALF_RUNTIME_DENY.  The most specific rule decides.
 *   alf_runtime_count  ARRAY[1] u32: 1 once alf_runtime may hold rules (never
 *                      cleared: a revoke may race a deny), so that a socket that never had
 *                      any pays one array lookup, not a trie walk.
 *
 * A runtime rule decides before the policy's subnet rules: a runtime deny
 * drops, a runtime allow passes the subnet check (interface, knocking and a
 * developer's filter still apply).  The rules stay until revoked: a reload or
 * restart keeps them (state.inherit_runtime gives a new socket those of the
 * service's earlier sockets of its name).
 *
 * Both maps are the socket's own, pinned: the wrapper hands the program the
 * pinned ones in place of fresh ones (compiler.py).
 *
 * Macros: ALF_RUNTIME_RULES (max entries), ALF_RUNTIME_ALLOW, ALF_RUNTIME_DENY.
 */
#ifndef ALF_RUNTIME_C
#define ALF_RUNTIME_C
#include "common.h"

#if !defined(ALF_RUNTIME_RULES) || !defined(ALF_RUNTIME_DENY)
#error "runtime.c is compiled by alfwrapper, which defines its settings"
#endif

/* struct alf_runtime_key { u32 prefixlen; u8 family; u8 pad[3]; u8 addr[16]; }:
 * defined once, in Python (parts.RUNTIME_KEY_C), which fills and reads the trie;
 * prefixlen is 32 (family and padding) + the prefix length. */

BPF_F_TABLE("lpm_trie", struct alf_runtime_key, u8, alf_runtime, ALF_RUNTIME_RULES,
            BPF_F_NO_PREALLOC);
BPF_ARRAY(alf_runtime_count, u32, 1);

/* 0 if no runtime rule matches, else ALF_RUNTIME_ALLOW or ALF_RUNTIME_DENY. */
static __always_inline u32 runtime_verdict(const struct alf_packet *pkt)
{
    u64 zero = 0; /* stored whole (common.h) */
    u32 *count = alf_runtime_count.lookup((u32 *)&zero);
    if (!count || !*count)
        return 0;
    union {
        struct alf_runtime_key key;
        u64 words[3];
    } k; /* stored a word at a time (common.h) */
    u64 hi, lo;
    alf_addr_words(pkt->addr, &hi, &lo);
    k.words[0] = (u64)(32 + (pkt->family == 4 ? 32 : 128)) | ((u64)pkt->family << 32);
    k.words[1] = hi;
    k.words[2] = lo;
    u8 *verdict = alf_runtime.lookup(&k.key);
    return verdict ? *verdict : 0;
}

#endif /* ALF_RUNTIME_C */
