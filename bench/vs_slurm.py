#!/usr/bin/env python3
"""bench/vs_slurm: corral and Slurm side by side, in one run, on this host.

Installs Debian's slurmctld, slurmd, slurm-client and munge when missing (root), starts a
private Slurm cluster (one munged, slurmctld, four slurmd: NodeName s1..s4, each its own
port and spool, NodeAddr 127.0.0.1, 8 gres GPUs whose File= entries are links to
/dev/null) and a corral cluster (coordinator, four simulated 8-GPU agents), then
measures both in turns, A B A B, so that both see the same noise:

  submit      one `corral submit -G 1 -- true` / `sbatch -G 1 --wrap true`: wall ms and
              the CPU ms of the process (user + system); corral over TLS resuming the
              session it kept (as a user's successive commands do), over TLS with no
              kept session (a full handshake), and through the coordinator's local
              socket (CORRAL_URL=unix:...), A B C D
  rate        8 clients submitting at once: jobs/s (the same three ways for corral)
  held        the rate again with every node drained on both sides, so that nothing runs
              while the clients submit: submission alone (in `rate` corral also runs the
              jobs it has just accepted while Slurm, slower to start them, runs few);
              the jobs are then cancelled and the nodes resumed
  drain       1,000 one-GPU jobs of `true` from 8 clients: first submit to queue empty
  2x2 start   submit of a 2-node x 2-GPU job to all 4 ranks started (each rank writes
              its start time; the job for Slurm is `corral export --slurm`'s script)
  memory      controller and node-daemon RSS, private and PSS idle, then after
              --memory-jobs jobs ran; beside them bench/tls_floor, one verified TLS
              connection through the system's OpenSSL in C: the least any node daemon
              that speaks TLS holds (slurmd speaks none)

Prints medians with min-max, the ratio corral/Slurm (for times and sizes below 1 means
corral is faster or smaller; for submits/s above 1 means corral is faster) and the load
average, then stops everything it started.

    python3 bench/vs_slurm.py [--build build] [--runs 3] [--memory-jobs 10000]
"""

import argparse
import os
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster, ROOT, from_clients  # noqa: E402

SLURM_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]


def ensure_slurm():
    missing = [p for p in SLURM_PACKAGES
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                 text=True).stdout.find("install ok installed") < 0]
    if missing:
        subprocess.run(["apt-get", "install", "-y", "-q"] + missing, check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), stdout=subprocess.DEVNULL)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pss_kb(pid):
    """Proportional set size: each shared page counted as a share among the processes that
    map it (four simulated agents share corral-agent's text, four slurmd slurmd's)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def private_kb(pid):
    """The pages only this process maps (USS): what it costs beyond the shared libraries
    that other processes on the node map too."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def memory(c, slurm, build):
    pids = {"corral": c.procs[0].pid, "slurm": slurm.pid("slurmctld"),
            "corral_agent": c.procs[1].pid, "slurm_node": slurm.pid("slurmd-s1")}
    mem = {k: (rss_kb(p), private_kb(p), pss_kb(p)) for k, p in pids.items()}
    mem["tls_floor"] = tls_floor(c, build)
    return mem


def tls_floor(c, build):
    """RSS, private and PSS of bench/tls_floor: a C program holding one verified TLS
    connection to the coordinator, made with the system's OpenSSL as the agent makes it
    (CA, client certificate, key) and nothing else. What any node daemon that speaks TLS
    through OpenSSL holds at least; slurmd speaks none (munge signs its messages)."""
    certs = os.path.join(c.dir, "certs")
    name = c.nodes[0]
    p = subprocess.Popen([os.path.join(build, "bench", "tls_floor"), c.host, str(c.port), c.ca,
                          f"{certs}/{name}.pem", f"{certs}/{name}.key"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        # A coordinator that never answers the handshake must not hang the benchmark.
        ready, _, _ = select.select([p.stdout], [], [], 30)
        line = p.stdout.readline() if ready else ""
        if not line.startswith("connected"):
            raise RuntimeError("tls_floor did not connect to the coordinator")
        return rss_kb(p.pid), private_kb(p.pid), pss_kb(p.pid)
    finally:
        p.stdin.close()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class PrivateSlurm:
    """munged, slurmctld and four slurmd on this host, in a temporary folder."""

    def __init__(self, nodes=4, gpus=8):
        self.dir = tempfile.mkdtemp(prefix="corral-vs-slurm-")
        os.chmod(self.dir, 0o700)
        d = self.dir
        base = 31000 + (os.getpid() % 400) * 8
        os.makedirs(f"{d}/ctld")
        os.makedirs(f"{d}/gpu")
        for i in range(gpus):
            os.symlink("/dev/null", f"{d}/gpu/nvidia{i}")
        with open(f"{d}/munge.key", "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(f"{d}/munge.key", 0o400)
        subprocess.run(["munged", "-f", f"--key-file={d}/munge.key", f"--socket={d}/munge.sock",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                       check=True)
        names = [f"s{i + 1}" for i in range(nodes)]
        conf = [
            "ClusterName=corralbench", "SlurmctldHost=localhost(127.0.0.1)", f"SlurmctldPort={base}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", f"AuthInfo=socket={d}/munge.sock",
            "CredType=cred/munge", f"StateSaveLocation={d}/ctld", f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "GresTypes=gpu", "MpiDefault=none", "ReturnToService=2",
            "SwitchType=switch/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            # Each node declares a core per GPU whatever this host has, so that CPUs do not
            # limit Slurm where corral has no such limit.
            "SlurmdParameters=config_overrides", "MaxJobCount=200000", "MinJobAge=2",
        ]
        for i, n in enumerate(names):
            conf.append(f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname=localhost Port={base + 1 + i} "
                        f"CPUs={gpus} RealMemory=1000 Gres=gpu:{gpus} State=UNKNOWN")
            os.makedirs(f"{d}/spool-{n}")
        conf.append(f"PartitionName=p Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP")
        with open(f"{d}/slurm.conf", "w") as f:
            f.write("\n".join(conf) + "\n")
        with open(f"{d}/gres.conf", "w") as f:
            f.write(f"NodeName={','.join(names)} Name=gpu File={d}/gpu/nvidia[0-{gpus - 1}]\n")
        self.env = dict(os.environ, SLURM_CONF=f"{d}/slurm.conf")
        subprocess.run(["slurmctld", "-c", "-f", f"{d}/slurm.conf"], check=True, env=self.env)
        for n in names:
            subprocess.run(["slurmd", "-f", f"{d}/slurm.conf", "-N", n], check=True, env=self.env)
        self.names = names
        deadline = time.time() + 30
        while self.sinfo_states() != {"idle"}:
            if time.time() > deadline:
                states = self.sinfo_states()
                self.close()  # nothing left running for the next try
                raise RuntimeError(f"Slurm did not come up: {states}")
            time.sleep(0.2)

    def sinfo_states(self):
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env).stdout
        return set(out.split())

    def pid(self, name):
        with open(f"{self.dir}/{name}.pid") as f:
            return int(f.read().strip())

    def queue_empty(self):
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=self.env).stdout
        return not out.strip()

    def hold(self, held):
        """Drain every node (nothing starts; submissions still queue), or cancel every job and
        resume them."""
        if not held:
            subprocess.run(["scancel", "-u", str(os.getuid())], check=True, env=self.env)
            wait_until(self.queue_empty)
        subprocess.run(["scontrol", "update", f"NodeName={','.join(self.names)}"] +
                       (["State=DRAIN", "Reason=vs_slurm"] if held else ["State=RESUME"]),
                       check=True, env=self.env)

    def close(self):
        for name in [f"slurmd-{n}" for n in self.names] + ["slurmctld", "munged"]:
            try:
                os.kill(self.pid(name), 15)
            except (OSError, ValueError):
                pass
        time.sleep(1)
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(argv, env):
    """Wall ms and CPU ms (user + system) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = (time.perf_counter() - t) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000
    return wall, cpu


TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def cpu_ms_of(pids):
    """CPU ms (user + system) the processes have used so far (ended ones count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * TICK_MS
        except OSError:
            pass
    return total


def run_from_clients(argv, env, jobs, clients=8):
    took, _ = from_clients(lambda: subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL), jobs, clients)
    return took


def wait_until(pred, timeout=600, step=0.05):
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            raise RuntimeError("timed out")
        time.sleep(step)


# Each way of corral's measured, and what its rows add to the metric's name.
SIDES = {
    "corral": "",  # as by default: through the connection keeper (TLS, kept alive)
    "corral-resumed": ", TLS resumed, no keeper",
    "corral-full": ", full TLS handshake",
    "corral-local": ", local socket",
    "slurm": "",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--submits", type=int, default=20, help="single submissions per run and side")
    ap.add_argument("--rate-jobs", type=int, default=200)
    ap.add_argument("--drain-jobs", type=int, default=1000)
    ap.add_argument("--memory-jobs", type=int, default=10000)
    ap.add_argument("--only", default="submit,rate,held,drain,start,memory",
                    help="comma-separated measures to take (default: all)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    ensure_slurm()
    cli = os.path.join(args.build, "cli", "corral")
    res = {}  # metric -> side -> values

    def add(metric, side, value):
        res.setdefault(metric, {side: [] for side in SIDES})[side].append(value)

    loads = []
    keeper_cpu = []  # ms of the keeper's CPU around each `corral submit` through it
    slurm = PrivateSlurm()
    try:
        with LocalCluster(args.build, agents=4, sim="a100x8.yaml") as c:
            cenv = c.env()
            renv = c.env_resumed()
            fenv = c.env_no_session()
            lenv = c.env_local()
            senv = slurm.env
            corral_submit = [cli, "submit", "--parsable", "-G", "1", "--", "true"]
            sbatch = ["sbatch", "--parsable", "-G", "1", "-o", "/dev/null", "--wrap", "true"]

            def corral_empty():
                return not c.get("/v1/jobs")

            def corral_hold(held):
                """As PrivateSlurm.hold, for corral's nodes."""
                if not held:
                    subprocess.run([cli, "cancel", "--user", c.user], env=cenv,
                                   check=True, stdout=subprocess.DEVNULL)
                    wait_until(corral_empty)
                for node in c.nodes:
                    subprocess.run([cli, "drain", node, "--reason", "vs_slurm"] if held else [cli, "resume", node],
                                   env=cenv, check=True, stdout=subprocess.DEVNULL)

            mem_idle = memory(c, slurm, args.build)
            work = tempfile.mkdtemp(prefix="corral-vs-slurm-out-")
            for run in range(args.runs):
                for _ in range(args.submits if "submit" in only else 0):
                    for side, argv, env in (("corral", corral_submit, cenv), ("corral-resumed", corral_submit, renv),
                                            ("corral-full", corral_submit, fenv), ("corral-local", corral_submit, lenv),
                                            ("slurm", sbatch, senv)):
                        # Through the keeper, its CPU for the command counts as the command's:
                        # sampled around each, nothing else using it meanwhile, and spread
                        # evenly at the end (the kernel counts it in 10 ms ticks).
                        keepers = c.keeper_pids() if side == "corral" else []
                        before = cpu_ms_of(keepers)
                        wall, cpu = timed(argv, env)
                        if side == "corral":
                            keeper_cpu.append(cpu_ms_of(keepers) - before)
                        add("submit wall ms", side, wall)
                        add("submit CPU ms", side, cpu)
                wait_until(corral_empty)
                wait_until(slurm.queue_empty)
                for side, argv, env, empty in (("corral", corral_submit, cenv, corral_empty),
                                               ("corral-resumed", corral_submit, renv, corral_empty),
                                               ("corral-full", corral_submit, fenv, corral_empty),
                                               ("corral-local", corral_submit, lenv, corral_empty),
                                               ("slurm", sbatch, senv, slurm.queue_empty)) if "rate" in only else ():
                    took = run_from_clients(argv, env, args.rate_jobs)
                    add("8-client submits/s", side, args.rate_jobs / took)
                    wait_until(empty)
                for side, argv, env, hold in (("corral", corral_submit, cenv, corral_hold),
                                              ("slurm", sbatch, senv, slurm.hold)) if "held" in only else ():
                    hold(True)
                    took = run_from_clients(argv, env, args.rate_jobs)
                    add("8-client submits/s, nodes drained", side, args.rate_jobs / took)
                    hold(False)
                for side, argv, env, empty in (("corral", corral_submit, cenv, corral_empty),
                                               ("slurm", sbatch, senv, slurm.queue_empty)) if "drain" in only else ():
                    t = time.perf_counter()
                    run_from_clients(argv, env, args.drain_jobs)
                    wait_until(empty)
                    add(f"{args.drain_jobs}-job drain s", side, time.perf_counter() - t)
                # 2 x 2: every rank writes when it started.
                for side in ("corral", "slurm") if "start" in only else ():
                    out = os.path.join(work, f"{side}-{run}")
                    os.makedirs(out)
                    command = ["sh", "-c", f'date +%s.%N > {out}/rank-$RANK']
                    spec = ["-N", "2", "--gpus-per-node", "2", "--"] + command
                    t0 = time.time()
                    if side == "corral":
                        subprocess.run([cli, "submit", "--parsable"] + spec, env=cenv, check=True,
                                       stdout=subprocess.DEVNULL)
                    else:
                        script = subprocess.run([cli, "export", "--slurm", "-J", "two"] + spec, check=True,
                                                capture_output=True, text=True).stdout
                        subprocess.run(["sbatch", "--parsable", "-o", "/dev/null"], input=script, text=True,
                                       env=senv, check=True, stdout=subprocess.DEVNULL)
                    files = [os.path.join(out, f"rank-{r}") for r in range(4)]
                    wait_until(lambda: all(os.path.exists(f) and os.path.getsize(f) > 0 for f in files), 60, 0.01)
                    last = max(float(open(f).read()) for f in files)
                    add("2x2 submit to all ranks started ms", side, (last - t0) * 1000)
                wait_until(corral_empty)
                wait_until(slurm.queue_empty)
                loads.append(os.getloadavg()[0])
            # Memory after many jobs have run through each.
            mem_after = None
            if "memory" in only:
                run_from_clients(corral_submit, cenv, args.memory_jobs)
                run_from_clients(sbatch, senv, args.memory_jobs)
                wait_until(corral_empty, 1800, 0.5)
                wait_until(slurm.queue_empty, 1800, 0.5)
                mem_after = memory(c, slurm, args.build)
            loads.append(os.getloadavg()[0])
            shutil.rmtree(work, ignore_errors=True)
    finally:
        slurm.close()

    if keeper_cpu:
        share = sum(keeper_cpu) / len(keeper_cpu)
        res["submit CPU ms"]["corral"] = [x + share for x in res["submit CPU ms"]["corral"]]
        print(f"the connection keeper's CPU, {share:.2f} ms per submit ({sum(keeper_cpu):.0f} ms over "
              f"{len(keeper_cpu)}), is in the corral row of submit CPU ms")
    print(f"corral vs Slurm 22.05 on this host, {args.runs} runs, alternating; "
          f"load average {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'metric':52} {'corral median (min-max)':>26} {'Slurm median (min-max)':>26} {'corral/Slurm':>13}")
    for metric, sides in res.items():
        b = sides["slurm"]
        mb = statistics.median(b)
        for side, label in SIDES.items():
            if side == "slurm":
                continue
            label = metric + label
            a = sides[side]
            if not a:
                continue
            ma = statistics.median(a)
            print(f"{label:52} {ma:10.1f} ({min(a):.1f}-{max(a):.1f}){'':4} {mb:10.1f} ({min(b):.1f}-{max(b):.1f}){'':4} "
                  f"{ma / mb:8.2f}")
    rows = [("idle", mem_idle)] + ([(f"after {args.memory_jobs} jobs", mem_after)] if mem_after else [])
    for when, mem in rows:
        for daemon, a, b in (("controller", "corral", "slurm"), ("node daemon", "corral_agent", "slurm_node"),
                             ("OpenSSL TLS floor", "tls_floor", "slurm_node")):
            for i, kind in enumerate(("RSS", "private", "PSS")):
                label = f"{daemon} {kind} {when} MB"
                x, y = mem[a][i], mem[b][i]
                print(f"{label:52} {x / 1024:10.1f}{'':16} {y / 1024:10.1f}{'':16} {x / y:8.2f}")


if __name__ == "__main__":
    main()
