#!/usr/bin/python3
"""GET /metrics from a running familyd (--metrics-listen): formats, names, and exact counts.

A scripted workload (Resolves, one that fails, a materialising Build and its release, a Reload
that succeeds and one that fails) between two scrapes: every counter moves by exactly what the
workload did. `promtool check metrics` (Debian's prometheus) passes on the Prometheus text; the
OpenMetrics reply, asked for by Accept as Prometheus asks, is checked on its own (content
type, counter families without _total and samples with it, # EOF last). Only GET of /metrics
and / is served. Without --metrics-listen nothing listens on TCP; a bad address or a port in
use stops the start with a sentence.

The shard socket's counters move by exactly what a client did through it (shard_client.py, as a
trainer maps shards): replies that carried descriptors and the descriptors they carried, not
the replies without; connections open while the client holds them, back to 0 once it closed;
one over the per-uid cap refused. Materialised bytes are counted by device kind (host here,
cuda on the fake CUDA driver) and the fills' time moves with them.
"""

import os
import re
import shutil
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
import test_metrics_common as M  # noqa: E402
from test_faults_common import SMALL, SMALL_BYTES  # noqa: E402

RESOLVE = "familyd.v1.FamilyService/Resolve"
BUILD = "familyd.v1.FamilyService/Build"
RELEASE = "familyd.v1.FamilyService/ReleaseBuild"
RELOAD = "familyd.v1.AdminService/Reload"
N_RESOLVES = 25
PER_UID = 16  # SHARD_SOCKET_MAX_CONNECTIONS_PER_UID
SHARD_GAUGE = "familyd_shard_socket_connections"
MATERIALIZED = "familyd_materialized_bytes_total"
FILL_SECONDS = "familyd_fill_seconds_total"


def wait_for_value(port, name, want, timeout=10.0, **labels):
    """Scrapes until name{labels} is want (the daemon sees a close a moment after it
    happens); the last samples."""
    deadline = time.monotonic() + timeout
    while True:
        samples = M.parse(M.scrape(port)[1])
        if M.value(samples, name, **labels) == want or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


class TestMetrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = H.short_tmpdir("fd-metrics-")
        cls.reg = os.path.join(cls.tmp, "registry")
        shutil.copytree(M.REGISTRY, cls.reg)
        cls.d = M.metrics_daemon(registry=cls.reg, tmpdir=cls.tmp,
                                 extra_args=["--build-grace-ms", "0"])
        cls.d.start()
        cls.port = cls.d.metrics_port

    @classmethod
    def tearDownClass(cls):
        try:
            cls.d.stop_checked()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def call(self, rpc, request=None, **kw):
        return self.d.client.call(rpc, request, **kw)

    def workload(self):
        """What the counters must show: Resolves, a failed one, a Build, a release, reloads."""
        for _ in range(N_RESOLVES):
            res = self.call(RESOLVE, family="grouped_experts")
            self.assertEqual(res.code, "OK", repr(res))
        res = self.call(RESOLVE, family="no_such_family")
        self.assertEqual(res.code, "NOT_FOUND", repr(res))
        res = self.call(BUILD, {"family": "grouped_experts", "config": SMALL,
                                "materialize": {"enabled": True}, "privateBuild": True})
        self.assertEqual(res.code, "OK", repr(res))
        self.built = res.reply.build
        self.assertEqual(self.call(RELEASE, build_id=self.built.build_id).code, "OK")
        self.assertEqual(self.call(RELOAD).code, "OK")
        # A broken file: the reload fails, the previous registry stays.
        broken = os.path.join(self.reg, "zz-broken.yaml")
        with open(broken, "w") as f:
            f.write("families: [\n")
        try:
            res = self.call(RELOAD)
            self.assertEqual(res.code, "FAILED_PRECONDITION", repr(res))
        finally:
            os.unlink(broken)

    def test_workload_counts_exactly(self):
        _, before_text = M.scrape(self.port)
        before = M.parse(before_text)
        t0 = time.time()
        self.workload()
        _, after_text = M.scrape(self.port)
        after = M.parse(after_text)

        def delta(name, **labels):
            return M.value(after, name, **labels) - M.value(before, name, **labels)

        calls, errors = "familyd_rpc_calls_total", "familyd_rpc_errors_total"
        self.assertEqual(delta(calls, method=RESOLVE, code="OK"), N_RESOLVES)
        self.assertEqual(delta(calls, method=RESOLVE, code="NOT_FOUND"), 1)
        self.assertEqual(delta(errors, method=RESOLVE, code="NOT_FOUND"), 1)
        self.assertEqual(delta(errors, method=RESOLVE, code="OK"), 0)
        self.assertEqual(delta(calls, method=BUILD, code="OK"), 1)
        self.assertEqual(delta(calls, method=RELEASE, code="OK"), 1)
        self.assertEqual(delta(calls, method=RELOAD, code="OK"), 1)
        self.assertEqual(delta(calls, method=RELOAD, code="FAILED_PRECONDITION"), 1)
        self.assertEqual(delta(errors, method=RELOAD, code="FAILED_PRECONDITION"), 1)
        # Every call of the workload and nothing else (no method moved that it did not call).
        moved = {k for k in after if k[0] == calls and after[k] != before.get(k, 0)}
        self.assertEqual({dict(k[1])["method"] for k in moved}, {RESOLVE, BUILD, RELEASE, RELOAD})
        # The latency histogram saw each Resolve once; its buckets are cumulative.
        hist = "familyd_rpc_duration_seconds"
        self.assertEqual(delta(hist + "_count", method=RESOLVE), N_RESOLVES + 1)
        self.assertEqual(delta(hist + "_bucket", method=RESOLVE, le="+Inf"), N_RESOLVES + 1)
        self.assertGreater(delta(hist + "_sum", method=RESOLVE), 0)
        bounds = sorted((float(dict(k[1])["le"]), v) for k, v in after.items()
                        if k[0] == hist + "_bucket" and dict(k[1])["method"] == RESOLVE)
        self.assertEqual([v for _, v in bounds], sorted(v for _, v in bounds))

        # The Build: one fill per rank, its bytes (host memory: this node has no GPU), the
        # time it took, and gone again after its release.
        self.assertEqual(delta(MATERIALIZED, device_kind="host"), SMALL_BYTES)
        self.assertEqual(delta(MATERIALIZED, device_kind="cuda"), 0)
        self.assertIn((MATERIALIZED, frozenset({("device_kind", "cuda")})), after)
        self.assertGreater(delta(FILL_SECONDS, device_kind="host"), 0)
        self.assertEqual(delta(FILL_SECONDS, device_kind="cuda"), 0)
        self.assertGreaterEqual(delta("familyd_fills_total"), 1)
        self.assertEqual(M.value(after, "familyd_builds"), 0)
        self.assertEqual(M.value(after, "familyd_shm_used_bytes"), 0)

        # Reloads: one of each; the last one failed, the generation moved once.
        self.assertEqual(delta("familyd_registry_reloads_total", result="ok"), 1)
        self.assertEqual(delta("familyd_registry_reloads_total", result="failed"), 1)
        self.assertEqual(delta("familyd_registry_generation"), 1)
        self.assertEqual(M.value(after, "familyd_registry_last_reload_success"), 0)
        self.assertGreaterEqual(M.value(after, "familyd_registry_last_reload_timestamp_seconds"),
                                t0 - 1)

    def test_gauges_agree_with_get_status(self):
        st = self.call("familyd.v1.AdminService/GetStatus").reply
        s = M.parse(M.scrape(self.port)[1])
        self.assertEqual(M.value(s, "familyd_shm_budget_bytes"), st.shm_budget_bytes)
        self.assertEqual(M.value(s, "familyd_builds"), st.builds)
        self.assertEqual(M.value(s, "familyd_meshes"), st.meshes)
        self.assertEqual(M.value(s, "familyd_topology_version"), st.topology_version)
        self.assertEqual(M.value(s, "familyd_registry_generation"), st.registry_generation)
        self.assertEqual(M.value(s, "familyd_registry_families"), st.families)
        self.assertEqual(M.value(s, "familyd_peers", state="up"), 0)
        self.assertEqual(M.value(s, "familyd_build_info", version=st.version), 1)
        start = M.value(s, "familyd_process_start_time_seconds")
        self.assertAlmostEqual(start, time.time() - st.uptime_ms / 1000.0, delta=5)

    def test_pinned_and_referenced_builds(self):
        # A shared (non-private) materialising Build is held by the calling process.
        res = self.call(BUILD, {"family": "grouped_experts", "config": SMALL,
                                "materialize": {"enabled": True}})
        self.assertEqual(res.code, "OK", repr(res))
        b = res.reply.build
        try:
            s = M.parse(M.scrape(self.port)[1])
            self.assertEqual(M.value(s, "familyd_builds"), 1)
            self.assertEqual(M.value(s, "familyd_builds_referenced"), 1)
            self.assertEqual(M.value(s, "familyd_shm_used_bytes"), SMALL_BYTES)
        finally:
            self.call(RELEASE, build_id=b.build_id)

    @unittest.skipUnless(M.promtool() or os.environ.get("CI"), "promtool (prometheus) missing")
    def test_promtool_check_metrics(self):
        self.workload_light()
        hdrs, text = M.scrape(self.port)
        self.assertEqual(hdrs["content-type"], M.TEXT)
        self.assertIsNotNone(M.promtool(), "promtool missing: deploy/dev/install-deps.sh --tests")
        rc, out = M.promtool_check(text)
        self.assertEqual((rc, out), (0, ""), "promtool check metrics:\n" + out)

    def workload_light(self):
        """Some series in every family: a call of each code path the checks read."""
        self.call(RESOLVE, family="grouped_experts")
        self.call(RESOLVE, family="no_such_family")

    def test_openmetrics(self):
        self.workload_light()
        hdrs, text = M.scrape(self.port, openmetrics=True)
        self.assertEqual(hdrs["content-type"], M.OPENMETRICS)
        self.assertTrue(text.endswith("# EOF\n"), text[-100:])
        self.assertEqual(text.count("# EOF"), 1)
        families = {}
        for line in text.splitlines():
            m = re.match(r"# TYPE (\S+) (\S+)$", line)
            if m:
                # One family per name: a counter's family drops _total, so a gauge "x" and a
                # counter "x_total" would be one family declared twice.
                self.assertNotIn(m.group(1), families, line)
                families[m.group(1)] = m.group(2)
        self.assertEqual(families["familyd_rpc_calls"], "counter")
        self.assertNotIn("familyd_rpc_calls_total", families)
        self.assertEqual(families["familyd_rpc_duration_seconds"], "histogram")
        self.assertEqual(families["familyd_build"], "info")
        samples = M.parse(text)
        for name, _ in samples:
            base = re.sub(r"_(total|bucket|sum|count|info)$", "", name)
            self.assertTrue(name in families or base in families,
                            "sample %s of no declared family" % name)
            if families.get(base) == "counter" or families.get(name) == "counter":
                self.assertTrue(name.endswith("_total"), name)
        self.assertGreaterEqual(M.value(samples, "familyd_rpc_calls_total", method=RESOLVE,
                                        code="OK"), 1)
        # The same numbers as the text format (what no call moved in between).
        plain = M.parse(M.scrape(self.port)[1])
        self.assertEqual(M.value(plain, "familyd_shm_budget_bytes"),
                         M.value(samples, "familyd_shm_budget_bytes"))

    def test_names_and_labels_bounded(self):
        self.workload_light()
        text = M.scrape(self.port)[1]
        for line in text.splitlines():
            if line.startswith("# TYPE"):
                _, _, name, kind = line.split()
                self.assertTrue(name.startswith("familyd_"), name)
                self.assertEqual(kind == "counter", name.endswith("_total"), line)
        labels = {k for key in M.parse(text) for k, _ in key[1]}
        self.assertLessEqual(labels, {"method", "code", "le", "device", "device_kind", "state",
                                      "result", "version", "resource"})
        self.assertNotIn("bld-", text)
        self.assertNotIn("pid", text)

    def test_shard_socket_handouts(self):
        res = self.call(BUILD, {"family": "grouped_experts", "config": SMALL,
                                "materialize": {"enabled": True}, "privateBuild": True})
        self.assertEqual(res.code, "OK", repr(res))
        b = res.reply.build
        self.addCleanup(self.call, RELEASE, build_id=b.build_id)
        tokens = [s.token for s in b.shards if s.token]
        self.assertTrue(tokens, repr(b))
        before = wait_for_value(self.port, SHARD_GAUGE, 0)
        self.assertEqual(M.value(before, SHARD_GAUGE), 0)

        def delta(samples, name):
            return M.value(samples, name) - M.value(before, name)

        with SC.ShardClient(b.shard_socket, self.d.protos) as sc:
            # Two replies with descriptors: every token twice, then the first alone.
            for ask in (tokens + tokens, tokens[:1]):
                reply, fds = sc.request(ask)
                for fd in fds:
                    os.close(fd)
                self.assertEqual(reply.code, 0, reply.message)
                self.assertEqual(len(fds), len(ask))
            # A reply without descriptors: an unknown token is NOT_FOUND, and no handout.
            reply, fds = sc.request(["no-such-token"])
            self.assertNotEqual(reply.code, 0)
            self.assertEqual(fds, [])
            held = M.parse(M.scrape(self.port)[1])
            self.assertEqual(M.value(held, SHARD_GAUGE), 1)
            self.assertEqual(delta(held, "familyd_shard_socket_connections_accepted_total"), 1)
            self.assertEqual(delta(held, "familyd_shard_handouts_total"), 2)
            self.assertEqual(delta(held, "familyd_shard_descriptors_total"),
                             2 * len(tokens) + 1)
        after = wait_for_value(self.port, SHARD_GAUGE, 0)
        self.assertEqual(M.value(after, SHARD_GAUGE), 0)
        self.assertEqual(delta(after, "familyd_shard_socket_connections_accepted_total"), 1)
        self.assertEqual(delta(after, "familyd_shard_socket_connections_refused_total"), 0)
        self.assertEqual(delta(after, "familyd_shard_handouts_total"), 2)
        self.assertEqual(delta(after, "familyd_shard_descriptors_total"), 2 * len(tokens) + 1)

    def test_shard_socket_refusals(self):
        """One connection over the per-uid cap is closed at accept, and counted as refused."""
        before = wait_for_value(self.port, SHARD_GAUGE, 0)
        self.assertEqual(M.value(before, SHARD_GAUGE), 0)
        clients = []
        try:
            for _ in range(PER_UID):
                sc = SC.ShardClient(self.d.shard_socket, self.d.protos)
                clients.append(sc)
                # Answered: accepted and served (a reply without descriptors).
                reply, fds = sc.request(["no-such-token"])
                self.assertNotEqual(reply.code, 0)
                self.assertEqual(fds, [])
            over = SC.ShardClient(self.d.shard_socket, self.d.protos)
            clients.append(over)
            over.sock.settimeout(5)
            self.assertEqual(over.sock.recv(1), b"")
            held = M.parse(M.scrape(self.port)[1])
            self.assertEqual(M.value(held, SHARD_GAUGE), PER_UID)
            for name, want in (("familyd_shard_socket_connections_refused_total", 1),
                               ("familyd_shard_socket_connections_accepted_total", PER_UID)):
                self.assertEqual(M.value(held, name) - M.value(before, name), want, name)
        finally:
            for sc in clients:
                sc.close()
        after = wait_for_value(self.port, SHARD_GAUGE, 0)
        self.assertEqual(M.value(after, SHARD_GAUGE), 0)
        self.assertEqual(M.value(after, "familyd_shard_handouts_total"),
                         M.value(before, "familyd_shard_handouts_total"))

    def test_unknown_method(self):
        before = M.parse(M.scrape(self.port)[1])
        res = self.d.client.raw_call("/no.such.Service/Method", b"")
        self.assertEqual(res.code, "UNIMPLEMENTED", repr(res))
        after = M.parse(M.scrape(self.port)[1])
        key = ("familyd_rpc_calls_total", frozenset({("method", "unknown"),
                                                     ("code", "UNIMPLEMENTED")}))
        self.assertEqual(after.get(key, 0) - before.get(key, 0), 1)
        self.assertNotIn("no.such.Service", M.scrape(self.port)[1])

    def test_only_get_of_metrics_and_index(self):
        status, hdrs, body = M.http_get(self.port, "/")
        self.assertEqual(status, 200)
        self.assertIn('href="/metrics"', body)
        for method in ("POST", "PUT", "DELETE", "HEAD", "OPTIONS"):
            status, hdrs, _ = M.http_get(self.port, "/metrics", method=method,
                                         body=b"x" if method in ("POST", "PUT") else None)
            self.assertEqual(status, 405, method)
            self.assertEqual(hdrs.get("allow"), "GET", method)
        for path in ("/metrics/", "/metric", "/../../etc/passwd", "/metrics/../etc/passwd",
                     "/%2e%2e/etc/passwd", "/index.html"):
            status, _, body = M.http_get(self.port, path)
            self.assertEqual(status, 404, path)
            self.assertNotIn("root:", body)
        # A query string does not change what is served.
        status, _, body = M.http_get(self.port, "/metrics?x=1")
        self.assertEqual(status, 200)
        self.assertIn("familyd_build_info", body)


class TestGpus(unittest.TestCase):
    """Per-GPU budget and use, on the tests' fake CUDA driver (two GPUs)."""

    def test_gpu_memory(self):
        fake = os.environ.get("FAKE_LIBCUDA") or H._default_build_file(
            "tests", "fake-cuda", "libfake-libcuda.so")
        if not os.path.exists(fake):
            self.skipTest("the fake libcuda was not built")
        saved = {k: os.environ.get(k) for k in ("FAMILYD_CUDA_DRIVER", "FAKE_CUDA_DEVICES")}
        os.environ.update({"FAMILYD_CUDA_DRIVER": fake, "FAKE_CUDA_DEVICES": "2"})
        d = M.metrics_daemon(extra_args=["--build-grace-ms", "0"])
        d.host_devices = None
        try:
            d.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            s0 = s = M.parse(M.scrape(d.metrics_port)[1])
            budget = {dict(k[1])["device"]: v for k, v in s.items()
                      if k[0] == "familyd_gpu_memory_budget_bytes"}
            self.assertEqual(sorted(budget), ["cuda:0", "cuda:1"])
            self.assertTrue(all(v > 0 for v in budget.values()), budget)
            res = d.client.call(BUILD, {"family": "grouped_experts", "config": SMALL,
                                        "materialize": {"enabled": True},
                                        "privateBuild": True})
            self.assertEqual(res.code, "OK", repr(res))
            b = res.reply.build
            on = {}
            for sh in b.shards:
                if sh.device_kind == "cuda":
                    key = "cuda:%d" % sh.local_device
                    on[key] = on.get(key, 0) + sh.allocation_bytes
            self.assertTrue(on, "no shard on a GPU: %s" % b)
            s = M.parse(M.scrape(d.metrics_port)[1])
            # Materialised bytes by the kind of device that holds them: the ranks' sizes.
            for kind in ("host", "cuda"):
                want = sum(sh.size_bytes for sh in b.shards if sh.device_kind == kind)
                self.assertEqual(M.value(s, MATERIALIZED, device_kind=kind) -
                                 M.value(s0, MATERIALIZED, device_kind=kind), want, kind)
            self.assertEqual(sum(M.value(s, MATERIALIZED, device_kind=k) for k in
                                 ("host", "cuda")), SMALL_BYTES)
            self.assertGreater(M.value(s, FILL_SECONDS, device_kind="cuda"), 0)
            for dev in budget:
                self.assertEqual(M.value(s, "familyd_gpu_memory_used_bytes", device=dev),
                                 on.get(dev, 0), dev)
            self.assertEqual(d.client.call(RELEASE, build_id=b.build_id).code, "OK")
            s = M.parse(M.scrape(d.metrics_port)[1])
            for dev in budget:
                self.assertEqual(M.value(s, "familyd_gpu_memory_used_bytes", device=dev), 0)
            d.stop_checked()
        finally:
            d.cleanup()


class TestListen(unittest.TestCase):
    def test_off_by_default(self):
        with H.Daemon(registry=M.REGISTRY) as d:
            self.assertEqual(M.tcp_listen_ports(d.proc.pid), set())

    def test_binds_only_the_address(self):
        d = M.metrics_daemon()
        with d:
            self.assertEqual(M.tcp_listen_ports(d.proc.pid), {d.metrics_port})
            with open("/proc/net/tcp") as f:
                rows = [r.split() for r in f.read().splitlines()[1:]]
            local = {r[1] for r in rows if r[3] == "0A"}
            self.assertIn("0100007F:%04X" % d.metrics_port, local)   # 127.0.0.1, not 0.0.0.0
            self.assertNotIn("00000000:%04X" % d.metrics_port, local)

    def test_ipv6_loopback(self):
        if not socket.has_ipv6:
            self.skipTest("no IPv6")
        port = H.free_port()
        try:
            with socket.socket(socket.AF_INET6) as s:
                s.bind(("::1", 0))
        except OSError:
            self.skipTest("no ::1")
        with H.Daemon(registry=M.REGISTRY,
                      extra_args=["--metrics-listen", "[::1]:%d" % port]) as d:
            self.assertEqual(M.tcp_listen_ports(d.proc.pid), {port})
            import http.client
            c = http.client.HTTPConnection("::1", port, timeout=10)
            c.request("GET", "/metrics")
            self.assertEqual(c.getresponse().status, 200)
            c.close()

    def test_bad_address_stops_the_start(self):
        for addr, words in (("127.0.0.1", "not ADDR:PORT"), ("127.0.0.1:", "not ADDR:PORT"),
                            ("no.such.host.invalid:9464", "--metrics-listen"),
                            ("127.0.0.1:http", "--metrics-listen")):
            d = H.Daemon(registry=M.REGISTRY, extra_args=["--metrics-listen", addr])
            try:
                d.spawn()
                rc = d.proc.wait(H.START_TIMEOUT)
                self.assertEqual(rc, 1, addr)
                self.assertIn(words, d.stderr(), addr)
                self.assertFalse(os.path.exists(d.socket), "API socket left behind")
            finally:
                d.cleanup()

    def test_port_in_use_stops_the_start(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            port = s.getsockname()[1]
            d = H.Daemon(registry=M.REGISTRY,
                         extra_args=["--metrics-listen", "127.0.0.1:%d" % port])
            try:
                d.spawn()
                self.assertEqual(d.proc.wait(H.START_TIMEOUT), 1)
                self.assertIn("Failed to bind the metrics address 127.0.0.1:%d: Address "
                              "already in use" % port, d.stderr())
            finally:
                d.cleanup()

    def test_config_key(self):
        port = H.free_port()
        tmp = H.short_tmpdir("fd-metrics-conf-")
        try:
            conf = os.path.join(tmp, "familyd.conf")
            with open(conf, "w") as f:
                f.write("metrics-listen = 127.0.0.1:%d\n" % port)
            with H.Daemon(registry=M.REGISTRY, tmpdir=tmp, extra_args=["--config", conf]) as d:
                status, _, body = M.http_get(port)
                self.assertEqual(status, 200)
                self.assertIn("familyd_rpc_calls_total", body)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
