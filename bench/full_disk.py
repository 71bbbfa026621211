#!/usr/bin/env python3
"""bench/full_disk: the coordinator's disk fills under submitting clients, then frees.

A coordinator (its state folder on a tmpfs of its own) and two simulated 8-GPU agents on
this machine; `--clients` threads submit short one-GPU jobs the whole time. After
`--before` seconds the tmpfs is filled to the last byte and kept full for `--full`
seconds, then the filler is removed. The coordinator must stay up (0 exits), refuse
writes with 503 while it cannot write, serve again within a second of the space coming
back, and keep every acknowledged job: at the end it is SIGKILLed and started again, and
every job that got a 201 must be there. Root only (mount).

    bench/full_disk.py [--build build] [--clients 8] [--before 5] [--full 60] [--after 5]
"""

import argparse
import http.client
import json
import os
import ssl
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localcluster import LocalCluster  # noqa: E402

SPEC = "name: fill\ncommand: [sleep, '0.2']\nresources: {gpus: 1}\n"


def fill(path):
    """Writes `path` until the file system takes not one more byte."""
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            block = b"x" * size
            while True:
                try:
                    f.write(block)
                except OSError:
                    break


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--before", type=float, default=5)
    p.add_argument("--full", type=float, default=60)
    p.add_argument("--after", type=float, default=5)
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/full_disk.py mounts a tmpfs: run it as root")
    load_before = os.getloadavg()
    with LocalCluster(a.build, agents=2, state_size="64m") as c:
        lock = threading.Lock()
        acked, refused, doubtful = [], [0], [0]
        first_refusal = [None]
        freed_at = [None]
        first_after = [None]
        stop = threading.Event()
        context = ssl.create_default_context(cafile=c.ca)
        headers = {"Authorization": "Bearer " + c.token, "Content-Type": "application/json"}
        body = json.dumps({"spec": SPEC, "file": "fill.yaml"})

        def client():
            conn = None
            while not stop.is_set():
                if conn is None:
                    conn = http.client.HTTPSConnection(c.host, c.port, context=context, timeout=5)
                try:
                    conn.request("POST", "/v1/jobs", body=body, headers=headers)
                    r = conn.getresponse()
                    text = r.read()
                except (OSError, http.client.HTTPException):
                    # No answer: the job may exist or not; it was not acknowledged.
                    conn.close()
                    conn = None
                    with lock:
                        doubtful[0] += 1
                    continue
                now = time.monotonic()
                with lock:
                    if r.status == 201:
                        acked.append(json.loads(text)["id"])
                        if freed_at[0] is not None and first_after[0] is None:
                            first_after[0] = now
                    elif r.status == 503:
                        refused[0] += 1
                        if first_refusal[0] is None:
                            first_refusal[0] = now
                if r.status == 503:
                    time.sleep(0.05)

        threads = [threading.Thread(target=client) for _ in range(a.clients)]
        for t in threads:
            t.start()
        time.sleep(a.before)
        filler = os.path.join(c.state_mount, "filler")
        filled_at = time.monotonic()
        fill(filler)
        time.sleep(a.full)
        os.remove(filler)
        with lock:
            freed_at[0] = time.monotonic()
        time.sleep(a.after)
        stop.set()
        for t in threads:
            t.join()
        exits = 0 if c.procs[0].poll() is None else 1
        c.kill_coordinator()
        c.start_coordinator()
        lost = sum(1 for job in acked if c.call("GET", f"/v1/jobs/{job}")[0] != 200)
        load_after = os.getloadavg()

    def ms(t0, t1):
        return f"{(t1 - t0) * 1000:.0f}" if t0 is not None and t1 is not None else "-"

    print(f"{a.clients} clients, {a.before:g} s, disk full {a.full:g} s, {a.after:g} s after")
    print("| measure | value |")
    print("| --- | ---: |")
    print(f"| submissions acknowledged (201) | {len(acked)} |")
    print(f"| acknowledged jobs lost (after a SIGKILL and restart) | {lost} |")
    print(f"| refused with 503 while full | {refused[0]} |")
    print(f"| no answer within 5 s (not acknowledged) | {doubtful[0]} |")
    print(f"| coordinator exits | {exits} |")
    print(f"| first 503 after the disk filled, ms | {ms(filled_at, first_refusal[0])} |")
    print(f"| first 201 after the space came back, ms | {ms(freed_at[0], first_after[0])} |")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")


if __name__ == "__main__":
    main()
