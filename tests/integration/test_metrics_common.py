"""Helpers of the metrics tests (test_metrics.py, test_metrics_abuse.py): a daemon with
--metrics-listen on a free port of its own, scrapes, and the exposition parsed into samples.

Not a test itself: meson registers test_metrics.py and test_metrics_abuse.py only.
"""

import http.client
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metrics_daemon(registry=REGISTRY, extra_args=(), tmpdir=None):
    """A Daemon serving /metrics on 127.0.0.1 and a free port (d.metrics_port)."""
    port = H.free_port()
    d = H.Daemon(registry=registry, tmpdir=tmpdir,
                 extra_args=["--metrics-listen", "127.0.0.1:%d" % port] + list(extra_args))
    d.metrics_port = port
    return d


def http_get(port, path="/metrics", method="GET", headers=None, body=None, timeout=10):
    """(status, headers dict with lower-case names, body text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, \
            r.read().decode("utf-8", "replace")
    finally:
        c.close()


def scrape(port, openmetrics=False):
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    status, hdrs, body = http_get(port, headers=headers)
    if status != 200:
        raise AssertionError("GET /metrics answered %d: %s" % (status, body[:200]))
    return hdrs, body


def parse(text):
    """{(name, frozenset of (label, value)): float} of every sample line."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise AssertionError("not a sample line: %r" % line)
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def value(samples, name, **labels):
    """A sample's value; 0 for a series not shown (a counter that never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def promtool():
    return shutil.which("promtool")


def promtool_check(text):
    """(status, output) of `promtool check metrics` on text."""
    p = subprocess.run([promtool(), "check", "metrics"], input=text.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def tcp_listen_ports(pid):
    """The TCP ports the process listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(m.group(1))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:   # LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports
