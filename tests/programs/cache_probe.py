"""Load one kind of program as a start would (program cache per ALFWRAPPER_CACHE) and
print, as JSON, whether BCC was imported or LLVM mapped, the kernel's verdicts on a
few frames, and the cache key.  Run in a fresh process per load.

    cache_probe.py KIND [poison]

KIND: subnets, interfaces (lo), knock, filter (examples/filters/allowlist.c with
--set).  ``poison``: first put a program the verifier refuses under the key.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from alfwrapper.bpf import cache, compiler, program
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.host import kernel_headers
from alfwrapper.host.bpf_calls import prog_info, prog_test_run
from alfwrapper.host.frames import tcp_syn_frame, udp_frame
from alfwrapper.host.interfaces import link_index
from alfwrapper.policy.prefixes import parse_prefix
from alfwrapper.policy.rules import (
    CustomFilter,
    KnockRules,
    MapSetting,
    SocketRules,
    SubnetRules,
)

FILTER = str(Path(__file__).resolve().parents[2] / "examples" / "filters" / "allowlist.c")
KINDS = {
    "subnets": SocketRules(
        subnets=SubnetRules(
            allow=tuple(map(parse_prefix, ("192.0.2.0/24", "2001:db8::/32"))),
            deny=tuple(map(parse_prefix, ("192.0.2.7", "2001:db8:bad::/48"))),
        )
    ),
    "interfaces": SocketRules(interfaces=("lo",)),
    "knock": SocketRules(knock=KnockRules(ports=(7000, 8000, 9000))),
    "filter": SocketRules(
        custom=CustomFilter(
            path=FILTER,
            sets=(
                MapSetting(map="allowed4", key="192.0.2.1", value="1"),
                MapSetting(map="allowed6", key="2001:db8::1", value="1"),
                MapSetting(map="port_limits", key="0", value="8080,1"),
            ),
        )
    ),
}
PROBES = [
    (4, 0xC0000201),  # 192.0.2.1
    (4, 0xC0000207),  # 192.0.2.7
    (4, 0xC6336401),  # 198.51.100.1
    (6, 0x20010DB8 << 96 | 1),
    (6, 0x20010DB80BAD << 80 | 1),
    (6, 0x20010DB9 << 96),
]

kind = sys.argv[1]
plan = program.plan_program(KINDS[kind], label_="probe_t1")
headers = kernel_headers.find()
assert headers is not None
key = cache.key(plan.text, plan.cflags, list(plan.programs), str(headers.where))
if sys.argv[2:] == ["poison"]:
    bad = cache.CachedProgram(plan.entry, bytes.fromhex("9500000000000000"), ())  # exit, r0 unset
    cache.store(key, cache.Entry((), (bad,)))
env = FillEnv({1: "lo"}, link_index)
loaded = compiler.load_program(plan, env)
verdicts = []
for family, value in PROBES:
    to = 0xC0000201 if family == 4 else 0x20010DB8 << 96 | 2
    for frame in (udp_frame(family, value), tcp_syn_frame(family, value, 40000, to, 8080)):
        for ingress in (1, 999):  # lo, and an interface that is not there
            verdicts.append(prog_test_run(loaded.fd, frame, ingress_ifindex=ingress).retval != 0)
maps = Path("/proc/self/maps").read_text()
print(json.dumps({
    "compiled": "bcc" in sys.modules,
    "llvm": "libLLVM" in maps or "libbcc" in maps,
    "verdicts": verdicts,
    "name": prog_info(loaded.fd).name,
    "key": key,
}))  # fmt: skip
