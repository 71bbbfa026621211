#!/usr/bin/env python3
"""The status page in a real browser: Debian's chromium, driven by chromium-driver through
python3-selenium, against a real coordinator and two agents (simulated 8-GPU inventories)
on this host. It checks the cluster strip, the GPU grid with a drained node, the queue with
an array collapsed and its pager, the history and a job page with its log tail; it watches a
job go from PENDING to COMPLETED without a reload; it kills the coordinator and sees the
page say "disconnected", then "live" again once it is back. Screenshots go to ARTIFACTS.

    status_page_test.py BUILD_DIR ARTIFACTS_DIR

Exit 77 (skipped) with the reason where the browser or Selenium is missing."""

import json
import os
import sys
import time

SKIP = 77


def skip(why):
    print("SKIPPED: " + why)
    sys.exit(SKIP)


try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    skip("python3-selenium is not installed (Debian: chromium chromium-driver python3-selenium)")

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
for path in (CHROMIUM, DRIVER):
    if not os.access(path, os.X_OK):
        skip(path + " is not installed (Debian: chromium chromium-driver)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from localcluster import LocalCluster  # noqa: E402

build, artifacts = sys.argv[1], sys.argv[2]
os.makedirs(artifacts, exist_ok=True)
checks = 0


def click(wait, driver, by, what):
    """Clicks the element once it can be: the live feed may render it anew between finding
    and clicking it (jobs still being submitted), and the click then goes to the new one."""
    def clicked(_):
        try:
            driver.find_element(by, what).click()
            return True
        except StaleElementReferenceException:
            return False
    wait.until(clicked)


def check(condition, what):
    global checks
    checks += 1
    if not condition:
        raise AssertionError(what)


def browser():
    options = webdriver.ChromeOptions()
    # The coordinator's certificate is signed by the cluster's own CA, which this
    # throw-away browser profile does not hold.
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--ignore-certificate-errors", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    try:
        return webdriver.Chrome(service=Service(DRIVER), options=options)
    except WebDriverException as e:
        skip("chromium does not start here: " + str(e).splitlines()[0])


def job_spec(name, gpus, command, extra=""):
    return (f"name: {name}\nresources: {{nodes: 1, gpus_per_node: {gpus}}}\n{extra}"
            f"command: {json.dumps(command)}\n")


def wait_state(cluster, job, states, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        j = cluster.get(f"/v1/jobs/{job}?wait=5")
        if j["state"] in states:
            return j
    raise AssertionError(f"job {job} did not reach {states}")


def main():
    with LocalCluster(build, agents=2, sim="a100x8.yaml") as cluster:
        status, body = cluster.call("POST", "/v1/nodes/bench-b/drain", {"reason": "fan replacement"})
        check(status == 200, f"drain: {status} {body}")
        trainer = cluster.submit(job_spec("trainer", 3, ["sleep", "600"]))
        failing = cluster.submit(job_spec("broken", 1, ["sh", "-c", "echo starting; echo '<b id=injected>boom</b>' >&2; exit 3"]))
        array = cluster.submit(job_spec("sweep", 8, ["sleep", "1"], extra='array: "0-19%2"\npriority: -5\n'))
        wait_state(cluster, trainer, ["RUNNING"])
        wait_state(cluster, failing, ["FAILED"])

        d = browser()
        wait = WebDriverWait(d, 20, poll_frequency=0.05)
        # Read in one script turn: the live page re-renders its tables, and an element
        # found by one WebDriver call may be gone (stale) by the next.
        def inner_text(selector):
            return d.execute_script("const e = document.querySelector(arguments[0]);"
                                    "return e ? e.innerText : null;", selector)

        def row_text(selector):  # a table row's cells, one space apart
            t = inner_text(selector)
            return None if t is None else " ".join(t.split())

        def text(id_):
            return inner_text("#" + id_) or ""
        try:
            d.get(cluster.url + "/")
            wait.until(lambda _: "live" == text("live"))
            wait.until(lambda _: "GPUs allocated" in text("strip"))
            # A marker that a reload would lose: everything below happens on this one page.
            d.execute_script("window.__corralMarker = 'same page';")

            # The strip: 3 of 16 GPUs held, 8 drained, bench-b drained.
            strip = text("strip")
            check("3 / 16 GPUs allocated" in strip, "strip: " + strip)
            check("5 free · 8 drained · 0 down" in strip, "strip: " + strip)
            check("1 up" in strip and "1 drained" in strip, "strip nodes: " + strip)
            # The grid: the trainer's three cells on bench-a, bench-b drained with its reason.
            held = d.find_elements(By.CSS_SELECTOR, '[data-node="bench-a"] .gpu.held')
            check(len(held) == 3 and all(c.get_attribute("data-job") == str(trainer) for c in held),
                  f"bench-a held cells: {[c.get_attribute('data-job') for c in held]}")
            title = held[0].get_attribute("title")
            check(f"job {trainer} trainer" in title and "user " in title, "cell title: " + title)
            drained = d.find_element(By.CSS_SELECTOR, '[data-node="bench-b"]')
            check("drained" in drained.get_attribute("class") and "fan replacement" in drained.text and
                  "simulated" in drained.text, "bench-b: " + drained.text)
            # The queue: the trainer running, the array's pending elements on one row.
            queue = text("queue")
            check(f"{array}_[0-19%2]" in queue and "PENDING" in queue, "queue: " + queue)
            check("trainer" in queue and "RUNNING" in queue, "queue: " + queue)
            check("Log in" in text("history"), "history before login: " + text("history"))
            d.save_screenshot(os.path.join(artifacts, "status-public.png"))

            # Logging in shows who, and the history: the failed job with its exit code and rank.
            d.find_element(By.ID, "token").send_keys(cluster.token)
            d.find_element(By.ID, "login-button").click()
            wait.until(lambda _: text("who") != "")
            wait.until(lambda _: d.find_elements(By.ID, "history-table"))
            row = wait.until(lambda _: row_text(f'#history-table tr[data-id="{failing}"]'))
            check("FAILED" in row and " 3 " in f" {row} " and "bench-a" in row, "history row: " + row)
            check(d.execute_script("return sessionStorage.getItem('corral.token')") == cluster.token,
                  "the token is kept in session storage")

            # Live: a job waits on another (PENDING), then runs and completes, all on this page.
            # The first runs until the page has shown the second waiting on it.
            gate = os.path.join(cluster.dir, "first-may-end")
            first = cluster.submit(job_spec("first", 1, ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
            second = cluster.submit(job_spec("second", 1, ["sleep", "1"], extra=f"after_ok: {first}\n"))
            second_row = f'#queue tr[data-id="{second}"]'
            pending = wait.until(lambda _: row_text(second_row))
            check("PENDING" in pending and "Dependency" in pending, "second while first runs: " + pending)
            open(gate, "w").close()
            done = WebDriverWait(d, 30, poll_frequency=0.05).until(
                lambda _: row_text(f'#history-table tr[data-id="{second}"]'))
            check("COMPLETED" in done, "second in the history: " + done)
            check(not d.find_elements(By.CSS_SELECTOR, second_row), "second left the queue")
            check(d.execute_script("return window.__corralMarker") == "same page", "the page was not reloaded")
            d.save_screenshot(os.path.join(artifacts, "status-logged-in.png"))

            # The pager: 120 more pending jobs (too big to place) make three pages of 100.
            for i in range(120):
                cluster.submit(job_spec(f"big{i}", 8, ["true"], extra="priority: -1\n"))
            wait.until(lambda _: "of 12" in text("queue-pager"))
            pager = text("queue-pager")
            check("rows 1–100 of 12" in pager, "pager: " + pager)
            click(wait, d, By.ID, "queue-next")
            wait.until(lambda _: "rows 101–" in text("queue-pager"))
            check(len(d.find_elements(By.CSS_SELECTOR, "#queue tbody tr")) >= 20, "the second page has rows")
            click(wait, d, By.ID, "queue-prev")
            wait.until(lambda _: "rows 1–100" in text("queue-pager"))

            # A GPU cell opens the job that holds it.
            click(wait, d, By.CSS_SELECTOR, '[data-node="bench-a"] .gpu.held')
            wait.until(lambda _: d.find_elements(By.ID, "job-title"))
            check(f"Job {trainer} · trainer · RUNNING" in text("job-title"), "from the grid: " + text("job-title"))
            check(d.execute_script("return window.__corralMarker") == "same page", "the page was not reloaded")

            # A job page: fields, ranks, events, spec and each rank's log tail.
            d.get(cluster.url + f"/#/job/{failing}")
            wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, "pre.log"))
            job = text("job")
            check(f"Job {failing} · broken · FAILED" in job, "job page title: " + job[:200])
            check("exit code\n3" in job and "failing rank\n0 on bench-a" in job, "job fields: " + job[:800])
            log = d.find_element(By.CSS_SELECTOR, 'pre.log[data-rank="0"]').text
            check("starting" in log and "<b id=injected>boom</b>" in log, "log tail: " + log)
            check(not d.find_elements(By.ID, "injected"), "a log line became markup")
            rank = [c.text for c in d.find_elements(By.CSS_SELECTOR, '#ranks tr[data-rank="0"] td')]
            check(rank[1] == "bench-a" and rank[5] == "EXITED" and rank[6] == "3", f"rank 0: {rank}")
            check("exit 3" in d.find_element(By.ID, "spec").text, "spec: " + d.find_element(By.ID, "spec").text)
            check(len(d.find_elements(By.CSS_SELECTOR, "#events li")) >= 2, "events listed")
            d.save_screenshot(os.path.join(artifacts, "status-job.png"))

            # The coordinator killed: the page says so; back: live again, no reload needed.
            d.get(cluster.url + "/")
            wait.until(lambda _: text("live") == "live")
            cluster.kill_coordinator()
            wait.until(lambda _: text("live") == "disconnected")
            d.save_screenshot(os.path.join(artifacts, "status-disconnected.png"))
            cluster.start_coordinator()
            WebDriverWait(d, 40, poll_frequency=0.1).until(lambda _: text("live") == "live")
            wait.until(lambda _: "trainer" in text("queue"))

            severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE" and "status/events" not in e["message"]
                      and "ERR_CONNECTION_REFUSED" not in e["message"]]
            check(not severe, f"browser errors: {severe}")
        except Exception:
            print("live feed: " + d.find_element(By.ID, "live").get_attribute("title"))
            for entry in d.get_log("browser"):
                print("browser: " + entry["message"])
            d.save_screenshot(os.path.join(artifacts, "status-failure.png"))
            with open(os.path.join(artifacts, "status-failure.html"), "w") as f:
                f.write(d.page_source)
            raise
        finally:
            d.quit()
    print(f"status page: {checks} checks passed; screenshots in {artifacts}")


if __name__ == "__main__":
    main()
