/* Compiles, but needs more than the 512 bytes of stack a BPF program has: LLVM's BPF
 * back end says so and ends the process (exit(1)), with no error returned to BCC. */
#include "common.h"
int filter(struct __sk_buff *skb) {
  volatile u8 buf[600] = {};
  u32 i = skb->len & 511;
  return buf[i];
}
