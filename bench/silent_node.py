#!/usr/bin/env python3
"""bench/silent_node: a node's agent goes silent under a running 2 x 2 job, then returns.

A coordinator and two simulated 8-GPU agents on this machine (default settings, so
node_timeout 5 s and node_lost_timeout 5 minutes); a job of 2 nodes x 2 GPUs whose ranks
each append a line to a file when they start and wait for a go file. The second agent
is SIGSTOPped for `--silent` seconds, then continued; the go file is written once it is
back. The job must end COMPLETED on its first attempt with each rank started once.

    bench/silent_node.py [--build build] [--silent 60]
"""

import argparse
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--silent", type=float, default=60)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="corral-silent-")
    os.chmod(work, 0o777)
    starts, go = os.path.join(work, "starts"), os.path.join(work, "go")
    load_before = os.getloadavg()
    with LocalCluster(a.build, agents=2) as c:
        spec = (f"name: silent\ncommand: \"echo $RANK >> {starts}; while [ ! -e {go} ]; do sleep 0.1; done\"\n"
                "resources: {nodes: 2, gpus_per_node: 2}\n")
        job = c.submit(spec)
        deadline = time.time() + 30
        while c.get(f"/v1/jobs/{job}")["state"] != "RUNNING":
            if time.time() > deadline:
                sys.exit("the job did not start")
            time.sleep(0.05)
        agent = c.procs[2]  # the coordinator, then the agents in order
        agent.send_signal(signal.SIGSTOP)
        stopped = time.time()
        seen_down = None
        while time.time() - stopped < a.silent:
            node = next(n for n in c.get("/v1/nodes") if n["name"] == c.nodes[1])
            if seen_down is None and not node.get("connected", True):
                seen_down = time.time() - stopped
            time.sleep(0.5)
        during = c.get(f"/v1/jobs/{job}")["state"]
        agent.send_signal(signal.SIGCONT)
        back = time.time()
        while not next(n for n in c.get("/v1/nodes") if n["name"] == c.nodes[1]).get("connected", False):
            if time.time() - back > 30:
                sys.exit("the agent did not come back")
            time.sleep(0.05)
        rejoined = time.time() - back
        open(go, "w").close()
        end = c.get(f"/v1/jobs/{job}?wait=60")
        events = [e["text"] for e in end.get("events", [])]
    with open(starts) as f:
        started = sorted(int(x) for x in f.read().split())
    load_after = os.getloadavg()
    print(f"2 x 2 job, agent of {c.nodes[1]} SIGSTOPped {a.silent:g} s")
    print("| measure | value |")
    print("| --- | ---: |")
    print(f"| seconds until the node showed not connected | {f'{seen_down:.2f}' if seen_down is not None else '-'} |")
    print(f"| job state after the silence | {during} |")
    print(f"| seconds from SIGCONT to connected again | {rejoined:.2f} |")
    print(f"| job end state, attempt | {end['state']}, {end['attempt']} |")
    print(f"| rank starts seen (ranks) | {started} |")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    for e in events:
        if "silent" in e or "back" in e:
            print("event:", e)


if __name__ == "__main__":
    main()
