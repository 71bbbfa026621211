#!/usr/bin/env python3
"""bench/ending_cost: what ENDING costs the job that waits for the GPUs.

A job that ends keeps its GPUs and port until every agent has confirmed that no process
of it is left (process groups empty, no process with its CORRAL_JOB_ID/CORRAL_ATTEMPT).
This measures, on a coordinator and two simulated 8-GPU agents on this machine, with
2 x 8-rank jobs that take every GPU:

  idle:   `submit` returned -> every rank of the job started, on an idle cluster;
  behind: the job is queued behind one whose ranks run `sleep` (which honours SIGTERM);
          `cancel` of that one returned -> every rank of the queued job started.

The two kinds alternate, `--runs` of each; medians, p90 and the difference, with the
load average.

    bench/ending_cost.py [--build build] [--runs 20]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster, percentile  # noqa: E402

RANKS = 16


def spec(command, name):
    return (f"name: {name}\ncommand: [" + ", ".join(f'"{a}"' for a in command) + "]\n"
            "resources: {nodes: 2, gpus_per_node: 8}\ntime_limit: 5m\n")


def started(folder):
    """The time the last of the ranks got to run, once all have."""
    while True:
        names = [n for n in os.listdir(folder) if n.endswith(".t")]
        if len(names) == RANKS:
            try:
                return max(int(open(os.path.join(folder, n)).read()) / 1e9 for n in names)
            except ValueError:
                pass  # a rank is writing its stamp
        time.sleep(0.002)


def run(c, stamp, behind):
    scratch = tempfile.mkdtemp(prefix="corral-ending-")
    try:
        blocker = None
        if behind:
            blocker = c.submit(spec(["sleep", "300"], "blocker"))
            deadline = time.time() + 30
            while c.get(f"/v1/jobs/{blocker}")["state"] != "RUNNING":
                if time.time() > deadline:
                    raise RuntimeError("the blocking job did not start")
                time.sleep(0.01)
        job = c.submit(spec([stamp, scratch], "measured"))
        t0 = time.time()
        if behind:
            status, body = c.call("POST", f"/v1/jobs/{blocker}/cancel")
            if status != 200:
                raise RuntimeError(f"cancel: {status} {body}")
            t0 = time.time()
        t1 = started(scratch)
        end = c.get(f"/v1/jobs/{job}?wait=60")
        if end["state"] != "COMPLETED":
            raise RuntimeError(f"job {job} ended {end['state']}")
        return t1 - t0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    stamp = os.path.abspath(os.path.join(a.build, "bench", "stamp"))
    load_before = os.getloadavg()
    idle, behind = [], []
    with LocalCluster(os.path.abspath(a.build), agents=2) as c:
        for _ in range(a.runs):
            idle.append(run(c, stamp, False))
            behind.append(run(c, stamp, True))
    load_after = os.getloadavg()
    ms = lambda v: f"{v * 1000:.1f}"
    print(f"{'':<8} {'median_ms':>10} {'p90_ms':>8} {'min_ms':>8} {'max_ms':>8}")
    for name, v in (("idle", idle), ("behind", behind)):
        print(f"{name:<8} {ms(statistics.median(v)):>10} {ms(percentile(v, 90)):>8} {ms(min(v)):>8} {ms(max(v)):>8}")
    print(f"ENDING costs the queued job {ms(statistics.median(behind) - statistics.median(idle))} ms (median difference), "
          f"{a.runs} runs each; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")


if __name__ == "__main__":
    main()
