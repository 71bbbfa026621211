#!/usr/bin/env python3
"""`corral history` and `corral usage` over a database of many ended jobs.

Starts a local cluster (two simulated 8-GPU agents), stops its coordinator, writes N
ended jobs straight into its SQLite file (spread over the last 30 days, 8 users, 1 to 16
GPUs on the two nodes), starts the coordinator again, then times the real CLI, each
command `--runs` times, and prints medians with min-max, the answer's size and the load
average:

    python3 bench/history.py [--build build] [--jobs 100000] [--runs 5]
"""

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import ROOT, LocalCluster  # noqa: E402


def fill(db_path, jobs, now_ms):
    rng = random.Random(7)
    db = sqlite3.connect(db_path)
    first = (db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0]) + 1
    rows = []
    for i in range(jobs):
        job_id = first + i
        ended = now_ms - rng.randrange(30 * 86400 * 1000)
        started = ended - rng.randrange(1000, 6 * 3600 * 1000)
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        nodes = [{"node": "bench-a", "gpus": list(range(min(gpus, 8)))}]
        if gpus > 8:
            nodes.append({"node": "bench-b", "gpus": list(range(8))})
        state = rng.choice(["COMPLETED"] * 6 + ["FAILED", "CANCELLED", "TIMEOUT"])
        alloc = json.dumps({"nodes": nodes, "master_addr": "127.0.0.1", "master_port": 29500})
        rows.append((job_id, f"user{rng.randrange(8)}", f"job-{job_id}", "name: x\n", state,
                     "AllRanksExitedOk" if state == "COMPLETED" else "RankFailed", 0, started - 5000, started,
                     ended, alloc, "", None if state == "COMPLETED" else 0, "", 0 if state == "COMPLETED" else 1,
                     "[]", "", "[]", ""))
    db.executemany("INSERT INTO jobs (id, user, name, spec_yaml, state, reason, attempt, submitted_at, started_at, "
                   "ended_at, allocation, nccl_id, failed_rank, failed_node, exit_code, ranks, outcome, fences, "
                   "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--jobs", type=int, default=100000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cli = os.path.join(args.build, "cli", "corral")
    with LocalCluster(args.build, agents=2, sim="a100x8.yaml") as c:
        c.kill_coordinator()
        t0 = time.time()
        fill(os.path.join(c.dir, "state", "corral.db"), args.jobs, int(time.time() * 1000))
        filled = time.time() - t0
        c.start_coordinator()
        env = c.env()
        commands = [
            ("history --since 30d (every job)", ["history", "--since", "30d"]),
            ("history --since 1d", ["history", "--since", "1d"]),
            ("history --since 30d --user user3 --state F", ["history", "--since", "30d", "--user", "user3",
                                                              "--state", "F"]),
            ("usage --since 30d --by user", ["usage", "--since", "30d"]),
            ("usage --since 30d --by class", ["usage", "--since", "30d", "--by", "class"]),
        ]
        results = []
        for name, argv in commands:
            times = []
            size = 0
            for _ in range(args.runs):
                t = time.perf_counter()
                out = subprocess.run([cli] + argv, env=env, capture_output=True, check=True).stdout
                times.append((time.perf_counter() - t) * 1000)
                size = len(out)
            results.append((name, statistics.median(times), min(times), max(times), size))
        load = os.getloadavg()
    print(f"{args.jobs} ended jobs written in {filled:.1f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'command':48} {'median ms':>10} {'min-max ms':>16} {'output bytes':>13}")
    for name, med, lo, hi, size in results:
        print(f"{name:48} {med:10.0f} {lo:7.0f}-{hi:<8.0f} {size:13}")


if __name__ == "__main__":
    main()
