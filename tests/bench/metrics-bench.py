#!/usr/bin/python3
"""metrics-bench.py: the cost of /metrics on Resolve (docs/benchmarks.md, "Metrics").

    tests/bench/metrics-bench.py [--smoke] [--rounds N] [--check-goals] [BUILD_DIR]

Two familyd daemons of the same binary run side by side in one run: A without
--metrics-listen, B with it and a scraper fetching B's /metrics every 100 ms. familyd-bench
(tests/bench/familyd-bench.c) measures Resolve's p50 and throughput (1, 4 and 16 clients)
against each in turn, A then B, for --rounds rounds (default 5); the scraper runs only while B
is measured, so it never competes with A for the machine. The report is the median of the
rounds per daemon and B's ratios to A; the goal is p50(B)/p50(A) <= 1.02. Both daemons count
calls (that is in rpc/call.c whether or not metrics are served): what is measured is the HTTP
endpoint and its scrapes on top.

BUILD_DIR (default: build-bench under the source root) is configured as a release build without
sanitizers and built when it does not exist; FAMILYD_BIN and FAMILYD_BENCH, when set (meson
does), name the binaries instead. --smoke: one quick round; checks that both daemons answer,
that the scraper's scrapes succeeded and that the report is printed, not the goal.
--check-goals: exit 1 when the goal is missed.
"""

import argparse
import http.client
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.normpath(os.path.join(HERE, "..", ".."))
REGISTRY = os.path.join(os.environ.get("FAMILYD_CONFORMANCE")
                        or os.path.join(ROOT, "tests", "conformance"), "registry")
GOAL_P50 = 1.02
SCRAPE_INTERVAL_S = 0.1


def binaries(build):
    familyd, bench = os.environ.get("FAMILYD_BIN"), os.environ.get("FAMILYD_BENCH")
    if familyd and bench:
        return familyd, bench
    build = build or os.path.join(ROOT, "build-bench")
    if not os.path.exists(os.path.join(build, "build.ninja")):
        print("metrics-bench: configuring %s (release, no sanitizers)" % build, flush=True)
        subprocess.run(["meson", "setup", build, ROOT, "-Dbuildtype=release",
                        "-Db_sanitize=none"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["ninja", "-C", build, "daemon/familyd", "tests/bench/familyd-bench"],
                   check=True, stdout=subprocess.DEVNULL)
    return (familyd or os.path.join(build, "daemon", "familyd"),
            bench or os.path.join(build, "tests", "bench", "familyd-bench"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, familyd, bench, tmp, name, metrics_port=None):
        self.bench = bench
        self.sock = os.path.join(tmp, name + ".sock")
        self.log = os.path.join(tmp, name + ".log")
        self.metrics_port = metrics_port
        argv = [familyd, "--socket", self.sock, "--shard-socket",
                os.path.join(tmp, name + "-shard.sock"), "--registry", REGISTRY,
                "--host-devices", "8"]
        if metrics_port:
            argv += ["--metrics-listen", "127.0.0.1:%d" % metrics_port]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        for _ in range(300):
            if self.proc.poll() is not None:
                sys.exit("metrics-bench: familyd %s exited: %s" % (name, open(self.log).read()))
            if os.path.exists(self.sock) and subprocess.run(
                    [bench, "--socket", self.sock, "--probe"], stderr=subprocess.DEVNULL).returncode == 0:
                return
            time.sleep(0.1)
        sys.exit("metrics-bench: familyd %s not answering within 30 s" % name)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        if rc != 0:
            sys.exit("metrics-bench: familyd exited with status %d after SIGTERM:\n%s"
                     % (rc, open(self.log).read()[-3000:]))


class Scraper(threading.Thread):
    """GET /metrics every SCRAPE_INTERVAL_S, as Prometheus would (OpenMetrics asked for)."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop_event = threading.Event()
        self.ok = self.failed = 0

    def run(self):
        while not self.stop_event.wait(SCRAPE_INTERVAL_S):
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/metrics",
                          headers={"Accept": "application/openmetrics-text; version=1.0.0"})
                r = c.getresponse()
                body = r.read()
                c.close()
                if r.status == 200 and body.endswith(b"# EOF\n"):
                    self.ok += 1
                else:
                    self.failed += 1
            except OSError:
                self.failed += 1

    def stop(self):
        self.stop_event.set()
        self.join()


def measure(d, quick):
    """Resolve's (p50 us, {clients: calls/s}) from one familyd-bench run."""
    argv = [d.bench, "--socket", d.sock] + (["--quick"] if quick else [])
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    out = p.stdout.decode()
    if p.returncode not in (0, 1):
        sys.exit("metrics-bench: familyd-bench failed (%d):\n%s" % (p.returncode, out))
    head = re.search(r"^kind .*$", out, re.M)
    row = re.search(r"^resolve\s+(.*)$", out, re.M)
    if not head or not row:
        sys.exit("metrics-bench: no resolve row in familyd-bench's report:\n" + out)
    levels = [int(x) for x in re.findall(r"calls/s@(\d+)", head.group(0))]
    cells = [float(x) for x in row.group(1).split()]
    return cells[0], dict(zip(levels, cells[3:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--check-goals", action="store_true")
    args = ap.parse_args()
    familyd, bench = binaries(args.build)
    rounds = 1 if args.smoke else args.rounds

    tmp = tempfile.mkdtemp(prefix="fd-metrics-bench-")
    try:
        a = Daemon(familyd, bench, tmp, "plain")
        b = Daemon(familyd, bench, tmp, "metrics", metrics_port=free_port())
        runs = {"without": [], "with": []}
        scrapes_ok = scrapes_failed = 0
        for i in range(rounds):
            runs["without"].append(measure(a, args.smoke))
            scraper = Scraper(b.metrics_port)
            scraper.start()
            try:
                runs["with"].append(measure(b, args.smoke))
            finally:
                scraper.stop()
            scrapes_ok += scraper.ok
            scrapes_failed += scraper.failed
            print("round %d: p50 without %.1f us, with %.1f us" % (
                i + 1, runs["without"][-1][0], runs["with"][-1][0]), flush=True)
        a.stop()
        b.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    levels = sorted(runs["without"][0][1])
    med = {k: (statistics.median(r[0] for r in v),
               {l: statistics.median(r[1][l] for r in v) for l in levels})
           for k, v in runs.items()}
    print("\n%-8s %10s" % ("metrics", "p50_us") + "".join(" %13s" % ("calls/s@%d" % l)
                                                          for l in levels))
    for k in ("without", "with"):
        print("%-8s %10.1f" % (k, med[k][0]) + "".join(" %13.0f" % med[k][1][l] for l in levels))
    ratio = med["with"][0] / med["without"][0]
    print("\nratio with/without p50 %.3f" % ratio + "".join(
        " throughput@%d %.3f" % (l, med["with"][1][l] / med["without"][1][l]) for l in levels))
    print("scrapes: %d ok, %d failed (every %.0f ms while B was measured)"
          % (scrapes_ok, scrapes_failed, SCRAPE_INTERVAL_S * 1000))
    met = ratio <= GOAL_P50
    print("goal p50 with/without <= %.2f: %.3f %s" % (GOAL_P50, ratio, "met" if met else "NOT MET"))
    if scrapes_ok == 0 or scrapes_failed:
        sys.exit("metrics-bench: the scraper's scrapes failed")
    if args.smoke:
        print("metrics-bench: smoke ok")
    if args.check_goals and not met:
        sys.exit(1)


if __name__ == "__main__":
    main()
