#!/usr/bin/env python3
"""bench/restart_storm: SIGKILL the coordinator again and again under submitting clients.

A coordinator and two simulated 8-GPU agents on this machine; `--clients` threads submit
jobs for `--seconds` (2 nodes x 1 GPU, retries 2), each rank appending "run ATTEMPT" to
its own file when it starts and "done ATTEMPT" after sleeping 1-2 s; meanwhile the
coordinator is SIGKILLed every 2-4 s and started again 0.5-2 s later. Then every
acknowledged job must end, and the table says what the scheduler promised and what
happened: acknowledged jobs lost, attempts that ran twice, jobs whose ranks all finished
(exited 0) but that did not end COMPLETED, requeues, and the load average.

    bench/restart_storm.py [--build build] [--clients 8] [--seconds 60] [--interval 0.5]
"""

import argparse
import http.client
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--interval", type=float, default=0.5, help="each client's pause between submissions (s)")
    a = p.parse_args()
    rng = random.Random(a.seed)
    out = tempfile.mkdtemp(prefix="corral-storm-")
    os.chmod(out, 0o777)
    load_before = os.getloadavg()
    acked, lock = [], threading.Lock()
    stop = threading.Event()
    kills = [0]
    spec = ("name: storm\nretries: 2\nresources: {nodes: 2, gpus_per_node: 1}\n"
            "command: \"echo run $CORRAL_ATTEMPT >> " + out + "/$CORRAL_JOB_ID.$RANK; sleep 1; "
            "echo done $CORRAL_ATTEMPT >> " + out + "/$CORRAL_JOB_ID.$RANK\"\n")
    with LocalCluster(os.path.abspath(a.build), agents=2) as c:
        def client():
            while not stop.is_set():
                try:
                    job = c.submit(spec)
                except Exception:  # the coordinator is down: try again
                    time.sleep(0.05)
                    continue
                with lock:
                    acked.append(job)
                time.sleep(a.interval)

        def killer():
            while not stop.wait(rng.uniform(2, 4)):
                c.kill_coordinator()
                kills[0] += 1
                time.sleep(rng.uniform(0.5, 2))
                c.start_coordinator()

        threads = [threading.Thread(target=client) for _ in range(a.clients)] + [threading.Thread(target=killer)]
        for t in threads:
            t.start()
        time.sleep(a.seconds)
        stop.set()
        for t in threads:
            t.join()
        ends = {}
        for job in acked:
            deadline = time.time() + 600
            while True:
                try:
                    j = c.get(f"/v1/jobs/{job}?wait=60")
                except RuntimeError as e:  # not 200: 404 for a job the coordinator does not know
                    ends[job] = {"state": "LOST", "error": str(e)}
                    break
                except (OSError, http.client.HTTPException):  # a connection from before a kill
                    continue
                if j["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") or time.time() > deadline:
                    ends[job] = j
                    break
    load_after = os.getloadavg()
    lost = twice = not_completed = requeued = completed = 0
    examples = []
    for job, j in ends.items():
        if j["state"] == "LOST":
            lost += 1
            continue
        completed += j["state"] == "COMPLETED"
        requeued += j.get("attempt", 0) > 0
        runs = {}
        for rank in (0, 1):
            try:
                lines = open(os.path.join(out, f"{job}.{rank}")).read().split("\n")
            except OSError:
                lines = []
            runs[rank] = lines
            starts = [ln for ln in lines if ln.startswith("run ")]
            if len(starts) != len(set(starts)):
                twice += 1
                examples.append(f"job {job} rank {rank}: {starts}")
        last = j.get("attempt", 0)
        all_done = all(f"done {last}" in runs[r] for r in (0, 1))
        if all_done and j["state"] != "COMPLETED":
            not_completed += 1
            examples.append(f"job {job}: ranks of attempt {last} both done, ended {j['state']} ({j.get('reason')})")
    print(f"{'acknowledged':>12} {'lost':>5} {'completed':>9} {'ran_twice':>9} {'done_not_completed':>18} "
          f"{'requeued':>8} {'coord_kills':>11} {'load':>12}")
    print(f"{len(acked):>12} {lost:>5} {completed:>9} {twice:>9} {not_completed:>18} {requeued:>8} {kills[0]:>11} "
          f"{load_before[0]:.2f}->{load_after[0]:.2f}")
    for e in examples[:10]:
        print("  " + e)
    shutil.rmtree(out, ignore_errors=True)
    return 1 if lost or twice or not_completed else 0


if __name__ == "__main__":
    sys.exit(main())
