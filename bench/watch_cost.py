#!/usr/bin/env python3
"""bench/watch_cost: what watching its ranks costs the agent, per rank per second.

One simulated 8-GPU agent on this machine runs an 8-rank job whose ranks sleep in Python
(`time.sleep`); the agent's own CPU time (the run time of all its threads, from
/proc/PID/task/*/schedstat) is read over a window. Four kinds alternate, `--runs` of each:

  idle:     no job: the agent's baseline (heartbeats);
  waiting:  the 8 ranks never check in, in their first 30 s: the agent looks at their
            sockets every 200 ms (the rendezvous watch), samples their CPU every second
            (launch.hang_timeout) and compares the GPUs' processes with theirs every 5 s;
  late:     the same after 30 s, when the sockets are looked at once a second;
  joined:   the 8 ranks checked in (rank 0 listens on MASTER_PORT, the others are
            connected): only the progress samples and the GPU check are left;
  torchrun: the peer, Debian's torchrun --standalone --nproc_per_node 8 running the same
            sleeping script; its agent process's CPU time (it polls its workers every
            --monitor_interval, 5 s by default in 1.13).

Per kind: median agent CPU in ms per second of wall time, and per rank per second (the
idle baseline taken off corral's), with the load average.

    bench/watch_cost.py [--build build] [--runs 3] [--window 15]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster  # noqa: E402

RANKS = 8
PYTHON = "/usr/bin/python3"

# A rank that checks in when asked (rank 0 listens on MASTER_PORT, the others connect),
# then sleeps; or only sleeps.
SCRIPT = r"""
import os, socket, sys, time
if sys.argv[1] == "join":
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if os.environ["RANK"] == "0":
        s = socket.create_server((addr, port), backlog=64)
        peers = [s.accept()[0] for _ in range(int(os.environ["WORLD_SIZE"]) - 1)]
    else:
        for _ in range(500):
            try:
                c = socket.create_connection((addr, port))
                break
            except OSError:
                time.sleep(0.01)
time.sleep(600)
"""


def cpu_ms(pid):
    """CPU time of every thread of `pid`, in ms, to the nanosecond (schedstat's run time;
    utime and stime count 10 ms ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended: its time is lost, as it would be from utime
    return total / 1e6


def window_cpu(pid, seconds):
    """CPU ms per wall second of `pid` over the next `seconds`."""
    begin, t0 = cpu_ms(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_ms(pid) - begin) / (time.monotonic() - t0)


def wait_state(c, job, state, timeout=30):
    deadline = time.time() + timeout
    while c.get(f"/v1/jobs/{job}")["state"] != state:
        if time.time() > deadline:
            raise RuntimeError(f"job {job} did not reach {state}")
        time.sleep(0.05)


def corral_kind(c, agent_pid, script, kind, window):
    if kind == "idle":
        return window_cpu(agent_pid, window)
    begun = time.monotonic()
    job = c.submit(f"name: watch\ncommand: [{PYTHON}, {script}, {'join' if kind == 'joined' else 'sleep'}]\n"
                   "resources: {nodes: 1, gpus_per_node: 8}\n"
                   "launch: {rendezvous_timeout: 0, hang_timeout: 10m}\ntime_limit: 10m\n")
    wait_state(c, job, "RUNNING")
    if kind == "joined":
        deadline = time.time() + 30
        while c.get(f"/v1/jobs/{job}")["rendezvous"]["joined"] != RANKS:
            if time.time() > deadline:
                raise RuntimeError("the ranks did not check in")
            time.sleep(0.05)
    time.sleep(1)  # the start's work done
    if kind == "late":
        time.sleep(max(0.0, begun + 32 - time.monotonic()))
    try:
        return window_cpu(agent_pid, window)
    finally:
        c.call("POST", f"/v1/jobs/{job}/cancel")
        c.get(f"/v1/jobs/{job}?wait=30")


def torchrun_kind(script, window):
    # Debian 12's torchrun 1.13 needs the redirects spelled out to start on Python 3.11.
    p = subprocess.Popen([PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
                          "--redirects", "9:0", "--tee", "9:0", script, "sleep"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # Its workers started: RANKS children of the agent process.
        deadline = time.time() + 60
        while True:
            kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            if len(kids) >= RANKS:
                break
            if time.time() > deadline or p.poll() is not None:
                raise RuntimeError("torchrun did not start its workers")
            time.sleep(0.05)
        time.sleep(1)
        return window_cpu(p.pid, window)
    finally:
        os.killpg(p.pid, 15)
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=float, default=15)
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="corral-watch-")
    script = os.path.join(scratch, "rank.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    kinds = ["idle", "waiting", "late", "joined", "torchrun"]
    got = {k: [] for k in kinds}
    with LocalCluster(args.build, agents=1, sim="a100x8.yaml") as c:
        agent_pid = c.procs[1].pid
        for run in range(args.runs):
            for kind in kinds:
                if kind == "torchrun":
                    got[kind].append(torchrun_kind(script, args.window))
                else:
                    got[kind].append(corral_kind(c, agent_pid, script, kind, args.window))
                print(f"run {run + 1} {kind}: {got[kind][-1]:.3f} ms/s", file=sys.stderr)
    load = os.getloadavg()
    idle = statistics.median(got["idle"])
    print(f"{RANKS} ranks, {args.runs} runs of {args.window:.0f} s each, alternating; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print()
    print("| kind | agent CPU, ms per s (median) | per rank per s, less idle | vs torchrun |")
    print("| --- | ---: | ---: | ---: |")
    peer = statistics.median(got["torchrun"]) / RANKS
    for kind in kinds:
        m = statistics.median(got[kind])
        per_rank = (m - (idle if kind != "torchrun" else 0)) / RANKS
        ratio = "" if kind == "idle" else f"{per_rank / peer:.2f}" if peer > 0 else "-"
        print(f"| {kind} | {m:.3f} | {per_rank:.4f} ms | {ratio} |" if kind != "idle"
              else f"| {kind} | {m:.3f} | - | - |")
    print()
    print("samples (ms/s): " + "; ".join(f"{k} " + ", ".join(f"{v:.3f}" for v in got[k]) for k in kinds))


if __name__ == "__main__":
    main()
