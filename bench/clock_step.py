#!/usr/bin/env python3
"""bench/clock_step: the wall clocks of a running cluster's coordinator and agents step by
an hour, forward and back, under running jobs (libfaketime, whose offset file each process
reads at every clock call; the monotonic clock is left alone, as a real step leaves it).

A coordinator and two simulated 8-GPU agents on this machine (default node_timeout 5 s).
  1. A 2 x 2 job waits for a go file. The coordinator's clock steps +1 h, the agents'
     -1 h, then the other way round, each held for longer than node_timeout; then the go
     file. It must end COMPLETED on attempt 0, each rank started once, no node silent.
  2. Jobs of 2 x 2 with a 20 s time limit that never end by themselves, one per step
     (coordinator +1 h, coordinator -1 h): each must end TIMEOUT 20 s after it started
     (the coordinator checks time limits every schedule_interval, 1 s), not at once and
     not an hour late.

    bench/clock_step.py [--build build]

Needs libfaketime (Debian's faketime package) and root for nothing.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster, parse_time  # noqa: E402

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    a = p.parse_args()
    if not os.path.exists(LIBFAKETIME):
        sys.exit("needs " + LIBFAKETIME + " (apt-get install faketime)")
    work = tempfile.mkdtemp(prefix="corral-clock-")
    os.chmod(work, 0o777)
    offsets = {"coordinator": os.path.join(work, "coordinator.offset"), "agents": os.path.join(work, "agents.offset")}

    def step(who, offset):
        with open(offsets[who] + ".new", "w") as f:
            f.write(offset + "\n")
        os.replace(offsets[who] + ".new", offsets[who])

    for who in offsets:
        step(who, "+0")

    def faked(who):
        return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": offsets[who], "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    env = {"coordinator": faked("coordinator"), "bench-a": faked("agents"), "bench-b": faked("agents")}
    starts, go = os.path.join(work, "starts"), os.path.join(work, "go")
    rows = []
    load_before = os.getloadavg()
    with LocalCluster(a.build, agents=2, proc_env=env) as c:

        def running(job):
            deadline = time.time() + 30
            while (j := c.get(f"/v1/jobs/{job}"))["state"] != "RUNNING":
                if time.time() > deadline:
                    sys.exit(f"job {job} did not start: {j['state']}")
                time.sleep(0.05)
            return time.time()

        def silent_nodes():
            return [n["name"] for n in c.get("/v1/nodes") if n.get("silent_since") or n["state"] != "up"]

        # 1. A job that must run through the steps and complete.
        job = c.submit(f"name: through\ncommand: \"echo $RANK >> {starts}; while [ ! -e {go} ]; "
                       "do sleep 0.1; done\"\nresources: {nodes: 2, gpus_per_node: 2}\n")
        running(job)
        seen_silent = set()
        for coord, agents in (("+1h", "-1h"), ("-1h", "+1h"), ("+0", "+0")):
            step("coordinator", coord)
            step("agents", agents)
            held = time.time()
            while time.time() - held < 8:  # past node_timeout (5 s)
                seen_silent.update(silent_nodes())
                time.sleep(0.5)
            state = c.get(f"/v1/jobs/{job}")["state"]
            rows.append((f"coordinator {coord}, agents {agents}, held 8 s: job", state))
        open(go, "w").close()
        end = c.get(f"/v1/jobs/{job}?wait=60")
        with open(starts) as f:
            started = sorted(int(x) for x in f.read().split())
        rows.append(("job end state, attempt", f"{end['state']}, {end['attempt']}"))
        rows.append(("rank starts seen", str(started)))
        rows.append(("nodes ever shown silent or not up", ", ".join(sorted(seen_silent)) or "none"))

        # 2. Time limits across a step of the coordinator's clock.
        for coord in ("+1h", "-1h"):
            step("coordinator", "+0")
            job = c.submit("name: limit\ncommand: \"sleep 600\"\ntime_limit: 20s\n"
                           "resources: {nodes: 2, gpus_per_node: 2}\n")
            started_at = running(job)
            step("coordinator", coord)
            end = c.get(f"/v1/jobs/{job}?wait=60")
            while end["state"] not in ("TIMEOUT", "FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL"):
                if time.time() - started_at > 120:
                    break
                end = c.get(f"/v1/jobs/{job}?wait=60")
            ended = time.time() - started_at
            rows.append((f"20 s limit, coordinator {coord} after start: end, seconds after RUNNING seen",
                         f"{end['state']} {end.get('reason', '')}, {ended:.1f}"))
            times = (end.get("started_at"), end.get("ended_at"))
            if all(times):
                rows.append(("  its started_at / ended_at (dated by the stepped clock)", f"{times[0]} / {times[1]}"))
                rows.append(("  ended_at - started_at, s", f"{(parse_time(times[1]) - parse_time(times[0])):.1f}"))
        step("coordinator", "+0")
    load_after = os.getloadavg()
    print("| measure | value |")
    print("| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")


if __name__ == "__main__":
    main()
