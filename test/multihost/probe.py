"""What a rank sees, for the multi-host tests: one line "PROBE {json}" on stderr (every
rank's stderr reaches the launcher) with TNT_RANK, TNT_SIZE, TNT_LOCAL_RANK, TNT_LOCAL_SIZE,
TNT_JOB_ID, TNT_TRANSPORT, the host name and the variables PROBE_SETTING and
TNT_FUSION_THRESHOLD_KB (what a user sets before tntrun, to see that it reaches every host),
and "stdout of rank N" on stdout.

    probe.py                 exit 0
    probe.py R CODE          rank R prints a line on stderr and exits CODE; the others wait
                             (120 s) until the failure stops them

It calls no collective: the shm transport cannot serve ranks on several hosts."""
import json
import os
import socket
import sys
import time

env = os.environ
me = {k: env.get("TNT_" + k.upper()) for k in
      ("rank", "size", "local_rank", "local_size", "job_id", "transport")}
me["host"] = socket.gethostname()
me["setting"] = env.get("PROBE_SETTING")
me["fusion_kb"] = env.get("TNT_FUSION_THRESHOLD_KB")
# one write per line: print() writes the line and its newline separately (unbuffered under
# tntrun), and the engine may put another rank's line between the two
sys.stderr.write("PROBE " + json.dumps(me) + "\n")
sys.stderr.flush()
print("stdout of rank", me["rank"], flush=True)
if len(sys.argv) > 1:
    if me["rank"] == sys.argv[1]:
        time.sleep(0.5)
        sys.stderr.write(f"rank {me['rank']} fails on purpose on {me['host']}\n")
        sys.stderr.flush()
        sys.exit(int(sys.argv[2]))
    time.sleep(120)
