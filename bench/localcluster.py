"""A corral cluster on this machine for the benchmarks: a coordinator and agents with
simulated inventories, state in a temporary folder removed at the end. All on 127.0.0.1,
or with netns=True each on its own host: a network namespace per process, veth pairs on a
bridge, addresses in 10.232.N.0/24 (root only; everything is removed at the end).

    with LocalCluster(build, agents=4, sim="a100x8.yaml") as c:
        c.submit(spec_text) -> job id
        c.get("/v1/jobs/7?wait=30") -> parsed JSON
"""

import http.client
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Lab:
    """Network namespaces h0..hN on one bridge; host i is 10.232.N.(10+i)."""

    def __init__(self, hosts):
        tag = os.getpid() % 100000
        self.veth = f"cbench{tag}v"
        self.bridge = f"cbench{tag}b"
        self.subnet = None
        for n in range(1, 250):
            if f"10.232.{n}." not in subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout:
                self.subnet = f"10.232.{n}."
                break
        self.hosts = []
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("addr", "add", self.subnet + "1/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for i in range(hosts):
            ns, veth = f"corral-bench-{tag}-h{i}", f"{self.veth}{i}"
            self._ip("netns", "add", ns)
            self.hosts.append((ns, self.subnet + str(10 + i)))
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", veth, "master", self.bridge)
            self._ip("link", "set", veth, "up")
            self._ip("-n", ns, "addr", "add", self.subnet + str(10 + i) + "/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def _ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def prefix(self, i):
        return ["ip", "netns", "exec", self.hosts[i][0]]

    def address(self, i):
        return self.hosts[i][1]

    def close(self):
        for ns, _ in self.hosts:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for i in range(len(self.hosts)):
            subprocess.run(["ip", "link", "del", f"{self.veth}{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


class LocalCluster:
    def __init__(self, build, agents=2, sim="a100x8.yaml", settings="", netns=False, state_size=None,
                 proc_env=None):
        # proc_env: environment added to a process, by name ("coordinator", or an agent's
        # node name such as "bench-a"): e.g. libfaketime for bench/clock_step.py.
        self.proc_env = proc_env or {}
        self.build = build
        self.dir = tempfile.mkdtemp(prefix="corral-bench-")
        self.procs = []
        self.local = threading.local()
        self.lab = None
        self.state_mount = None
        try:
            if state_size:
                # The coordinator's state folder on a file system of its own, which a
                # benchmark can fill (root only): see bench/full_disk.py.
                self.state_mount = os.path.join(self.dir, "state")
                os.makedirs(self.state_mount)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={state_size},mode=0700", "tmpfs",
                                self.state_mount], check=True, capture_output=True)
            if netns:
                self.lab = Lab(agents + 1)
            self._setup(build, agents, sim, settings)
        except BaseException:
            self.close()
            raise

    def _setup(self, build, agents, sim, settings):
        self.host = self.lab.address(0) if self.lab else "127.0.0.1"
        coord = os.path.join(build, "coordinator", "corral-coordinator")
        state = os.path.join(self.dir, "state")
        # The admin the token is for, who submits every job the benchmarks send.
        self.user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True,
                                                             text=True).stdout.strip()
        self.token = subprocess.run([coord, "init", "--state-dir", state, "--admin", self.user, "--san", self.host],
                                    check=True, capture_output=True, text=True).stdout.split("\n")[0]
        self.ca = os.path.join(state, "ca.pem")
        cfg = os.path.join(self.dir, "coordinator.yaml")
        # The coordinator's local socket too, for clients on this machine (env_local).
        self.socket = os.path.join(self.dir, "coordinator.sock")
        with open(cfg, "w") as f:
            f.write(f"listen: {self.host}:0\nstate_dir: {state}\nlocal_socket: {self.socket}\n"
                    f"heartbeat_interval: 1s\nnode_timeout: 5s\nreconnect_grace: 5s\nkill_grace: 2s\n{settings}")
        port_file = os.path.join(self.dir, "port")
        self.coord_cfg = cfg
        self.coord_argv = self._on(0) + [coord, "--config", cfg, "--port-file", port_file]
        self._start(self.coord_argv, "coordinator")
        deadline = time.time() + 20
        while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
            if time.time() > deadline:
                raise RuntimeError("the coordinator did not start; see " + self.dir)
            time.sleep(0.01)
        self.port = int(open(port_file).read())
        # Restarts listen where the first one did: the agents know that address.
        with open(cfg) as f:
            text = f.read()
        with open(cfg, "w") as f:
            f.write(text.replace(f"listen: {self.host}:0", f"listen: {self.host}:{self.port}"))
        self.url = f"https://{self.host}:{self.port}"
        self.ssl = ssl.create_default_context(cafile=self.ca)
        certs = os.path.join(self.dir, "certs")
        self.nodes = []
        for i in range(agents):
            name = f"bench-{chr(ord('a') + i)}"
            subprocess.run([coord, "issue-agent-cert", "--state-dir", state, "--node", name, "--out", certs],
                           check=True, capture_output=True)
            acfg = os.path.join(self.dir, name + ".yaml")
            with open(acfg, "w") as f:
                f.write(f"node: {name}\ncoordinator: {self.url}\nca: {certs}/ca.pem\ncert: {certs}/{name}.pem\n"
                        f"key: {certs}/{name}.key\nspool: {self.dir}/spool-{name}\nadvertise: {self.address(i)}\n"
                        f"ports: 29500-29999\nsimulate: {ROOT}/configs/sim/{sim}\nallow_root_jobs: true\n"
                        f"worker: {build}/worker/corral-worker\n")
            self._start(self._on(i + 1) + [os.path.join(build, "agent", "corral-agent"), "--config", acfg], name)
            self.nodes.append(name)
        deadline = time.time() + 20
        while sum(1 for n in self.get("/v1/nodes") if n["state"] == "up") < agents:
            if time.time() > deadline:
                raise RuntimeError("agents did not join; see " + self.dir)
            time.sleep(0.02)

    def kill_coordinator(self):
        """SIGKILL to the coordinator (the first process started)."""
        self.procs[0].kill()
        self.procs[0].wait()
        self.local.conn = None

    def start_coordinator(self):
        """Starts the coordinator again, on the same address and port, and waits until it answers."""
        log = open(os.path.join(self.dir, "coordinator.log"), "a")
        self.procs[0] = subprocess.Popen(self.coord_argv, stdout=log, stderr=log, env=self._env_of("coordinator"))
        deadline = time.time() + 20
        while True:
            try:
                self.local.conn = None
                self.get("/v1/whoami")
                return
            except (OSError, http.client.HTTPException, RuntimeError):
                if time.time() > deadline:
                    raise RuntimeError("the coordinator did not come back; see " + self.dir)
                time.sleep(0.02)

    def _on(self, host):
        """The prefix that runs a command on host `host` (0: the coordinator's)."""
        return self.lab.prefix(host) if self.lab else []

    def address(self, agent):
        """The advertised address of agent `agent` (0-based)."""
        return self.lab.address(agent + 1) if self.lab else "127.0.0.1"

    def on_agent(self, agent):
        return self._on(agent + 1)

    def _env_of(self, name):
        return {**os.environ, **self.proc_env[name]} if name in self.proc_env else None

    def _start(self, argv, name):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log, env=self._env_of(name)))

    def _conn(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=90)
            self.local.conn = conn
        return conn

    def call(self, method, path, body=None):
        headers = {"Authorization": "Bearer " + self.token}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        reused = getattr(self.local, "conn", None) is not None
        conn = self._conn()
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            text = r.read()
        except (http.client.HTTPException, OSError):
            conn.close()
            self.local.conn = None
            if not reused:
                raise
            # The coordinator closes connections left idle: ask once more on a new one.
            return self.call(method, path, body)
        return r.status, json.loads(text) if text else None

    def get(self, path):
        status, body = self.call("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body}")
        return body

    def submit(self, spec):
        status, body = self.call("POST", "/v1/jobs", {"spec": spec, "file": "bench.yaml"})
        if status != 201:
            raise RuntimeError(f"submit: {status} {body}")
        return body["id"]

    def drain(self, timeout=300):
        """Waits until no job is live (pending, starting, running or ending)."""
        deadline = time.time() + timeout
        while True:
            live = self.get("/v1/jobs")
            if not live:
                return
            if time.time() > deadline:
                raise RuntimeError(f"jobs did not drain in {timeout} s")
            self.get(f"/v1/jobs/{live[-1]['id']}?wait=30")

    def env(self):
        """The CLI's environment over TLS, as a person's by default: the connection keeper
        (cli/keeper.hpp) in a runtime folder of this cluster's, so that it ends with the
        cluster, and a config folder (where the TLS session is kept) of its own too."""
        e = dict(os.environ)
        run = os.path.join(self.dir, "xdg-run")
        os.makedirs(run, mode=0o700, exist_ok=True)
        e.update(CORRAL_URL=self.url, CORRAL_TOKEN=self.token, CORRAL_CA=self.ca,
                 XDG_CONFIG_HOME=os.path.join(self.dir, "cli-config"), XDG_RUNTIME_DIR=run)
        e.pop("CORRAL_KEEP_CONNECTION", None)
        return e

    def env_resumed(self):
        """TLS from each command itself (no keeper), resuming the kept session."""
        e = self.env()
        e["CORRAL_KEEP_CONNECTION"] = "0"
        return e

    def env_no_session(self):
        """TLS with no keeper and no config folder, hence no kept session: a full
        handshake each time."""
        e = self.env_resumed()
        e.pop("XDG_CONFIG_HOME", None)
        e.pop("HOME", None)
        return e

    def keeper_pids(self):
        """The connection keepers serving this cluster's commands."""
        pids = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if b"keep-connection" in args and any(self.dir.encode() in a for a in args):
                pids.append(int(pid))
        return pids

    def env_local(self):
        """The CLI's environment for the local socket: plain HTTP, no CA."""
        e = dict(os.environ)
        e.pop("CORRAL_CA", None)
        e.update(CORRAL_URL="unix:" + self.socket, CORRAL_TOKEN=self.token)
        return e

    def close(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.lab:
            self.lab.close()
        if self.state_mount:
            subprocess.run(["umount", "-l", self.state_mount], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def from_clients(submit_one, jobs, clients=8):
    """Calls submit_one() `jobs` times from `clients` threads at once; returns the seconds
    it took and what the calls returned."""
    left = [jobs]
    out = []
    lock = threading.Lock()

    def client():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            r = submit_one()
            with lock:
                out.append(r)

    t = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, out


def parse_time(text):
    """RFC 3339 with milliseconds, UTC ("2026-12-02T10:00:00.123Z") -> seconds since the epoch."""
    import datetime
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def percentile(values, p):
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]
