#!/usr/bin/env python3
"""bench/array_sweep: a sweep of N one-GPU jobs of `true`, submitted with the real `corral` CLI
to four simulated 8-GPU agents, two ways in turns (A B A B ...) in one run:

  array     one `corral submit --array 0-(N-1) -G 1 -- true`
  separate  N `corral submit -G 1 -- true` processes, one after another (a shell loop)

For each: the wall time of the submitting command(s), and the time until every job has
ended (the last ended_at minus the first submitted_at, both stamped by the coordinator).
Prints medians with min-max, the ratio separate/array, and the load average.

    python3 bench/array_sweep.py [--build build] [--jobs 1000] [--runs 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster, ROOT, parse_time  # noqa: E402


def drained(c, ids):
    c.drain(300)
    wanted = set(ids)
    done = [j for j in c.get("/v1/jobs?all=1") if j["id"] in wanted]
    bad = [j for j in done if j["state"] != "COMPLETED"]
    if len(done) != len(ids) or bad:
        raise RuntimeError(f"{len(done)} of {len(ids)} jobs found, {len(bad)} not COMPLETED")
    first = min(parse_time(j["submitted_at"]) for j in done)
    last = max(parse_time(j["ended_at"]) for j in done)
    return last - first


def as_array(cli, env, c, n):
    t = time.perf_counter()
    out = subprocess.run([cli, "submit", "--json", "--array", f"0-{n - 1}", "-G", "1", "--", "true"], env=env,
                         capture_output=True, text=True, check=True).stdout
    submit = time.perf_counter() - t

    ids = json.loads(out)["ids"]
    return submit, drained(c, ids)


def separately(cli, env, c, n):
    t = time.perf_counter()
    out = subprocess.run(["bash", "-c", f'for i in $(seq {n}); do "{cli}" submit --parsable -G 1 -- true; done'],
                         env=env, capture_output=True, text=True, check=True).stdout
    submit = time.perf_counter() - t
    ids = [int(x) for x in out.split()]
    return submit, drained(c, ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cli = os.path.join(args.build, "cli", "corral")
    results = {"array": ([], []), "separate": ([], [])}
    loads = []
    with LocalCluster(args.build, agents=4, sim="a100x8.yaml") as c:
        env = c.env()
        for _ in range(args.runs):
            for name, how in (("array", as_array), ("separate", separately)):
                submit, drain = how(cli, env, c, args.jobs)
                results[name][0].append(submit)
                results[name][1].append(drain)
                loads.append(os.getloadavg()[0])
    print(f"{args.jobs} one-GPU jobs, 4 simulated 8-GPU agents, {args.runs} runs each, alternating; "
          f"load average during the runs {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'':10} {'submit s (median, min-max)':>30} {'submit to all ended s':>30}")
    for name in ("array", "separate"):
        sub, dr = results[name]
        print(f"{name:10} {statistics.median(sub):14.2f} ({min(sub):.2f}-{max(sub):.2f})"
              f"{statistics.median(dr):16.2f} ({min(dr):.2f}-{max(dr):.2f})")
    s_ratio = statistics.median(results["separate"][0]) / statistics.median(results["array"][0])
    d_ratio = statistics.median(results["separate"][1]) / statistics.median(results["array"][1])
    print(f"separate / array: submit {s_ratio:.1f}x, submit to all ended {d_ratio:.1f}x")


if __name__ == "__main__":
    main()
