/* Compiles, but reads past the end of a stack buffer: the verifier refuses it. */
#include "common.h"
int filter(struct __sk_buff *skb) {
  volatile u8 buf[4] = {};
  u32 i = skb->len;
  return buf[i];
}
