/* siphash.h: SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
 * 2012) of a message of six 64-bit words, the tag of a single-packet authorization
 * datagram (spa.c, KNOCK_SPA 2).
 *
 * Why SipHash: a keyed MAC made for short inputs, whose whole computation is 64-bit
 * additions, rotations and xors: straight-line code with no table, no loop and no
 * helper, about 300 instructions for 48 bytes, which every verifier the README
 * names takes as it is (the kernel's own selftests carry a BPF SipHash).  Its
 * 64-bit tag and 128-bit key are what the datagram needs: a forger must guess the
 * tag (one chance in 2^64 a datagram, each of which the filter answers the same
 * silent way), and recovering the key takes about 2^128 work.  HMAC-SHA256, as
 * fwknop uses, would need SHA-256's 64 rounds and its message schedule in BPF.
 *
 * The message words are read little-endian, as SipHash defines them: the bytes of
 * the datagram as they lie in memory on a little-endian machine (x86-64, arm64).
 * The test vectors of alfwrapper.policy(5) hold this code, the Python one
 * (alfwrapper/policy/spa.py) and the example client to the reference.
 */
#ifndef ALF_SIPHASH_H
#define ALF_SIPHASH_H

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "siphash.h reads the message as little-endian words"
#endif

#define ALF_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define ALF_SIPROUND                                                            \
    do {                                                                        \
        v0 += v1;                                                               \
        v1 = ALF_ROTL(v1, 13);                                                  \
        v1 ^= v0;                                                               \
        v0 = ALF_ROTL(v0, 32);                                                  \
        v2 += v3;                                                               \
        v3 = ALF_ROTL(v3, 16);                                                  \
        v3 ^= v2;                                                               \
        v0 += v3;                                                               \
        v3 = ALF_ROTL(v3, 21);                                                  \
        v3 ^= v0;                                                               \
        v2 += v1;                                                               \
        v1 = ALF_ROTL(v1, 17);                                                  \
        v1 ^= v2;                                                               \
        v2 = ALF_ROTL(v2, 32);                                                  \
    } while (0)

/* One message word: two compression rounds. */
#define ALF_SIP_WORD(m)                                                         \
    do {                                                                        \
        u64 word_ = (m);                                                        \
        v3 ^= word_;                                                            \
        ALF_SIPROUND;                                                           \
        ALF_SIPROUND;                                                           \
        v0 ^= word_;                                                            \
    } while (0)

/* SipHash-2-4 under the key (k0, k1) of the 48 bytes m[0..5]. */
static __always_inline u64 alf_siphash48(u64 k0, u64 k1, const u64 m[6])
{
    u64 v0 = k0 ^ 0x736f6d6570736575ULL;
    u64 v1 = k1 ^ 0x646f72616e646f6dULL;
    u64 v2 = k0 ^ 0x6c7967656e657261ULL;
    u64 v3 = k1 ^ 0x7465646279746573ULL;
    ALF_SIP_WORD(m[0]);
    ALF_SIP_WORD(m[1]);
    ALF_SIP_WORD(m[2]);
    ALF_SIP_WORD(m[3]);
    ALF_SIP_WORD(m[4]);
    ALF_SIP_WORD(m[5]);
    ALF_SIP_WORD(48ULL << 56); /* the length, and no bytes left over */
    v2 ^= 0xff;
    ALF_SIPROUND;
    ALF_SIPROUND;
    ALF_SIPROUND;
    ALF_SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

#endif /* ALF_SIPHASH_H */
