/* Compiles, but its loop takes the verifier past the instructions it processes for
 * one program (a million): the kernel refuses it with E2BIG, as it refuses a program
 * of too many maps, and the verifier gave up on it. */
#include "common.h"
int filter(struct __sk_buff *skb) {
  u64 n = skb->len;
  for (u32 i = 0; i < 600000; i++) {
    n = n * 3 + i;
    asm volatile("" : "+r"(n));
  }
  return n ? -1 : 0;
}
