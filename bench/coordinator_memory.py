#!/usr/bin/env python3
"""bench/coordinator_memory: the coordinator's memory as jobs run through it. Four
simulated 8-GPU agents; one-GPU jobs of `true` submitted as arrays of --batch elements,
each batch drained before the next, until --jobs have run. Prints the coordinator's RSS
idle, after each batch, its peak (VmHWM), and 2 s and 95 s after the last job ended
(ended jobs are kept a minute for late reports, and freed memory is given back every
30 s), with the agent's, and the load average. Memory, not time: the load does not change it much.

    python3 bench/coordinator_memory.py [--build build] [--jobs 100000] [--batch 10000]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster  # noqa: E402


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--jobs", type=int, default=100000)
    p.add_argument("--batch", type=int, default=10000)
    args = p.parse_args()
    build = os.path.abspath(args.build)
    rows = []
    loads = []
    with LocalCluster(build, agents=4, sim="a100x8.yaml") as c:
        coord, agent = c.procs[0].pid, c.procs[1].pid
        time.sleep(2)  # settle after the joins: idle means idle
        rows.append(("idle", 0, status_kb(coord, "VmRSS"), status_kb(agent, "VmRSS")))
        done = 0
        t0 = time.time()
        while done < args.jobs:
            n = min(args.batch, args.jobs - done)
            spec = f"name: mem\ncommand: [true]\nresources: {{gpus: 1}}\narray: \"0-{n - 1}\"\n"
            c.submit(spec)
            if done == 0:
                rows.append((f"{n} pending", 0, status_kb(coord, "VmRSS"), status_kb(agent, "VmRSS")))
            c.drain(1800)
            done += n
            loads.append(os.getloadavg()[0])
            rows.append((f"after {done} ran", time.time() - t0, status_kb(coord, "VmRSS"), status_kb(agent, "VmRSS")))
        # Ended jobs stay in memory a minute for late reports, and freed memory goes back
        # to the system every 30 s: past both, what is left is what idles.
        ended = time.time()
        for after in (2, 95):
            time.sleep(max(0.0, ended + after - time.time()))
            rows.append((f"{after} s later", time.time() - t0, status_kb(coord, "VmRSS"), status_kb(agent, "VmRSS")))
        peak = status_kb(coord, "VmHWM")
    print(f"coordinator memory, {args.jobs} one-GPU jobs in arrays of {args.batch}, 4 simulated 8-GPU agents; "
          f"load average {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'point':24} {'s':>7} {'coordinator RSS MB':>19} {'agent RSS MB':>13}")
    for label, s, rss, arss in rows:
        print(f"{label:24} {s:7.1f} {rss / 1024:19.1f} {arss / 1024:13.1f}")
    print(f"{'coordinator peak (VmHWM)':24} {'':7} {peak / 1024:19.1f}")


if __name__ == "__main__":
    main()
