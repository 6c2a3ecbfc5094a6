/* Does not compile: uses an undeclared identifier. */
#include "common.h"
int filter(struct __sk_buff *skb) {
  return undefined_thing;
}
