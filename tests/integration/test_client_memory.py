#!/usr/bin/python3
"""No client holds the daemon's memory (docs/security.md): queued replies and connection caps.

Measured before the fix: a raw HTTP/2 client with a zero flow-control window, 6 connections
of 127 ListBuilds each, made the daemon keep every reply (+2.1 GB, not returned after the
client left); 4 processes of 64 connections each holding a WatchTopology left every other
client with "Socket closed".

- Zero window: the same client (python3-h2, SETTINGS_INITIAL_WINDOW_SIZE 0, never a
  WINDOW_UPDATE, 6 connections x 24 ListBuilds of a ~2 MB reply) against a daemon with
  --max-queued-bytes-per-connection 4 MiB and --max-queued-bytes 16 MiB: the calls past a
  bound are answered RESOURCE_EXHAUSTED QUEUE_LIMIT with the sentences of docs/semantics.md;
  the daemon's RSS grows by less than 128 MiB (RSS_BOUND: the 16 MiB of queued replies plus the
  replies built and refused meanwhile); other clients are served meanwhile (Health, GetTopology) or
  refused with the sentence (ListBuilds while the total is full); once the client disconnects
  the RSS is back within 32 MiB of where it started and ListBuilds is served again.
- Never reading: the opposite client (every window opened to 2^31-1, its socket never read),
  which got a reply's bytes framed into gRPC's buffers and every refusal's trailers stuck
  behind them: the same bounds hold (the daemon counts a reply's bytes until gRPC frees them,
  and drops a call's request and reply tree as soon as its answer is packed).
- With the default bounds the largest ListBuilds reply (just under 4 MiB) is served.
- Caps: processes holding WatchTopology streams on connections of their own: a process's
  watches past --max-watches-per-process (default 8) get RESOURCE_EXHAUSTED WATCH_LIMIT; a
  uid's connections past --max-connections-per-uid (default half of --max-connections) get
  their first call answered RESOURCE_EXHAUSTED CONNECTION_LIMIT with the sentence (grpcio's
  status and text, and the ErrorInfo reason), and then the connection is closed once the client
  has read the answer (a raw HTTP/2 client that waits can still write, then sees the trailers,
  then EOF); another uid's process (setpriv) is served meanwhile.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.parse

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
MiB = 1 << 20
# What the daemon's RSS may grow by while the zero-window client holds its replies: the 16 MiB
# of queued replies, and the replies built and refused meanwhile (two workers' reply trees,
# and the allocator's fragments of them: +68 to +91 MiB measured with -O2, glibc). Without
# the bounds the same client, at 48 calls a connection, grew it by more than 330 MiB in a minute.
RSS_BOUND = 128 * MiB
# What may stay above the starting RSS once the client has gone: -18 to +13 MiB measured with
# -O2 (glibc, the heap trimmed when the queue empties; +29 to +44 MiB without the trim), +12 to
# +20 MiB under ASan with an 8 MiB quarantine. The bug kept gigabytes.
RSS_RETURNED = 32 * MiB
LIST_BUILDS = "/familyd.v1.FamilyService/ListBuilds"
HEALTH = "/grpc.health.v1.Health/Check"
WATCH_TOPOLOGY = "/familyd.v1.MeshService/WatchTopology"
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"  # a gRPC frame: not compressed, 0 bytes
# The measured attack was 6 x 127 calls; 24 a connection keep the test short (each reply is
# built, ~0.1 s under the sanitizers) and still ask for 288 MB of ~2 MB replies.
N_CONNECTIONS = 6
N_CALLS = 24

PER_CONN_SENTENCE = (r"^reply queue full: (\d+) bytes of replies wait for this connection to "
                     r"read them, the limit is 4194304 bytes "
                     r"\(--max-queued-bytes-per-connection\)$")
TOTAL_SENTENCE = (r"^reply queue full: (\d+) bytes of replies wait for clients to read them, "
                  r"the limit is 16777216 bytes \(--max-queued-bytes\)$")


def sanitizer_returns_memory(test):
    """Under ASan, the daemon started next keeps little freed memory: the quarantine keeps up
    to 256 MiB by default and free pages go back only on request, which would measure the
    churn of refused replies, not what the daemon holds."""
    asan = os.environ.get("ASAN_OPTIONS", "")
    os.environ["ASAN_OPTIONS"] = ((asan + ":" if asan else "") + "quarantine_size_mb=8:"
                                  "allocator_release_to_os_interval_ms=100")
    test.addCleanup(os.environ.__setitem__, "ASAN_OPTIONS", asan)


def wide_registry(tmp, n_params):
    """One family whose build reply grows with n_params (n elements over 4096 devices)."""
    reg = os.path.join(tmp, "registry")
    os.makedirs(reg, exist_ok=True)
    lines = ["name: wide", "baseline: itest.wide.Wide", "default_variant: v", "variants:",
             "  v: {constructor: itest.wide.V, accepts: [config]}", "parameters:"]
    for i in range(n_params):
        lines.append("  p%02d: {shape: [n], placements: {ep: shard(0)}}" % i)
    with open(os.path.join(reg, "wide.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return reg


def make_builds(client, n_builds):
    mesh = client.call("familyd.v1.MeshService/CreateMesh",
                       {"mesh": {"deviceMesh": [{"name": "ep", "size": 4096}]}})
    assert mesh.ok, mesh
    req = {"family": "wide", "config": {"fields": {"n": {"intValue": 8192}}},
           "meshId": mesh.reply.mesh_id}
    for _ in range(n_builds):
        r = client.call("familyd.v1.FamilyService/Build", req, timeout=120)
        assert r.ok, r


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class H2Client:
    """A raw HTTP/2 connection that never opens its flow-control window (python3-h2).

    It reads what the daemon sends (so it sees headers, trailers, pings and GOAWAY) but never
    sends WINDOW_UPDATE, and its SETTINGS_INITIAL_WINDOW_SIZE is 0: no reply byte can leave
    the daemon. With wide=True it does the opposite: it opens every window to 2^31-1 and then
    never reads its socket, so gRPC frames the replies and finds the socket full."""

    def __init__(self, path, wide=False):
        import h2.config
        import h2.connection
        import h2.settings
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if wide:
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
            self.conn.increment_flow_control_window(2**31 - 1 - 65535)
        else:
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        self.sock.sendall(self.conn.data_to_send())
        self.ended = {}   # stream id -> (grpc-status, grpc-message)
        self.started = []
        self.eof = False
        self.write_closed = False
        self.lock = threading.Lock()

    def call(self, path, payload=EMPTY_MESSAGE):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"),
                                     (":path", path), (":authority", "localhost"),
                                     ("content-type", "application/grpc"), ("te", "trailers")])
        self.conn.send_data(sid, payload, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        self.started.append(sid)
        return sid

    def pump(self, seconds):
        """Reads and answers (SETTINGS and PING acks) for up to seconds, or until EOF."""
        import h2.events
        self.sock.settimeout(0.1)
        deadline = time.monotonic() + seconds
        while not self.eof and time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            for ev in self.conn.receive_data(data):
                headers = getattr(ev, "headers", None)
                if isinstance(ev, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    h = dict(headers)
                    if "grpc-status" in h:
                        with self.lock:
                            self.ended[ev.stream_id] = (
                                int(h["grpc-status"]),
                                urllib.parse.unquote(h.get("grpc-message", "")))
            out = self.conn.data_to_send()
            if out and not self.write_closed:
                # The daemon reads late while its workers build replies: wait for it.
                self.sock.settimeout(120)
                try:
                    self.sock.sendall(out)
                except OSError:
                    # The daemon stopped reading (a refused connection): what it sent is
                    # still there to read, up to EOF.
                    self.write_closed = True
                self.sock.settimeout(0.1)

    def ping(self):
        """Sends a PING: False when the daemon no longer reads this connection."""
        self.conn.ping(b"familyd!")
        try:
            self.sock.sendall(self.conn.data_to_send())
        except OSError:
            return False
        return True

    def close(self):
        self.sock.close()


class TestZeroWindowClient(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-mem-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_queued_replies_are_bounded_and_returned(self):
        sanitizer_returns_memory(self)
        reg = wide_registry(self.tmp, 25)
        args = ["--max-queued-bytes-per-connection", str(4 * MiB),
                "--max-queued-bytes", str(16 * MiB)]
        with H.Daemon(registry=reg, tmpdir=self.tmp, host_devices=4096, extra_args=args) as d:
            c = d.client
            make_builds(c, 1)
            first = c.call(LIST_BUILDS[1:], {}, timeout=60)
            self.assertTrue(first.ok, first)
            size = first.reply.ByteSize()
            self.assertGreater(size, MiB)
            # Warm: gRPC's and the allocator's own first use is not what this test measures.
            for _ in range(3):
                self.assertTrue(c.call(LIST_BUILDS[1:], {}, timeout=60).ok)
            rss0 = H.rss(d.proc.pid)

            clients = [H2Client(d.socket) for _ in range(N_CONNECTIONS)]
            n_calls = N_CONNECTIONS * N_CALLS
            peak = rss0
            try:
                for cl in clients:
                    for _ in range(N_CALLS):
                        cl.call(LIST_BUILDS)
                # Until every call is answered but what the bounds let wait unsent.
                deadline = time.monotonic() + 240
                last, stable_since = -1, time.monotonic()
                while time.monotonic() < deadline:
                    for cl in clients:
                        cl.pump(0.2)
                    peak = max(peak, H.rss(d.proc.pid))
                    n = sum(len(cl.ended) for cl in clients)
                    if n != last:
                        last, stable_since = n, time.monotonic()
                    if n >= n_calls - (16 * MiB) // size or time.monotonic() - stable_since > 10:
                        break
                for cl in clients:
                    cl.pump(1.0)
                peak = max(peak, H.rss(d.proc.pid))
                ended = [st for cl in clients for st in cl.ended.values()]
                held = n_calls - len(ended)
                self.assertLessEqual(held, (16 * MiB) // size, "held %d replies" % held)
                self.assertGreaterEqual(held, 1)
                for cl in clients:
                    self.assertLessEqual(N_CALLS - len(cl.ended), (4 * MiB) // size)
                self.assertTrue(all(code == 8 for code, _ in ended), ended[:5])
                per_conn = [m for _, m in ended if re.match(PER_CONN_SENTENCE, m)]
                total = [m for _, m in ended if re.match(TOTAL_SENTENCE, m)]
                self.assertEqual(len(per_conn) + len(total), len(ended),
                                 [m for _, m in ended][:5])
                self.assertTrue(per_conn and total, (len(per_conn), len(total)))
                self.assertLess(peak - rss0, RSS_BOUND,
                                "RSS grew by %.1f MiB" % ((peak - rss0) / MiB))

                # Others are served meanwhile, or refused with the sentence.
                self.assertTrue(c.health().ok)
                topo = c.call("familyd.v1.MeshService/GetTopology", {})
                self.assertTrue(topo.ok, topo)
                lb = c.call(LIST_BUILDS[1:], {}, timeout=60)
                self.assertEqual(lb.code, "RESOURCE_EXHAUSTED", lb)
                self.assertRegex(lb.message, TOTAL_SENTENCE)
                _, infos = c.error_details(lb)
                self.assertEqual([i.reason for i in infos], ["QUEUE_LIMIT"])
            finally:
                for cl in clients:
                    cl.close()

            # Gone: the replies' memory goes back, and the queue is free again.
            deadline = time.monotonic() + 30
            while H.rss(d.proc.pid) - rss0 >= RSS_RETURNED and time.monotonic() < deadline:
                time.sleep(0.2)
            after = H.rss(d.proc.pid)
            sys.stderr.write("RSS: start %.1f MiB, peak +%.1f MiB, after the client left +%.1f "
                             "MiB\n" % (rss0 / MiB, (peak - rss0) / MiB, (after - rss0) / MiB))
            self.assertLess(after - rss0, RSS_RETURNED,
                            "RSS %.1f MiB above the start after the client left (peak +%.1f)"
                            % ((after - rss0) / MiB, (peak - rss0) / MiB))
            deadline = time.monotonic() + 30
            while True:
                lb = c.call(LIST_BUILDS[1:], {}, timeout=60)
                if lb.ok or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            self.assertTrue(lb.ok, lb)

    def test_a_client_that_never_reads_holds_no_more(self):
        sanitizer_returns_memory(self)
        reg = wide_registry(self.tmp, 25)
        args = ["--max-queued-bytes-per-connection", str(4 * MiB),
                "--max-queued-bytes", str(16 * MiB)]
        with H.Daemon(registry=reg, tmpdir=self.tmp, host_devices=4096, extra_args=args) as d:
            c = d.client
            make_builds(c, 1)
            for _ in range(4):
                self.assertTrue(c.call(LIST_BUILDS[1:], {}, timeout=60).ok)
            rss0 = H.rss(d.proc.pid)
            # Wide windows, and not a byte read: the replies and then every refusal's
            # trailers stay unwritten while the daemon answers all the calls.
            clients = [H2Client(d.socket, wide=True) for _ in range(N_CONNECTIONS)]
            peak = rss0
            try:
                for cl in clients:
                    for _ in range(N_CALLS):
                        cl.call(LIST_BUILDS)
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline:
                    t0 = cpu_seconds(d.proc.pid)
                    time.sleep(1.0)
                    peak = max(peak, H.rss(d.proc.pid))
                    if cpu_seconds(d.proc.pid) - t0 < 0.05:
                        break
                self.assertLess(peak - rss0, RSS_BOUND,
                                "RSS grew by %.1f MiB" % ((peak - rss0) / MiB))
                self.assertTrue(c.health().ok)
                lb = c.call(LIST_BUILDS[1:], {}, timeout=60)
                self.assertEqual(lb.code, "RESOURCE_EXHAUSTED", lb)
                self.assertRegex(lb.message, TOTAL_SENTENCE)
            finally:
                for cl in clients:
                    cl.close()
            deadline = time.monotonic() + 30
            while H.rss(d.proc.pid) - rss0 >= RSS_RETURNED and time.monotonic() < deadline:
                time.sleep(0.2)
            after = H.rss(d.proc.pid)
            sys.stderr.write("RSS (never read): start %.1f MiB, peak +%.1f MiB, after the "
                             "client left +%.1f MiB\n"
                             % (rss0 / MiB, (peak - rss0) / MiB, (after - rss0) / MiB))
            self.assertLess(after - rss0, RSS_RETURNED)
            deadline = time.monotonic() + 30
            while True:
                lb = c.call(LIST_BUILDS[1:], {}, timeout=60)
                if lb.ok or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            self.assertTrue(lb.ok, lb)

    def test_the_largest_list_builds_reply_passes_the_default_bounds(self):
        reg = wide_registry(self.tmp, 25)
        with H.Daemon(registry=reg, tmpdir=self.tmp, host_devices=4096) as d:
            make_builds(d.client, 2)
            r = d.client.call(LIST_BUILDS[1:], {}, timeout=60)
            self.assertTrue(r.ok, r)
            self.assertGreater(r.reply.ByteSize(), 2 * MiB)


# A process holding n connections, each with a WatchTopology (or a Health check when asked):
# prints one JSON line per connection, then waits for stdin to close.
HOLDER = r"""
import json, sys, grpc
path, n, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opts = [("grpc.use_local_subchannel_pool", 1)]
chans, calls, out = [], [], []
for i in range(n):
    ch = grpc.insecure_channel("unix:" + path, options=opts)
    grpc.channel_ready_future(ch).result(timeout=30)
    chans.append(ch)
for ch in chans:
    try:
        if what == "watch":
            it = ch.unary_stream("/familyd.v1.MeshService/WatchTopology")(b"", timeout=600)
            calls.append(it)
            next(it)
        else:
            ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=30)
        out.append({"code": "OK"})
    except grpc.RpcError as e:
        reason = ""
        for k, v in e.trailing_metadata() or ():
            if k == "grpc-status-details-bin":
                reason = "CONNECTION_LIMIT" if b"CONNECTION_LIMIT" in v else (
                    "WATCH_LIMIT" if b"WATCH_LIMIT" in v else "?")
        out.append({"code": e.code().name, "message": e.details(), "reason": reason})
print(json.dumps(out), flush=True)
sys.stdin.read()
"""


class Holder:
    def __init__(self, path, n, what="watch", uid=None):
        # The script is inline: another uid needs only to run the interpreter.
        argv = [other_uid.other_uid_python(), "-c", HOLDER, path, str(n), what]
        if uid is not None:
            argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups"] + argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd="/")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("holder %d died" % self.proc.pid)
        self.results = json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc.stdout.close()


class TestCaps(unittest.TestCase):
    """--max-connections 24 --max-connections-per-process 10: the uid cap defaults to 12."""

    def setUp(self):
        self.tmp = H.short_tmpdir("fd-caps-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        os.chmod(self.tmp, 0o755)
        self.d = H.Daemon(registry=REGISTRY, tmpdir=self.tmp,
                          extra_args=["--max-connections", "24",
                                      "--max-connections-per-process", "10"])
        self.d.start()
        self.addCleanup(self.d.stop_checked)
        os.chmod(self.d.socket, 0o666)
        self.d.client.close()  # this process holds no connection

    def hold(self, n, what="watch", uid=None):
        h = Holder(self.d.socket, n, what, uid)
        self.addCleanup(h.close)
        return h

    def test_watches_per_process_and_connections_per_uid(self):
        a = self.hold(10)
        codes = [r["code"] for r in a.results]
        self.assertEqual(codes, ["OK"] * 8 + ["RESOURCE_EXHAUSTED"] * 2, a.results)
        for r in a.results[8:]:
            self.assertEqual(r["message"], "watch limit reached: process %d has 8 open watches "
                             "(--max-watches-per-process)" % a.proc.pid)
            self.assertEqual(r["reason"], "WATCH_LIMIT")

        # The uid has 10 of its 12: a second process gets 2, its other 8 are refused.
        b = self.hold(10)
        self.assertEqual([r["code"] for r in b.results],
                         ["OK"] * 2 + ["RESOURCE_EXHAUSTED"] * 8, b.results)
        for r in b.results[2:]:
            self.assertEqual(r["message"], "connection limit reached: uid 0 has 12 "
                             "connections open (--max-connections-per-uid)")
            self.assertEqual(r["reason"], "CONNECTION_LIMIT")

        # Another uid is served meanwhile.
        other = self.hold(3, uid=65534)
        self.assertEqual([r["code"] for r in other.results], ["OK"] * 3, other.results)

        # This uid, from a raw HTTP/2 client: the answer comes, then the connection closes.
        raw = H2Client(self.d.socket)
        self.addCleanup(raw.close)
        sid = raw.call(HEALTH)
        # The connection stays open until its client has read the answer: a client busy
        # elsewhere can still write (a SETTINGS ack, a PING) before it reads.
        time.sleep(0.5)
        self.assertTrue(raw.ping(), "the refused connection was shut before its answer was read")
        raw.pump(10)
        self.assertEqual(raw.ended.get(sid), (8, "connection limit reached: uid 0 has 12 "
                                                "connections open (--max-connections-per-uid)"),
                         "eof %s, ended %r\n%s" % (raw.eof, raw.ended, self.d.stderr()[-3000:]))
        self.assertTrue(raw.eof, "the refused connection stayed open")

        # A client that never reads is closed a second after the answer went out.
        idle = H2Client(self.d.socket)
        self.addCleanup(idle.close)
        sid = idle.call(HEALTH)
        time.sleep(3)
        self.assertFalse(idle.ping(), "a refused connection that is never read stayed open")
        idle.pump(10)
        self.assertEqual(idle.ended.get(sid, (None,))[0], 8, idle.ended)
        self.assertTrue(idle.eof)
        self.assertIn("--max-connections-per-uid", self.d.stderr())

        # The holders gone, the uid is served again.
        a.close()
        b.close()
        deadline = time.monotonic() + 30
        while True:
            h = Holder(self.d.socket, 1, "health")
            h.close()
            if h.results[0]["code"] == "OK" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(h.results[0]["code"], "OK", h.results)


if __name__ == "__main__":
    unittest.main(verbosity=2)
