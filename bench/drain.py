#!/usr/bin/env python3
"""bench/drain: 1,000 one-GPU jobs of `true` submitted at once to four simulated 8-GPU
agents; the time until all are COMPLETED. Prints a table.

    bench/drain.py [--build build] [--jobs 1000] [--agents 4] [--clients 8] [--runs 3]

The time is taken from the jobs themselves: the last ended_at minus the first
submitted_at, both stamped by the coordinator.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster, from_clients, parse_time, percentile  # noqa: E402

SPEC = 'name: drain\ncommand: ["true"]\nresources:\n  gpus_per_node: 1\n'


def one_run(c, jobs, clients):
    submitted, ids = from_clients(lambda: c.submit(SPEC), jobs, clients)
    # A wait is answered when its job ends: wait on the oldest live job until none is left.
    deadline = time.time() + 120
    while True:
        live = c.get("/v1/jobs")
        if not live:
            break
        if time.time() > deadline:
            raise RuntimeError("jobs did not drain in 120 s")
        c.get(f"/v1/jobs/{live[0]['id']}?wait=30")
    done = [j for j in c.get("/v1/jobs?all=1") if j["id"] in set(ids)]
    states = {}
    for j in done:
        states[j["state"]] = states.get(j["state"], 0) + 1
    first = min(parse_time(j["submitted_at"]) for j in done)
    last = max(parse_time(j["ended_at"]) for j in done)
    return last - first, submitted, states


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build"))
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(f"| run | jobs | agents × GPUs | submit phase | all COMPLETED after | jobs/s | states |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- |")
    totals = []
    for run in range(a.runs):
        with LocalCluster(a.build, agents=a.agents, sim="a100x8.yaml") as c:
            took, submitted, states = one_run(c, a.jobs, a.clients)
            totals.append(took)
            ok = states.get("COMPLETED", 0) == a.jobs
            print(f"| {run + 1} | {a.jobs} | {a.agents} × 8 | {submitted:.2f} s | {took:.2f} s | {a.jobs / took:.0f} | "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(states.items()))}{'' if ok else ' (NOT ALL COMPLETED)'} |")
    print(f"\nmedian: {percentile(totals, 0.5):.2f} s from the first submit to the last job COMPLETED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
