#!/usr/bin/env python3
"""bench/status_page: what the status page costs with a long queue, beside Slurm's squeue.

Starts a corral cluster (coordinator, two simulated 8-GPU agents) and a private Slurm
(bench/vs_slurm.py's: four slurmd), fills each queue with --jobs pending one-GPU jobs
(corral: behind one job that holds every GPU; Slurm: `sbatch --hold`), then measures in
turns, A B A B:

  status data   GET /v1/status (what the page loads: strip, grid, first 100 queue rows)
  status 1000   GET /v1/status?limit=1000
  corral queue  the CLI's whole queue (`corral queue`), wall ms and output bytes
  squeue        Slurm's whole queue (`squeue`), wall ms and output bytes

and, in Debian's Chromium (headless, when chromium, chromium-driver and python3-selenium
are there; Slurm has no page to compare with):

  page load     navigation to the queue's 100 rows on screen, ms, and the page's JS heap
  live update   a submit to the page showing the new queue total (the event stream's
                250 ms coalescing included), ms

and with --streams N open event streams: the coordinator's RSS before and after, and the
time from a submit until every stream received its change event.

Prints medians with min-max, the ratio corral/Slurm where both do the same thing, and the
load average.

    python3 bench/status_page.py [--build build] [--jobs 10000] [--runs 5] [--streams 200]
"""

import argparse
import http.client
import os
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster, ROOT, from_clients  # noqa: E402
from vs_slurm import PrivateSlurm, ensure_slurm, rss_kb, timed  # noqa: E402


def median_range(values, fmt="{:.1f}"):
    if not values:
        return "-"
    return (fmt.format(statistics.median(values)) + " (" + fmt.format(min(values)) + "–" +
            fmt.format(max(values)) + ")")


def get_raw(c, path):
    """One GET on a fresh connection, as a browser's first request: ms and bytes."""
    t = time.perf_counter()
    ctx = ssl.create_default_context(cafile=c.ca)
    conn = http.client.HTTPSConnection(c.host, c.port, context=ctx, timeout=60)
    conn.request("GET", path, headers={"Authorization": "Bearer " + c.token})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"GET {path}: {r.status}")
    return (time.perf_counter() - t) * 1000, len(body)


def output_of(argv, env):
    t = time.perf_counter()
    out = subprocess.run(argv, env=env, check=True, capture_output=True).stdout
    return (time.perf_counter() - t) * 1000, len(out)


class Streams:
    """N event streams held open on raw TLS sockets, each read on its own thread."""

    def __init__(self, c, n):
        self.c, self.socks, self.events = c, [], []
        ctx = ssl.create_default_context(cafile=c.ca)
        for _ in range(n):
            s = ctx.wrap_socket(socket.create_connection((c.host, c.port)), server_hostname=c.host)
            s.sendall(f"GET /v1/status/events HTTP/1.1\r\nHost: {c.host}\r\n\r\n".encode())
            self.socks.append(s)
            self.events.append(threading.Event())
        self.seen = [0] * n
        self.threads = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _read(self, i):
        s = self.socks[i]
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    return
                self.seen[i] += data.count(b"event: change")
                self.events[i].set()
        except OSError:
            return

    def wait_all(self, at_least, timeout=30):
        deadline = time.time() + timeout
        while any(n < at_least for n in self.seen):
            if time.time() > deadline:
                raise RuntimeError("streams did not all receive the event")
            time.sleep(0.001)

    def close(self):
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


def browser_measures(c, runs):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not (os.access("/usr/bin/chromium", os.X_OK) and os.access("/usr/bin/chromedriver", os.X_OK)):
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--ignore-certificate-errors",
              "--window-size=1400,1000", "--enable-precise-memory-info"):
        options.add_argument(a)
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    d.set_script_timeout(60)
    loads, heaps, updates = [], [], []
    try:
        for _ in range(runs):
            d.get(c.url + "/?fresh=" + str(time.time()))
            took = d.execute_async_script("""
                const done = arguments[arguments.length - 1];
                const ready = () => document.querySelectorAll('#queue tbody tr[data-id]').length >= 100 &&
                                    document.querySelectorAll('#grid .gpu').length > 0;
                (function poll() { ready() ? done(performance.now()) : requestAnimationFrame(poll); })();""")
            loads.append(took)
            heaps.append(d.execute_script("return performance.memory ? performance.memory.usedJSHeapSize : 0") / 1e6)
            # The live feed: a submit, then the new total on screen.
            d.execute_script("""
                window.__total = document.getElementById('queue-range').textContent;
                window.__changedAt = null;
                new MutationObserver(() => {
                  if (!window.__changedAt && document.getElementById('queue-range').textContent !== window.__total)
                    window.__changedAt = Date.now();
                }).observe(document.getElementById('queue-pager'), {subtree: true, childList: true, characterData: true});""")
            t = time.time() * 1000
            c.submit("name: late\ncommand: [true]\nresources: {gpus_per_node: 1}\n")
            deadline = time.time() + 30
            changed = None
            while changed is None and time.time() < deadline:
                changed = d.execute_script("return window.__changedAt")
                time.sleep(0.005)
            if changed is None:
                raise RuntimeError("the page did not show the new job within 30 s")
            updates.append(changed - t)
    finally:
        d.quit()
    return loads, heaps, updates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--streams", type=int, default=200)
    args = ap.parse_args()
    ensure_slurm()
    cli = os.path.join(args.build, "cli", "corral")

    with LocalCluster(args.build, agents=2) as c:
        slurm = PrivateSlurm()
        try:
            # Every corral GPU held, then the queue behind it.
            c.submit("name: holder\ncommand: [sleep, '3600']\nresources: {nodes: 2, gpus_per_node: 8}\n")
            spec = "name: queued\ncommand: [true]\nresources: {gpus_per_node: 1}\n"
            fill_c, _ = from_clients(lambda: c.submit(spec), args.jobs)
            fill_s, _ = from_clients(lambda: subprocess.run(
                ["sbatch", "--hold", "-G", "1", "--wrap", "true"], env=slurm.env, check=True,
                stdout=subprocess.DEVNULL), args.jobs)
            squeued = len(subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm.env, capture_output=True,
                                         text=True).stdout.split())
            print(f"queues filled: corral {args.jobs} jobs in {fill_c:.1f} s, Slurm {squeued} jobs in {fill_s:.1f} s")

            m = {k: [] for k in ("status", "status_kb", "status1000", "status1000_kb", "cq", "cq_kb", "sq", "sq_kb")}
            for _ in range(args.runs):
                ms, n = get_raw(c, "/v1/status")
                m["status"].append(ms)
                m["status_kb"].append(n / 1024)
                ms, n = output_of(["squeue"], slurm.env)
                m["sq"].append(ms)
                m["sq_kb"].append(n / 1024)
                ms, n = get_raw(c, "/v1/status?limit=1000")
                m["status1000"].append(ms)
                m["status1000_kb"].append(n / 1024)
                ms, n = output_of([cli, "queue"], c.env())
                m["cq"].append(ms)
                m["cq_kb"].append(n / 1024)

            browser = browser_measures(c, args.runs)

            stream_rows = []
            if args.streams > 0:
                pid = c.procs[0].pid
                before = rss_kb(pid)
                streams = Streams(c, args.streams)
                streams.wait_all(1)
                held = rss_kb(pid)
                fanout = []
                for i in range(args.runs):
                    t = time.perf_counter()
                    c.submit(spec)
                    streams.wait_all(2 + i)
                    fanout.append((time.perf_counter() - t) * 1000)
                streams.close()
                stream_rows = [(f"{args.streams} streams: coordinator RSS MB", f"{before / 1024:.1f} -> {held / 1024:.1f}"),
                               (f"submit -> all {args.streams} streams told, ms", median_range(fanout))]
            load = os.getloadavg()
        finally:
            slurm.close()

    ratio = lambda a, b: f"{statistics.median(a) / statistics.median(b):.2f}"  # noqa: E731
    print(f"\n{args.jobs} pending jobs in each queue; {args.runs} turns; median (min–max)\n")
    print(f"| measure | corral | Slurm | corral/Slurm |")
    print(f"| --- | ---: | ---: | ---: |")
    print(f"| whole queue, CLI (corral queue / squeue), ms | {median_range(m['cq'])} | {median_range(m['sq'])} | {ratio(m['cq'], m['sq'])} |")
    print(f"| whole queue, CLI output, KiB | {median_range(m['cq_kb'], '{:.0f}')} | {median_range(m['sq_kb'], '{:.0f}')} | {ratio(m['cq_kb'], m['sq_kb'])} |")
    print(f"| page data GET /v1/status (100 rows), ms | {median_range(m['status'])} | – | – |")
    print(f"| page data size, KiB | {median_range(m['status_kb'])} | – | – |")
    print(f"| GET /v1/status?limit=1000, ms | {median_range(m['status1000'])} | – | – |")
    print(f"| GET /v1/status?limit=1000, KiB | {median_range(m['status1000_kb'])} | – | – |")
    if browser:
        loads, heaps, updates = browser
        print(f"| Chromium: navigation to 100 rows shown, ms | {median_range(loads)} | – | – |")
        print(f"| Chromium: page JS heap, MB | {median_range(heaps)} | – | – |")
        print(f"| Chromium: submit to new total shown, ms | {median_range(updates)} | – | – |")
    else:
        print("| Chromium | not installed | – | – |")
    for name, value in stream_rows:
        print(f"| {name} | {value} | – | – |")
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
