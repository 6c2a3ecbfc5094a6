"""Plan, load and fill the program of a start with these rule files, as a start does
(the program, table and rule-file caches per ALFWRAPPER_CACHE), and print, as JSON:
whether the subnet table came from the cache, whether numpy was imported by then
(a rule file read and parsed), the kernel's verdicts on the probes, and the rules'
own (SubnetRules.passes, which reads every file).  Run in a fresh process per start.

    table_probe.py ALLOW_FILE DENY_FILE PROBES_JSON
"""

from __future__ import annotations

import json
import sys

from alfwrapper.bpf import compiler, program, table_cache
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.host.bpf_calls import prog_test_run
from alfwrapper.host.frames import udp_frame

allow_file, deny_file, probes_json = sys.argv[1:4]
policy = parse_policy(
    ["--listen", "127.0.0.1:9", "--allow-file", allow_file, "--deny-file", deny_file, "--", "true"]
)
rules = policy.rules_for(policy.listens[0].name)
plan = program.plan_program(rules)
loaded = compiler.load_program(plan, FillEnv())
said = {
    "cached": isinstance(plan.data("subnets"), table_cache.Image),
    "numpy": "numpy" in sys.modules,
}
probes = json.loads(probes_json)
said["kernel"] = [prog_test_run(loaded.fd, udp_frame(f, v)).retval != 0 for f, v in probes]
said["python"] = [rules.subnets.passes(f, v) for f, v in probes]
print(json.dumps(said))
