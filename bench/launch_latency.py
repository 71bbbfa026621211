#!/usr/bin/env python3
"""bench/launch_latency: how long a 2-node × 2-rank job takes to start.

For corral: from `corral submit` returning to every rank having started (rank command:
bench/stamp, which writes the time it got to run), and, for a PyTorch job, to every rank
past init_process_group(backend='gloo', init_method='env://') (bench/ddp_stamp.py).
Beside it, in the same run and in turns (one run of each, then again): torchrun (static and c10d rendezvous; two torchrun
processes, one per node, --nproc_per_node 2) and the four processes started bare with
the env:// variables, each from launch to the last rank past init_process_group.
The cluster is a coordinator and two agents on this machine: on 127.0.0.1, or with
--netns (root) each on its own host, a network namespace with its own address, so the
two nodes talk over a bridge as two machines would; the bare and torchrun rows then run
each node's processes in its namespace too, with GLOO_SOCKET_IFNAME set by hand (their
hostnames resolve to 127.0.0.1).

    bench/launch_latency.py [--build build] [--runs 20] [--no-torch] [--netns]

The PyTorch rows need Debian's python3-torch (/usr/bin/python3).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster, percentile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"


def stamps(folder, n):
    out = []
    for r in range(n):
        with open(os.path.join(folder, f"{r}.t")) as f:
            out.append(int(f.read()) / 1e9)
    return out


def corral_run(c, cli, command, scratch):
    spec = os.path.join(scratch, "job.yaml")
    with open(spec, "w") as f:
        f.write("name: latency\ncommand: [" + ", ".join(f'"{a}"' for a in command) + "]\n"
                "resources: {nodes: 2, gpus_per_node: 2}\ntime_limit: 5m\n")
    t_cmd = time.time()
    out = subprocess.run([cli, "submit", "--json", spec], env=c.env(), check=True, capture_output=True, text=True)
    t0 = time.time()
    job = int(out.stdout.split(":")[1].strip(" }\n"))
    end = c.get(f"/v1/jobs/{job}?wait=60")
    if end["state"] != "COMPLETED":
        raise RuntimeError(f"job {job} ended {end['state']}: {end.get('reason')}")
    return max(stamps(scratch, 4)) - t0, t0 - t_cmd


class Hosts:
    """Where the bare and torchrun rows start each node's processes."""

    def __init__(self, cluster):
        self.c = cluster

    def prefix(self, node):
        return self.c.on_agent(node)

    def master(self):
        return self.c.address(0)

    def env(self):
        e = dict(os.environ, OMP_NUM_THREADS="1")
        if self.c.lab:
            e["GLOO_SOCKET_IFNAME"] = "eth0"
        return e


def torch_env(hosts, rank, local_rank, port):
    e = hosts.env()
    e.update(MASTER_ADDR=hosts.master(), MASTER_PORT=str(port), WORLD_SIZE="4", RANK=str(rank),
             LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE="2")
    return e


def bare_run(hosts, scratch, port):
    script = os.path.join(HERE, "ddp_stamp.py")
    t0 = time.time()
    procs = [subprocess.Popen(hosts.prefix(r // 2) + [PY, script, scratch], env=torch_env(hosts, r, r % 2, port))
             for r in range(4)]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("a bare rank failed")
    return max(stamps(scratch, 4)) - t0


def torchrun_run(hosts, scratch, port, mode):
    script = os.path.join(HERE, "ddp_stamp.py")
    # Debian 12's torchrun 1.13 needs the redirects spelled out to start on Python 3.11.
    common = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2",
              "--redirects", "9:0", "--tee", "9:0"]
    if mode == "static":
        rdzv = ["--master_addr", hosts.master(), "--master_port", str(port)]
    else:
        rdzv = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{hosts.master()}:{port}", "--rdzv_id", f"bench{port}"]
    env = hosts.env()
    t0 = time.time()
    procs = []
    for node in range(2):
        node_args = ["--node_rank", str(node)] if mode == "static" else []
        procs.append(subprocess.Popen(hosts.prefix(node) + common + rdzv + node_args + [script, scratch], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"torchrun ({mode}) failed")
    return max(stamps(scratch, 4)) - t0


def has_torch():
    return subprocess.run([PY, "-c", "import torch.distributed"], capture_output=True).returncode == 0


def row(name, values, note=""):
    ms = [v * 1000 for v in values]
    print(f"| {name} | {len(ms)} | {percentile(ms, 0.5):.1f} ms | {percentile(ms, 0.9):.1f} ms | {note} |")


def main():
    # A SIGTERM (e.g. from `timeout`) unwinds like an error, so the cluster and its
    # namespaces are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--netns", action="store_true", help="each node in its own network namespace (root)")
    a = ap.parse_args()
    cli = os.path.join(a.build, "cli", "corral")
    stamp = os.path.join(a.build, "bench", "stamp")
    torch = not a.no_torch and has_torch()
    results = {}
    load_before = os.getloadavg()
    with LocalCluster(a.build, agents=2, sim="a100x8.yaml", netns=a.netns) as c:
        def corral_variant(name, command):
            def run(scratch, _port):
                latency, submit = corral_run(c, cli, command + [scratch], scratch)
                results.setdefault(name + " (the `corral submit` command itself)", []).append(submit)
                return latency
            return name, run

        variants = [corral_variant("corral: every rank started", [stamp])]
        if torch:
            hosts = Hosts(c)
            variants.append(corral_variant("corral: PyTorch, every rank past init_process_group",
                                           [PY, os.path.join(HERE, "ddp_stamp.py")]))
            variants.append(("bare: 4 processes with the env:// variables", lambda s, p: bare_run(hosts, s, p)))
            variants.append(("torchrun, static rendezvous", lambda s, p: torchrun_run(hosts, s, p, "static")))
            # torchrun 1.13's c10d rendezvous picks the torchrun that hosts its store by
            # the endpoint matching its hostname, which resolves to 127.0.0.1 in these
            # namespaces: neither does, and it hangs. So it runs on 127.0.0.1 only.
            if not c.lab:
                variants.append(("torchrun, c10d rendezvous", lambda s, p: torchrun_run(hosts, s, p, "c10d")))
        # In turns (A B C A B C ...), so every variant sees the same noise.
        for i in range(a.runs):
            for name, fn in variants:
                scratch = tempfile.mkdtemp(prefix="corral-latency-")
                try:
                    results.setdefault(name, []).append(fn(scratch, 29900 + i))
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()
    where = "2 hosts (network namespaces)" if a.netns else "2 nodes on 127.0.0.1"
    bare = results.get("bare: 4 processes with the env:// variables")
    print(f"| launch, 2 × 2 ranks, {where} | runs | median | p90 | / bare |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, values in results.items():
        ratio = ""
        if bare and "command itself" not in name and ("PyTorch" in name or name.startswith(("bare", "torchrun"))):
            ratio = f"{percentile(values, 0.5) / percentile(bare, 0.5):.2f}"
        row(name, values, ratio)
    print(f"\nruns taken in turns; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    if a.no_torch:
        print("\n(PyTorch rows skipped: --no-torch)")
    elif not torch:
        print("\n(PyTorch rows skipped: /usr/bin/python3 has no torch; apt-get install python3-torch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
