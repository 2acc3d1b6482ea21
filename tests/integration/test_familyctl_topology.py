#!/usr/bin/python3
"""The cluster topology through the clients: familyctl topology [--watch] [--devices], forget,
status, the table options over topology's two tables; libfamilyd's watch API (through
tests/probes/watch-probe); the Python module's topology, watch_topology and forget_node.

Three real daemons form a cluster over UCX on loopback (--listen/--peers on free ports, short
heartbeat/suspect/down times). TestCluster keeps all three up; TestNodeLoss starts its own
three, SIGKILLs one while familyctl, the C API and Python watch, forgets it, and stops another
under a running watch.

Needs $FAMILYCTL and $FAMILYD_WATCH_PROBE (meson passes both).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
CTL = H.familyctl_bin()
PROBE = os.environ.get("FAMILYD_WATCH_PROBE")
PYTHON_MODULE = os.path.join(H.SOURCE_ROOT, "client", "python")

# The peer layer talks TCP on loopback; the daemons inherit these.
os.environ["UCX_TLS"] = "tcp"
os.environ["UCX_NET_DEVICES"] = "lo"

TIMINGS = ["--heartbeat-ms", "100", "--suspect-ms", "400", "--down-ms", "1200"]
FORM_TIMEOUT = 30.0     # three ASan daemons on two shared cores
STATE_TIMEOUT = 20.0

TIMESTAMP_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4}  topology version (\d+)$")


def free_ports(n):
    """n TCP ports on 127.0.0.1 that nothing uses now (held together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_cluster(n=3, extra=None, node_ranks=True):
    """n daemons n1..nN, node ranks 0..N-1 (or none configured), 2 host devices each, all
    seeded with n1's address; returns them once every one sees all n nodes up and their
    topology versions agree and stay."""
    ports = free_ports(n)
    daemons = []
    try:
        for i in range(n):
            args = ["--listen", "127.0.0.1:%d" % ports[i], "--peers", "127.0.0.1:%d" % ports[0]]
            args += ["--node-rank", str(i)] if node_ranks else []
            args += TIMINGS + list((extra or {}).get(i, ()))
            d = H.Daemon(registry=REGISTRY, host_devices=2, node_name="n%d" % (i + 1),
                         extra_args=args)
            daemons.append(d)
            d.start()
        deadline = time.monotonic() + FORM_TIMEOUT
        for d in daemons:
            while True:
                t = d.client.call("familyd.v1.MeshService/GetTopology")
                if t.ok and sorted((x.name, x.state) for x in t.reply.nodes) == \
                        [("n%d" % (i + 1), "up") for i in range(n)]:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError("cluster did not form within %.0f s: %s sees %r"
                                         % (FORM_TIMEOUT, d.node_name, t.reply))
                time.sleep(0.1)
        # ... and settled: every daemon on the same topology version, unchanged over 5
        # heartbeats, so that a watch started now sees only the changes a test makes (a
        # version can still move once after all are up, with no state changed).
        last = None
        while True:
            versions = {d.client.call("familyd.v1.MeshService/GetTopology").reply.version
                        for d in daemons}
            if len(versions) == 1 and versions == last:
                break
            if time.monotonic() > deadline:
                raise AssertionError("cluster did not settle within %.0f s: versions %r"
                                     % (FORM_TIMEOUT, sorted(versions)))
            last = versions
            time.sleep(0.5)
        return daemons
    except BaseException:
        stop_cluster(daemons)
        raise


def stop_cluster(daemons):
    errors = []
    for d in daemons:
        try:
            if d.alive():
                d.stop()
        except AssertionError as e:
            errors.append(str(e))
        finally:
            d.cleanup()
    if errors:
        raise AssertionError("\n".join(errors))


def ctl(d, *args, timeout=60):
    p = subprocess.run([CTL, "--socket", d.socket] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class Streamed:
    """A running process whose stdout lines are collected as they arrive, with their time."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        self.lines = []
        self.cond = threading.Condition()
        self.eof = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for raw in self.proc.stdout:
            with self.cond:
                self.lines.append(raw.decode().rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_for(self, pred, timeout=STATE_TIMEOUT, what="a line"):
        """Waits until pred(lines) is true while the process may still run; returns its value."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                v = pred(list(self.lines))
                if v:
                    return v
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    raise AssertionError("no %s within %.0f s (eof=%s); output so far:\n%s\nstderr:\n%s"
                                         % (what, timeout, self.eof, "\n".join(self.lines),
                                            self.stderr_now()))
                self.cond.wait(min(left, 0.2))

    def stderr_now(self):
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read().decode()

    def finish(self, timeout=15):
        """(exit status, stdout lines, stderr) once the process ends by itself."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("process did not exit within %d s; output:\n%s"
                                 % (timeout, "\n".join(self.lines)))
        self.thread.join(5)
        err = self.proc.stderr.read().decode()
        self.proc.stderr.close()
        self.proc.stdout.close()
        return rc, self.lines, err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def blocks(lines):
    """The topologies of `topology --watch` output: [(version, {node: (state, node_rank,
    ranks, local)}, world_size)], one per timestamp line, only those printed whole."""
    out = []
    i = 0
    while i < len(lines):
        m = TIMESTAMP_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        version = int(m.group(1))
        j = i + 1
        fields = {}
        while j < len(lines) and lines[j].strip():
            key, _, value = lines[j].partition("   ")
            fields[key.strip()] = value.strip()
            j += 1
        if j + 1 >= len(lines) or not lines[j + 1].startswith("NODE "):
            break
        j += 2
        nodes = {}
        while j < len(lines) and lines[j].strip():
            row = lines[j].split()
            nodes[row[0]] = (row[3], row[1], row[2], row[7])   # DEVICES is "2 host"
            j += 1
        if j >= len(lines):
            break   # the table may not be complete yet: the blank line after it ends it
        out.append((version, nodes, fields))
        i = j
    return out


def node_table(out):
    """The node rows of `familyctl topology`: {name: row cells}."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("NODE "))
    self_cols = lines[start].split()
    assert self_cols == ["NODE", "NODE_RANK", "RANKS", "STATE", "ADDRESS", "DEVICES", "LOCAL",
                         "REGISTRY"], self_cols
    rows = {}
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        cells = ln.split()
        rows[cells[0]] = cells
    return rows


def probe(d, *args, timeout=30):
    p = subprocess.run([PROBE, d.socket] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=timeout)
    out = p.stdout.decode()
    return p.returncode, out, p.stderr.decode()


def probe_results(out):
    """[(r, errno name, status text)] of the probe's result lines, and elapsed ms per result."""
    res = re.findall(r"^result (-?\d+) \((\w+)\)(.*)$", out, re.M)
    elapsed = [int(x) for x in re.findall(r"^elapsed (\d+)$", out, re.M)]
    return [(int(a), b, c.strip()) for a, b, c in res], elapsed


def python_client(d, timeout=10.0):
    if PYTHON_MODULE not in sys.path:
        sys.path.insert(0, PYTHON_MODULE)
    import familyd
    return familyd, familyd.Client(d.socket, timeout=timeout, protos=familyd.Protos(H.descriptor_set_path()))


def setUpModule():
    if not CTL or not os.path.exists(CTL):
        raise unittest.SkipTest("familyctl not built")
    if not PROBE or not os.path.exists(PROBE):
        raise unittest.SkipTest("watch-probe not built ($FAMILYD_WATCH_PROBE)")


class TestCluster(unittest.TestCase):
    """Three daemons, all up, for the whole class. n2 allows a single open watch."""

    @classmethod
    def setUpClass(cls):
        cls.daemons = start_cluster(extra={1: ["--max-watches", "1"]})
        cls.n1, cls.n2, cls.n3 = cls.daemons

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.daemons)

    def ok(self, d, *args):
        rc, out, err = ctl(d, *args)
        self.assertEqual(rc, 0, "familyctl %s: rc=%d\nstdout:\n%s\nstderr:\n%s"
                         % (" ".join(args), rc, out, err))
        self.assertEqual(err, "")
        return out

    # -- familyctl topology / status -----------------------------------------------------

    def test_topology_table(self):
        out = self.ok(self.n1, "topology")
        self.assertRegex(out, r"(?m)^world size +6$")
        self.assertRegex(out, r"(?m)^local node +n1$")
        rows = node_table(out)
        self.assertEqual(sorted(rows), ["n1", "n2", "n3"], out)
        digests = {n["name"]: n["registryDigest"]
                   for n in json.loads(self.ok(self.n1, "--json", "topology"))["nodes"]}
        for i, name in enumerate(("n1", "n2", "n3")):
            node, node_rank, ranks, state, address, ndev, kind, local, registry = rows[name]
            # The same registry everywhere: the first 12 hex digits of one digest.
            self.assertRegex(digests[name], r"^[0-9a-f]{64}$")
            self.assertEqual(registry, digests["n1"][:12], out)
            self.assertEqual((node_rank, ranks, state, ndev, kind), (str(i), "%d-%d" % (2 * i, 2 * i + 1),
                                                                     "up", "2", "host"), out)
            self.assertRegex(address, r"^127\.0\.0\.1:\d+$")
            self.assertEqual(local, "yes" if name == "n1" else "no", out)
        # no device table unless asked
        self.assertNotIn("PCI_BUS_ID", out)
        # the other daemons see the same cluster, each itself as local
        rows3 = node_table(self.ok(self.n3, "topology"))
        self.assertEqual({k: (v[2], v[3], v[7]) for k, v in rows3.items()},
                         {"n1": ("0-1", "up", "no"), "n2": ("2-3", "up", "no"), "n3": ("4-5", "up", "yes")})

    def test_topology_devices(self):
        out = self.ok(self.n1, "topology", "--devices")
        lines = out.splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.startswith("NODE ") and "PCI_BUS_ID" in ln)
        self.assertEqual(lines[start].split(), ["NODE", "RANK", "INDEX", "KIND", "NAME", "UUID",
                                                "MEMORY_BYTES", "NUMA", "PCI_BUS_ID"])
        rows = [ln.split() for ln in lines[start + 1:] if ln.strip()]
        self.assertEqual([(r[0], r[1], r[2], r[3]) for r in rows],
                         [("n%d" % (rank // 2 + 1), str(rank), str(rank % 2), "host") for rank in range(6)],
                         out)
        topo = json.loads(self.ok(self.n1, "--json", "topology"))
        by_node = {n["name"]: n for n in topo["nodes"]}
        for r in rows:
            dev = by_node[r[0]]["devices"][int(r[2])]
            self.assertEqual(r[4], dev.get("name") or "-")
            self.assertEqual(r[5], dev.get("uuid") or "-")
            self.assertEqual(r[6], str(dev.get("memoryBytes", "0")))
            numa = int(dev.get("numaNode", 0))
            self.assertEqual(r[7], str(numa) if numa >= 0 else "-")
            self.assertEqual(r[8], dev.get("pciBusId") or "-")
        # the node table comes first, unchanged
        self.assertEqual(sorted(node_table(out)), ["n1", "n2", "n3"])

    def test_topology_table_options(self):
        # -o names columns of both tables: each shows its own, in -o's order
        out = self.ok(self.n1, "topology", "--devices", "-o", "rank,node,state", "--noheadings")
        blocks = out.split("\n\n")
        self.assertEqual(len(blocks), 3, out)
        self.assertRegex(blocks[0], r"(?m)^world size +6$")
        self.assertEqual([ln.split() for ln in blocks[1].splitlines()],
                         [["n1", "up"], ["n2", "up"], ["n3", "up"]], out)
        self.assertEqual([ln.split() for ln in blocks[2].splitlines()],
                         [[str(r), "n%d" % (r // 2 + 1)] for r in range(6)], out)
        # a table with none of the named columns is left out
        out = self.ok(self.n1, "topology", "--devices", "-o", "uuid")
        self.assertNotIn("NODE", out)
        self.assertEqual(out.split("\n\n")[1].splitlines()[0].split(), ["UUID"])
        # the watch prints its topologies the same way
        out = self.ok(self.n1, "topology", "--watch", "--count", "1", "--raw", "-o", "state,NODE,devices")
        lines = out.splitlines()
        self.assertRegex(lines[0], TIMESTAMP_LINE)
        self.assertIn("STATE NODE DEVICES\nup n1 2\\x20host\nup n2 2\\x20host\nup n3 2\\x20host\n\n", out)
        rc, out, err = ctl(self.n1, "forget", "n2", "-o", "uuid")
        self.assertEqual(rc, 2, err)
        self.assertIn("unknown column 'uuid' (columns: NODE, NODE_RANK, RANKS, STATE, ADDRESS, "
                      "DEVICES, LOCAL, REGISTRY)", err)

    def test_status_peer_traffic_and_topology_version(self):
        out = self.ok(self.n1, "status")
        m = re.search(r"(?m)^peer traffic +(\d+) messages, (\d+) bytes sent$", out)
        self.assertTrue(m, out)
        msgs, nbytes = int(m.group(1)), int(m.group(2))
        self.assertGreater(msgs, 0, out)
        self.assertGreater(nbytes, msgs, out)
        m = re.search(r"(?m)^topology version +(\d+)$", out)
        self.assertTrue(m, out)
        version = int(m.group(1))
        self.assertRegex(out, r"(?m)^peers +2 up, 0 suspect, 0 down$")
        # the same numbers as the daemon's answer, and the topology's own version
        st = json.loads(self.ok(self.n1, "--json", "status"))
        self.assertGreaterEqual(int(st["peerMessagesSent"]), msgs)
        self.assertGreaterEqual(int(st["peerBytesSent"]), nbytes)
        topo = json.loads(self.ok(self.n1, "--json", "topology"))
        self.assertEqual(int(topo["version"]), version)
        self.assertEqual(int(st["topologyVersion"]), version)
        # heartbeats keep flowing: the counters move
        time.sleep(0.5)
        st2 = json.loads(self.ok(self.n1, "--json", "status"))
        self.assertGreater(int(st2["peerMessagesSent"]), int(st["peerMessagesSent"]))

    def test_help_and_usage(self):
        out = self.ok(self.n1, "--help")
        self.assertIn("forget NODE", out)
        self.assertIn("topology [--watch] [--devices]", out)
        out = self.ok(self.n1, "topology", "--help")
        for word in ("--watch", "--count N", "--devices", "SIGINT", "exit 3", "--timeout"):
            self.assertIn(word, out)
        out = self.ok(self.n1, "forget", "--help")
        self.assertIn("Usage: familyctl forget [OPTIONS] NODE", out)
        self.assertIn("FAILED_PRECONDITION", out)
        self.assertIn("topology version", self.ok(self.n1, "status", "--help").replace("\n", " "))
        for args in (["topology", "--count", "2"], ["topology", "--watch", "--count", "0"],
                     ["topology", "--watch", "--count", "x"], ["topology", "extra"],
                     ["forget"], ["forget", "n2", "n3"], ["forget", "--bogus", "n2"]):
            rc, out, err = ctl(self.n1, *args)
            self.assertEqual(rc, 2, "familyctl %s: rc=%d %s" % (args, rc, err))
            self.assertIn("familyctl: ", err)
            self.assertEqual(out, "")

    def test_forget_refused(self):
        cases = [
            ("n2", "FAILED_PRECONDITION: node 'n2' is up; only a down node can be forgotten"),
            ("n1", "FAILED_PRECONDITION: node 'n1' is this daemon's own node"),
            ("nope", "NOT_FOUND: node 'nope' is not in the topology"),
        ]
        for node, text in cases:
            rc, out, err = ctl(self.n1, "forget", node)
            self.assertEqual(rc, 1, "forget %s: rc=%d %s" % (node, rc, err))
            self.assertEqual(out, "")
            self.assertTrue(err.startswith("familyctl: " + text), err)
        self.assertEqual(sorted(node_table(self.ok(self.n1, "topology"))), ["n1", "n2", "n3"])

    # -- familyctl topology --watch --------------------------------------------------------

    def test_watch_count_human(self):
        t0 = time.monotonic()
        out = self.ok(self.n1, "topology", "--watch", "--count", "1")
        self.assertLess(time.monotonic() - t0, 15)
        lines = out.splitlines()
        self.assertRegex(lines[0], TIMESTAMP_LINE)
        got = blocks(lines)
        self.assertEqual(len(got), 1, out)
        self.assertEqual(lines[-1], "", "a block ends with a blank line")
        version, nodes, fields = got[0]
        self.assertEqual(fields["version"], str(version))
        self.assertEqual(fields["world size"], "6")
        self.assertEqual(nodes, {"n1": ("up", "0", "0-1", "yes"), "n2": ("up", "1", "2-3", "no"),
                                 "n3": ("up", "2", "4-5", "no")})
        # the human block is `familyctl topology`'s
        plain = self.ok(self.n1, "topology")
        self.assertEqual("\n".join(lines[1:]).strip(), plain.strip())

    def test_watch_count_json(self):
        out = self.ok(self.n1, "--json", "topology", "--watch", "--count", "1")
        lines = out.splitlines()
        self.assertEqual(len(lines), 1, out)
        doc = json.loads(lines[0])
        self.assertEqual(sorted(n["name"] for n in doc["nodes"]), ["n1", "n2", "n3"])
        self.assertEqual(doc["worldSize"], "6")

    def assertWatchEndsBySignal(self, sig):
        w = Streamed([CTL, "--socket", self.n1.socket, "topology", "--watch"])
        try:
            w.wait_for(lambda ls: blocks(ls), what="first topology")
            time.sleep(0.2)
            w.proc.send_signal(sig)
            rc, lines, err = w.finish()
        finally:
            w.kill()
        self.assertEqual(rc, 0, "%s: rc=%d stderr=%s" % (sig, rc, err))
        self.assertEqual(err, "")
        self.assertEqual(len(blocks(lines)), 1, "\n".join(lines))

    def test_watch_sigint_exits_0(self):
        self.assertWatchEndsBySignal(signal.SIGINT)

    def test_watch_sigterm_exits_0(self):
        self.assertWatchEndsBySignal(signal.SIGTERM)

    def test_watch_reader_gone_exits_0(self):
        # The reader of stdout closes its end: familyctl notices at once (not only on its next
        # write, which may be long in coming) and exits 0 without dying of SIGPIPE.
        p = subprocess.Popen([CTL, "--socket", self.n1.socket, "topology", "--watch"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            first = p.stdout.readline().decode()
            self.assertRegex(first.rstrip("\n"), TIMESTAMP_LINE)
            p.stdout.close()
            rc = p.wait(10)
            err = p.stderr.read().decode()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")

    def test_watch_unreachable_exit_3(self):
        missing = os.path.join(self.n1.tmpdir, "missing.sock")
        p = subprocess.run([CTL, "--socket", missing, "topology", "--watch"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=30)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("cannot reach familyd", p.stderr.decode())

    def test_watch_timeout_bounds_the_watch(self):
        t0 = time.monotonic()
        rc, out, err = ctl(self.n1, "--timeout", "800", "topology", "--watch")
        elapsed = time.monotonic() - t0
        self.assertEqual(rc, 3, err)
        self.assertIn("DEADLINE_EXCEEDED", err)
        self.assertEqual(len(blocks(out.splitlines())), 1, out)
        self.assertGreater(elapsed, 0.7)
        self.assertLess(elapsed, 15)

    def test_watch_limit_is_the_daemons_error(self):
        # n2 allows one open watch: a second familyctl watch is refused with its message.
        w = Streamed([CTL, "--socket", self.n2.socket, "topology", "--watch"])
        try:
            w.wait_for(lambda ls: blocks(ls), what="first topology")
            rc, out, err = ctl(self.n2, "topology", "--watch")
            self.assertEqual(rc, 1, err)
            self.assertIn("RESOURCE_EXHAUSTED: watch limit reached: 1 open watches", err)
            self.assertEqual(out, "")
            w.proc.send_signal(signal.SIGTERM)
            self.assertEqual(w.finish()[0], 0)
        finally:
            w.kill()

    # -- libfamilyd's watch API (watch-probe) ----------------------------------------------

    def test_c_watch_stops_when_the_handler_says_so(self):
        rc, out, err = probe(self.n1, "stop", "1")
        self.assertEqual(rc, 0, out + err)
        self.assertNotIn("ERROR", err)
        self.assertEqual(re.findall(r"^topology \d+ (.*)$", out, re.M), ["n1=up,n2=up,n3=up"], out)
        results, elapsed = probe_results(out)
        self.assertEqual(results, [(0, "0", "")], out)
        self.assertIn("handler calls 1", out)
        # no waiting for a next topology that is not coming
        self.assertLess(elapsed[0], 5000, out)

    def test_c_watch_stop_frees_the_daemons_watch(self):
        # n2 allows one open watch: a second watch on the same client gets it only when the
        # stopped one was cancelled and closed on the daemon's side too.
        rc, out, err = probe(self.n2, "stop-again", "1")
        self.assertEqual(rc, 0, out + err)
        results, _ = probe_results(out)
        self.assertEqual(results, [(0, "0", ""), (0, "0", "")], out)
        self.assertEqual(out.count("handler calls 1"), 2, out)

    def test_c_watch_handler_error(self):
        rc, out, err = probe(self.n1, "fail")
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(probe_results(out)[0], [(-131, "ENOTRECOVERABLE", "")], out)

    def test_c_watch_deadline(self):
        rc, out, err = probe(self.n1, "deadline", "700")
        self.assertEqual(rc, 0, out + err)
        results, elapsed = probe_results(out)
        self.assertEqual(results[0][:2], (-71, "EPROTO"), out)
        self.assertTrue(results[0][2].startswith("DEADLINE_EXCEEDED"), out)
        self.assertGreaterEqual(elapsed[0], 650, out)
        self.assertLess(elapsed[0], 10000, out)
        self.assertIn("again -108 (ESHUTDOWN)", out)
        self.assertEqual(len(re.findall(r"^topology ", out, re.M)), 1, out)

    def test_c_watch_cancel_from_another_thread(self):
        rc, out, err = probe(self.n1, "cancel", "500")
        self.assertEqual(rc, 0, out + err)
        results, elapsed = probe_results(out)
        self.assertEqual(results, [(-125, "ECANCELED", "")], out)
        self.assertGreaterEqual(elapsed[0], 450, out)
        self.assertLess(elapsed[0], 10000, out)

    # -- the Python module -----------------------------------------------------------------

    def test_python_topology_and_watch(self):
        familyd, c = python_client(self.n3)
        with c:
            t = c.topology()
            self.assertEqual(t.local_node, "n3")
            self.assertEqual(t.world_size, 6)
            self.assertEqual(sorted((n.name, n.state, n.first_rank) for n in t.nodes),
                             [("n1", "up", 0), ("n2", "up", 2), ("n3", "up", 4)])
            gen = c.watch_topology()
            first = next(gen)
            self.assertGreaterEqual(first.version, t.version)
            self.assertEqual(sorted(n.name for n in first.nodes), ["n1", "n2", "n3"])
            gen.close()
            # a deadline ends the watch with DEADLINE_EXCEEDED after the current topology
            seen = []
            with self.assertRaises(familyd.FamilydError) as cm:
                for topo in c.watch_topology(timeout=0.5):
                    seen.append(topo.version)
            self.assertEqual(cm.exception.code_name, "DEADLINE_EXCEEDED")
            self.assertEqual(len(seen), 1)
            with self.assertRaises(familyd.FamilydError) as cm:
                c.forget_node("n1")
            self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")
            self.assertEqual(cm.exception.message, "node 'n1' is up; only a down node can be forgotten")
            with self.assertRaises(familyd.FamilydError) as cm:
                c.forget_node("nope")
            self.assertEqual(cm.exception.code_name, "NOT_FOUND")


class TestNodeLoss(unittest.TestCase):
    """A node dies: every client sees it go suspect, then down; forget drops it everywhere;
    the daemon under a running watch stops."""

    def setUp(self):
        # No --node-rank here: the daemons order the nodes by name, NODE_RANK shows "-".
        self.daemons = start_cluster(node_ranks=False)
        self.n1, self.n2, self.n3 = self.daemons
        self.addCleanup(stop_cluster, self.daemons)

    def test_node_loss_watch_forget_and_daemon_gone(self):
        states = lambda bl: [nodes.get("n3", ("gone",))[0] for _, nodes, _ in bl]  # noqa: E731

        # Watchers on n1: familyctl without a count (ended by SIGTERM), familyctl --count 3,
        # and the C API following the stream on n2.
        w = Streamed([CTL, "--socket", self.n1.socket, "topology", "--watch"])
        wc = Streamed([CTL, "--socket", self.n1.socket, "topology", "--watch", "--count", "3"])
        pf = Streamed([PROBE, self.n2.socket, "follow"])
        for s in (w, wc, pf):
            self.addCleanup(s.kill)
        bl = w.wait_for(lambda ls: blocks(ls), what="first topology")
        self.assertEqual(bl[0][1], {"n1": ("up", "-", "0-1", "yes"), "n2": ("up", "-", "2-3", "no"),
                                    "n3": ("up", "-", "4-5", "no")})
        wc.wait_for(lambda ls: blocks(ls), what="first topology")
        pf.wait_for(lambda ls: [x for x in ls if x.startswith("topology ")], what="first topology")
        familyd, pyc = python_client(self.n1)
        self.addCleanup(pyc.close)
        gen = pyc.watch_topology(timeout=60)
        first = next(gen)
        self.assertEqual(sorted((n.name, n.state) for n in first.nodes),
                         [("n1", "up"), ("n2", "up"), ("n3", "up")])

        self.n3.kill()

        # familyctl streams each change as it comes: suspect, then down, while still running.
        got = w.wait_for(lambda ls: (lambda bl: bl if "down" in states(bl) else None)(blocks(ls)),
                         what="n3 down")
        self.assertIsNone(w.proc.poll(), "the watch ended by itself")
        seq = [s for i, s in enumerate(states(got)) if i == 0 or s != states(got)[i - 1]]
        self.assertEqual(seq, ["up", "suspect", "down"], "\n".join(w.lines))
        versions = [v for v, _, _ in got]
        self.assertEqual(versions, sorted(versions))
        self.assertEqual(len(set(versions)), len(versions), "a topology printed twice")
        for v, nodes, fields in got:
            self.assertEqual(fields["version"], str(v))
            self.assertEqual((nodes["n1"][0], nodes["n2"][0]), ("up", "up"))

        # --count 3 stops by itself after three topologies: all up, then n3 suspect (or down)
        rc, lines, err = wc.finish()
        self.assertEqual(rc, 0, err)
        bl = blocks(lines)
        self.assertEqual(len(bl), 3, "\n".join(lines))
        order = ["up", "suspect", "down"]
        idx = [order.index(x) for x in states(bl)]
        self.assertEqual(idx, sorted(idx), "\n".join(lines))
        self.assertEqual((idx[0], idx[-1] > 0), (0, True), "\n".join(lines))

        # the C API saw the same sequence on n2
        probe_lines = pf.wait_for(lambda ls: (lambda t: t if "n3=down" in t[-1] else None)(
            [x for x in ls if x.startswith("topology ")]), what="n3=down from the C API")
        n3 = [re.search(r"n3=(\w+)", x).group(1) for x in probe_lines]
        self.assertEqual([s for i, s in enumerate(n3) if i == 0 or s != n3[i - 1]],
                         ["up", "suspect", "down"], "\n".join(pf.lines))

        # and the Python generator
        py_states = []
        for topo in gen:
            st = {n.name: n.state for n in topo.nodes}
            py_states.append(st.get("n3"))
            if st.get("n3") == "down":
                break
        gen.close()
        self.assertIn("suspect", py_states)

        # forget: an up node is refused; the down node goes, here and on n2 soon after
        rc, out, err = ctl(self.n1, "forget", "n2")
        self.assertEqual(rc, 1, err)
        self.assertIn("node 'n2' is up; only a down node can be forgotten", err)
        rc, out, err = ctl(self.n1, "forget", "n3")
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(node_table(out)), ["n1", "n2"], out)
        self.assertRegex(out, r"(?m)^world size +4$")
        t0 = time.monotonic()
        while True:
            rc, out2, err2 = ctl(self.n2, "topology")
            self.assertEqual(rc, 0, err2)
            if "n3" not in node_table(out2):
                break
            self.assertLess(time.monotonic() - t0, 3.0, "n2 still lists n3:\n" + out2)
            time.sleep(0.1)
        rc, out, err = ctl(self.n1, "forget", "n3")
        self.assertEqual(rc, 1, err)
        self.assertIn("NOT_FOUND: node 'n3' is not in the topology", err)

        # the running watch printed the topology without n3, then SIGTERM ends it with 0
        w.wait_for(lambda ls: "gone" in states(blocks(ls)), what="a topology without n3")
        w.proc.send_signal(signal.SIGTERM)
        rc, lines, err = w.finish()
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        pf.wait_for(lambda ls: [x for x in ls if x.startswith("topology ") and "n3=" not in x],
                    what="a topology without n3 from the C API")

        # n2 stops under running watches: familyctl exits 3 saying so, the C API gets the status
        w2 = Streamed([CTL, "--socket", self.n2.socket, "topology", "--watch"])
        self.addCleanup(w2.kill)
        w2.wait_for(lambda ls: blocks(ls), what="first topology")
        self.n2.stop()
        rc, lines, err = w2.finish()
        self.assertEqual(rc, 3, err)
        self.assertRegex(err, r"^familyctl: familyd went away, the topology watch ended: "
                              r"(UNAVAILABLE|CANCELLED): ")
        rc, lines, err = pf.finish()
        self.assertEqual(rc, 0, err)
        results, _ = probe_results("\n".join(lines))
        self.assertEqual(results[0][:2], (-71, "EPROTO"), "\n".join(lines))
        self.assertRegex(results[0][2], r"^(UNAVAILABLE|CANCELLED): ")


if __name__ == "__main__":
    unittest.main(verbosity=2)
