#!/usr/bin/env python3
"""bench/scale: the coordinator with many nodes. Starts a coordinator and
bench/agent_swarm (N simulated 8-GPU nodes in one process, each a real agent connection:
its own certificate, TLS, the WebSocket, heartbeats every second), then measures:

  join          all N nodes welcomed, from the swarm's start (32 handshakes at a time)
  idle CPU      the coordinator's CPU over --idle-seconds with every node heartbeating,
                in % of one core (the swarm's own CPU beside it)
  nodes         `corral nodes` wall ms (the CLI process, table of N rows), and
                GET /v1/nodes alone on a kept-alive connection: to its last byte, and
                to its JSON parsed
  --only        any of idle,nodes,start,pass,gang (the join is always measured)
  start         submit of a 1-GPU job of `true` to its Launch reaching a node: by HTTP
                on a kept-alive connection, and by `corral submit` (the process's start
                included)
  pass          with every GPU held by one job and --pending 1-GPU jobs pending: the
                scheduling pass's time (corral_scheduler_last_pass_seconds in /metrics)
                over --pass-seconds
  gang          one job of --gang nodes (1,024 at most) x 8 GPUs, every rank a report of
                its own: submit to RUNNING (every rank started and recorded), the
                coordinator's CPU meanwhile and its transactions; then its cancel to the end

Prints a table of medians with min-max and the load average, then stops what it started.

    python3 bench/scale.py [--build build] [--nodes 2000] [--pending 10000]
                           [--settings 'YAML lines for the coordinator's config']
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class SwarmOutput:
    """Reads the swarm's stdout: the join line and each job's first Launch."""

    def __init__(self, proc):
        self.joined = None
        self.launches = {}
        self.cv = threading.Condition()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc):
        for line in proc.stdout:
            words = line.split()
            with self.cv:
                if words[:1] == ["joined"]:
                    self.joined = float(words[2])
                elif words[:1] == ["launch"]:
                    self.launches[int(words[1])] = int(words[3]) / 1e9
                self.cv.notify_all()

    def wait(self, predicate, timeout):
        with self.cv:
            if not self.cv.wait_for(predicate, timeout):
                raise RuntimeError("timed out waiting for the swarm")

    def launch_of(self, job, timeout=30):
        self.wait(lambda: job in self.launches, timeout)
        return self.launches[job]


def metric(c, name):
    conn = c._conn()
    conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + c.token})
    text = conn.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"{name} not in /metrics")


def summary(values):
    return f"{statistics.median(values):9.1f} ({min(values):.1f}-{max(values):.1f})"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--idle-seconds", type=float, default=30)
    p.add_argument("--runs", type=int, default=20, help="samples of `corral nodes` and of each start")
    p.add_argument("--pending", type=int, default=10000)
    p.add_argument("--pass-seconds", type=float, default=10)
    p.add_argument("--start-spread-ms", type=int, default=0,
                   help="each node reports its ranks started up to this long after its Launch")
    p.add_argument("--only", default="", help="comma-separated: idle,nodes,start,pass,gang (default all)")
    p.add_argument("--gang", type=int, default=0, help="nodes of the gang job (0: as many as --nodes, at most 1,024)")
    p.add_argument("--settings", default="", help="more lines for the coordinator's config (YAML)")
    args = p.parse_args()
    want = set(args.only.split(",")) if args.only else {"idle", "nodes", "start", "pass", "gang"}
    build = os.path.abspath(args.build)
    cli = os.path.join(build, "cli", "corral")
    rows = []
    loads = []
    settings = args.settings + "\n" if args.settings else ""
    with LocalCluster(build, agents=0, settings=settings) as c:
        coord = c.procs[0].pid
        env = c.env()
        errors = open(os.path.join(c.dir, "swarm.log"), "w")
        swarm = subprocess.Popen([os.path.join(build, "bench", "agent_swarm"), "--url", c.url, "--state-dir",
                                  os.path.join(c.dir, "state"), "--certs", os.path.join(c.dir, "swarm-certs"),
                                  "--nodes", str(args.nodes), "--start-spread-ms", str(args.start_spread_ms)],
                                 stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            out = SwarmOutput(swarm)
            out.wait(lambda: out.joined is not None, 900)
            rows.append(("join s (all nodes welcomed)", f"{out.joined:9.1f}", ""))
            deadline = time.time() + 60
            while len(c.get("/v1/nodes")) < args.nodes:
                if time.time() > deadline:
                    raise RuntimeError("the coordinator does not list every node")
                time.sleep(0.2)

            if "idle" in want:
                time.sleep(3)  # the joins' own work is done
                c0, s0, t0 = cpu_seconds(coord), cpu_seconds(swarm.pid), time.time()
                time.sleep(args.idle_seconds)
                took = time.time() - t0
                loads.append(os.getloadavg()[0])
                rows.append(("coordinator idle CPU % of a core", f"{100 * (cpu_seconds(coord) - c0) / took:9.1f}",
                             f"swarm's own: {100 * (cpu_seconds(swarm.pid) - s0) / took:.1f} %"))
                rows.append(("coordinator RSS MB", f"{rss_mb(coord):9.1f}", ""))

            if "nodes" in want:
                nodes_cli, nodes_gpus, nodes_http, nodes_raw = [], [], [], []
                c.get("/v1/nodes")  # a kept-alive connection (the server closed the idle one)
                conn = c._conn()
                for _ in range(args.runs):
                    t = time.perf_counter()
                    subprocess.run([cli, "nodes"], env=env, check=True, stdout=subprocess.DEVNULL)
                    nodes_cli.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    subprocess.run([cli, "nodes", "--gpus"], env=env, check=True, stdout=subprocess.DEVNULL)
                    nodes_gpus.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    conn.request("GET", "/v1/nodes", headers={"Authorization": "Bearer " + c.token})
                    raw = conn.getresponse().read()
                    nodes_raw.append((time.perf_counter() - t) * 1000)
                    listed = json.loads(raw)
                    nodes_http.append((time.perf_counter() - t) * 1000)
                assert len(listed) == args.nodes
                rows.append(("`corral nodes` ms", summary(nodes_cli), f"{args.nodes} lines"))
                rows.append(("`corral nodes --gpus` ms", summary(nodes_gpus),
                             f"{args.nodes} nodes and their GPUs' lines"))
                rows.append(("GET /v1/nodes ms, bytes received", summary(nodes_raw), f"{len(raw) / 1e6:.1f} MB"))
                rows.append(("GET /v1/nodes ms, parsed (Python)", summary(nodes_http), ""))

            if "start" in want:
                spec = "name: one\ncommand: [\"true\"]\nresources: {gpus: 1}\n"
                by_http, by_cli = [], []
                for _ in range(args.runs):
                    t = time.time()
                    job = c.submit(spec)
                    by_http.append((out.launch_of(job) - t) * 1000)
                    t = time.time()
                    job = int(subprocess.run([cli, "submit", "--parsable", "-G", "1", "--", "true"], env=env, check=True,
                                             capture_output=True, text=True).stdout.split(";")[0])
                    by_cli.append((out.launch_of(job) - t) * 1000)
                loads.append(os.getloadavg()[0])
                rows.append(("submit to start ms (HTTP)", summary(by_http), "1-GPU job"))
                rows.append(("submit to start ms (corral submit)", summary(by_cli), ""))

            if "pass" in want:
                # Every GPU held, by one 8-GPU job per node (an array), then --pending jobs wait.
                blocker = c.submit(f"name: hold\ncommand: \"sleep 3600\"\nresources: {{gpus: 8}}\n"
                                   f"array: \"0-{args.nodes - 1}\"\n")
                out.wait(lambda: sum(1 for j in out.launches if blocker <= j < blocker + args.nodes) == args.nodes,
                         300)
                array = c.submit(f"name: wait\ncommand: [\"true\"]\nresources: {{gpus: 1}}\n"
                                 f"array: \"0-{args.pending - 1}\"\n")
                passes = []
                end = time.time() + args.pass_seconds
                last = None
                while time.time() < end:
                    v = metric(c, "corral_scheduler_last_pass_seconds") * 1000
                    if v != last:
                        passes.append(v)
                        last = v
                    time.sleep(0.05)
                loads.append(os.getloadavg()[0])
                rows.append((f"scheduling pass ms, {args.pending} pending", summary(passes),
                             f"{len(passes)} passes seen"))
                rows.append(("coordinator RSS MB with them", f"{rss_mb(coord):9.1f}", ""))
                c.call("POST", f"/v1/jobs/{array}/cancel")
                c.call("POST", f"/v1/jobs/{blocker}/cancel")
                c.drain()

            if "gang" in want:
                gang = args.gang or min(args.nodes, 1024)  # a job spans at most 1,024 nodes
                counters = ("corral_store_batches_total", "corral_store_changes_total",
                            "corral_store_changes_folded_total")
                m0 = [metric(c, name) for name in counters]
                c0, t = cpu_seconds(coord), time.time()
                job = c.submit(f"name: gang\ncommand: \"sleep 3600\"\n"
                               f"resources: {{nodes: {gang}, gpus_per_node: 8}}\n")
                while c.get(f"/v1/jobs/{job}")["state"] != "RUNNING":
                    if time.time() - t > 900:
                        raise RuntimeError("the gang did not start in 900 s")
                    time.sleep(0.05)
                started, c1 = time.time() - t, cpu_seconds(coord)
                batches, changes, folded = (metric(c, name) - m for name, m in zip(counters, m0))
                t = time.time()
                c.call("POST", f"/v1/jobs/{job}/cancel")
                while c.get(f"/v1/jobs/{job}?wait=60")["state"] not in ("CANCELLED", "FAILED", "COMPLETED"):
                    if time.time() - t > 900:
                        raise RuntimeError("the gang did not end in 900 s")
                loads.append(os.getloadavg()[0])
                spread = f", starts spread over {args.start_spread_ms} ms" if args.start_spread_ms else ""
                rows.append((f"gang of {gang} x 8 GPUs{spread}: submit to RUNNING s", f"{started:9.2f}",
                             f"coordinator CPU {c1 - c0:.2f} s; {gang * 8} rank reports: {changes:.0f} "
                             f"writes in {batches:.0f} transactions, {folded:.0f} folded"))
                rows.append(("gang: cancel to its end s", f"{time.time() - t:9.2f}",
                             f"coordinator RSS {rss_mb(coord):.1f} MB after"))
        finally:
            swarm.terminate()
            swarm.wait(timeout=30)
    loads.append(os.getloadavg()[0])
    print(f"coordinator with {args.nodes} simulated 8-GPU nodes (bench/agent_swarm, one process); "
          f"load average {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'metric':42} {'median (min-max)':>22}")
    for label, value, note in rows:
        print(f"{label:42} {value:>22}  {note}")


if __name__ == "__main__":
    main()
