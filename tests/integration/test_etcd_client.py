#!/usr/bin/python3
"""familyd's etcd client (daemon/coord/) against a real etcd, through tests/probes/coord-probe.

Each test starts its own etcd on free loopback ports (etcd_harness.py). The probe prints one
line per result or watch event; its log (stderr) is checked for the one line each refusal and
each edge of an outage must give, and for nothing more.
"""

import json
import os
import signal
import subprocess
import threading
import time
import unittest

import etcd_harness
from etcd_harness import EtcdCluster

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.normpath(os.path.join(HERE, "..", ".."))


def probe_bin():
    if os.environ.get("COORD_PROBE"):
        return os.environ["COORD_PROBE"]
    if os.environ.get("FAMILYD_BIN"):
        build = os.path.dirname(os.path.dirname(os.environ["FAMILYD_BIN"]))
        return os.path.join(build, "tests", "coord", "coord-probe")
    return os.path.join(SOURCE_ROOT, "build", "tests", "coord", "coord-probe")


def probe(*args, timeout=60, env=None):
    return subprocess.run([probe_bin()] + list(args), capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


class Background:
    """A long-running probe (watch, hold) whose stdout lines are collected as they come."""

    def __init__(self, *args, env=None):
        # Debug lines too: a failure then shows each call's gRPC status.
        self.proc = subprocess.Popen([probe_bin()] + list(args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, COORD_PROBE_DEBUG="1", **(env or {})))
        self.lines = []
        self.err_lines = []
        self.cond = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines)),
                        threading.Thread(target=self._read, args=(self.proc.stderr, self.err_lines))]
        for t in self.readers:
            t.start()

    def _read(self, f, into):
        for line in f:
            with self.cond:
                into.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError("timed out; stdout: %r stderr: %r"
                                         % (self.lines, self.err_lines))
                self.cond.wait(min(left, 0.2))
            return list(self.lines)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=30)
        for t in self.readers:
            t.join()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc


def put_revision(etcd, key, value):
    """Puts through etcdctl and returns the revision etcd gave the write."""
    out = etcd.etcdctl("-w", "json", "put", key, value)
    return int(json.loads(out)["header"]["revision"])


def delete_revision(etcd, key):
    out = etcd.etcdctl("-w", "json", "del", key)
    return int(json.loads(out)["header"]["revision"])


class TestEtcdClient(unittest.TestCase):
    def setUp(self):
        etcd_harness.require_etcd()
        self.etcd = EtcdCluster(1)
        self.etcd.start()
        self.bg = []

    def tearDown(self):
        for b in self.bg:
            if b.proc.poll() is None:
                b.proc.kill()
                b.stop()
        self.etcd.close()

    def background(self, *args):
        b = Background(*args)
        self.bg.append(b)
        return b

    def test_member_create_if_absent_and_read_back(self):
        ep = self.etcd.endpoint
        r = probe("put-member", ep, "/fd/c1/", "node-a", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^created \d+\n$")
        r = probe("put-member", ep, "/fd/c1/", "node-a", "5")
        self.assertEqual((r.returncode, r.stdout), (3, "exists\n"), r.stderr)
        r = probe("get-member", ep, "/fd/c1/", "node-a")
        self.assertEqual(r.returncode, 0, r.stderr)
        # The first record stays: rank 3, not the 5 of the refused second create.
        self.assertRegex(r.stdout, r"^member node-a rank=3 devices=1 ucx=32 mod_revision=\d+\n$")
        r = probe("get-member", ep, "/fd/c1/", "node-b")
        self.assertEqual((r.returncode, r.stdout), (2, "absent\n"))
        self.assertEqual(r.stderr, "")

    def test_bad_records_refused_with_one_log_line(self):
        ep = self.etcd.endpoint
        self.etcd.put("/fd/c1/members/junk", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01garbage")
        self.assertEqual(probe("put-member", ep, "/fd/c2/", "other", "0").returncode, 0)
        # A valid record of node "other", copied to a key that names another node.
        self.etcd.put("/fd/c1/members/impostor", self.etcd.get("/fd/c2/members/other"))
        for name in ("junk", "impostor"):
            r = probe("get-member", ep, "/fd/c1/", name)
            self.assertEqual((r.returncode, r.stdout), (4, "refused\n"), r.stderr)
            lines = r.stderr.splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn("/fd/c1/members/%s" % name, lines[0])
        # The watch refuses each once too, and reads the good one.
        w = self.background("watch", ep, "/fd/c1/")
        w.wait_for(lambda ls: any(l.startswith("reset ") for l in ls))
        self.assertEqual(probe("put-member", ep, "/fd/c1/", "good", "1").returncode, 0)
        w.wait_for(lambda ls: "member good rank=1" in ls)
        self.assertEqual(w.stop(), 0, w.err_lines)
        refusals = [l for l in w.err_lines if "Refusing" in l]
        self.assertEqual(len(refusals), 2, w.err_lines)
        self.assertTrue(any("/fd/c1/members/junk" in l for l in refusals))
        self.assertTrue(any("/fd/c1/members/impostor" in l for l in refusals))

    def test_lease_keeps_key_alive_and_it_vanishes_after_kill(self):
        ep = self.etcd.endpoint
        h = self.background("hold", ep, "/fd/c1/alive/node-a", "1000")
        line = h.wait_for(lambda ls: ls)[0]
        _, lease, ttl = line.split()
        ttl = int(ttl)
        # Asked for 1 s: the client asks for at least 2 s (etcd's own minimum with its default
        # timing), and etcd grants what it is asked.
        self.assertEqual(ttl, 2, line)
        self.assertNotEqual(int(lease), 0)
        time.sleep(3 * ttl)
        self.assertEqual(self.etcd.get("/fd/c1/alive/node-a"), b"1")
        h.stop(signal.SIGKILL)
        t0 = time.monotonic()
        while self.etcd.get("/fd/c1/alive/node-a") is not None:
            self.assertLess(time.monotonic() - t0, ttl + 2, "key outlived its holder")
            time.sleep(0.1)
        print("alive key gone %.2f s after SIGKILL (TTL %d s)" % (time.monotonic() - t0, ttl))

    def test_lease_recreated_when_etcd_lost_it(self):
        # Revoked behind the client's back: the next keep-alive answers TTL 0, the client
        # grants a new lease and puts its key again.
        h = self.background("hold", self.etcd.endpoint, "/fd/c1/alive/node-a", "2000")
        lease = int(h.wait_for(lambda ls: ls)[0].split()[1])
        self.etcd.etcdctl("lease", "revoke", "%x" % lease)
        t0 = time.monotonic()
        while True:
            out = json.loads(self.etcd.etcdctl("get", "/fd/c1/alive/node-a", "-w", "json"))
            new_lease = int(out["kvs"][0]["lease"]) if out.get("kvs") else lease
            if new_lease != lease:
                break
            self.assertLess(time.monotonic() - t0, 10, h.err_lines)
            time.sleep(0.1)
        self.assertNotEqual(new_lease, 0)
        self.assertEqual(self.etcd.get("/fd/c1/alive/node-a"), b"1")
        self.assertEqual(len([l for l in h.err_lines if "expired, granting a new one" in l]), 1,
                         h.err_lines)
        self.assertEqual(h.stop(), 0, h.err_lines)

    def test_lease_kept_through_an_outage(self):
        h = self.background("hold", self.etcd.endpoint, "/fd/c1/alive/node-a", "2000")
        h.wait_for(lambda ls: ls)
        member = self.etcd.members[0]
        before = len(h.err_lines)
        member.stop()
        time.sleep(4)  # longer than the TTL: etcd's new leader renews every lease it holds
        member.start()
        time.sleep(6)  # three TTLs on keep-alives alone
        self.assertEqual(self.etcd.get("/fd/c1/alive/node-a"), b"1")
        self.assertEqual(h.stop(), 0, h.err_lines)
        down = [l for l in h.err_lines[before:] if "etcd unreachable" in l]
        up = [l for l in h.err_lines[before:] if "etcd reachable again" in l]
        self.assertEqual((len(down), len(up)), (1, 1), h.err_lines)

    def test_watch_sees_puts_and_deletes_in_order(self):
        ep = self.etcd.endpoint
        w = self.background("watch", ep, "/fd/c1/")
        w.wait_for(lambda ls: any(l.startswith("reset ") for l in ls))
        expected = []
        expected.append("put /fd/c1/a %d" % put_revision(self.etcd, "/fd/c1/a", "1"))
        put_revision(self.etcd, "/fd/elsewhere", "x")  # outside the prefix: not seen
        expected.append("put /fd/c1/b %d" % put_revision(self.etcd, "/fd/c1/b", "2"))
        expected.append("delete /fd/c1/a %d" % delete_revision(self.etcd, "/fd/c1/a"))
        expected.append("put /fd/c1/b %d" % put_revision(self.etcd, "/fd/c1/b", "3"))
        lines = w.wait_for(lambda ls: len([l for l in ls if l.startswith(("put", "delete"))]) >= 4)
        self.assertEqual([l for l in lines if l.startswith(("put", "delete"))], expected)
        self.assertEqual(w.stop(), 0, w.err_lines)

    def test_watch_survives_etcd_restart_without_losing_events(self):
        ep = self.etcd.endpoint
        w = self.background("watch", ep, "/fd/c1/")
        w.wait_for(lambda ls: any(l.startswith("reset ") for l in ls))
        rev_a = put_revision(self.etcd, "/fd/c1/a", "1")
        w.wait_for(lambda ls: "put /fd/c1/a %d" % rev_a in ls)
        member = self.etcd.members[0]
        before = len(w.err_lines)
        member.stop()
        w.wait_for(lambda ls: "etcd down" in ls[ls.index("put /fd/c1/a %d" % rev_a):])
        time.sleep(1)
        member.start()
        # Written at once, before the client's reconnect (up to 2 s of backoff): a watch that
        # started "from now" would miss them.
        revs = [put_revision(self.etcd, "/fd/c1/b%d" % i, str(i)) for i in range(3)]
        lines = w.wait_for(lambda ls: "put /fd/c1/b2 %d" % revs[2] in ls)
        events = [l for l in lines if l.startswith(("put", "delete", "reset", "etcd"))]
        self.assertEqual(events[-6:], ["put /fd/c1/a %d" % rev_a, "etcd down", "etcd up"] +
                         ["put /fd/c1/b%d %d" % (i, revs[i]) for i in range(3)])
        self.assertEqual(len([l for l in lines if l.startswith("reset")]), 1, lines)
        self.assertEqual(w.stop(), 0, w.err_lines)
        # One line at each edge of the outage this test made.
        down = [l for l in w.err_lines[before:] if "etcd unreachable" in l]
        up = [l for l in w.err_lines[before:] if "etcd reachable again" in l]
        self.assertEqual((len(down), len(up)), (1, 1), w.err_lines)

    def test_bad_endpoints_refused(self):
        for ep in ("", "127.0.0.1", "127.0.0.1:", "host:port", ",".join(["127.0.0.1:1"] * 17)):
            r = probe("get-member", ep, "/fd/c1/", "x")
            self.assertEqual(r.returncode, 1, (ep, r.stdout, r.stderr))
            self.assertIn("Failed to make the etcd client", r.stderr)

    def test_unreachable_etcd_fails_the_call(self):
        port = etcd_harness.free_ports(1)[0]
        r = probe("get-member", "127.0.0.1:%d" % port, "/fd/c1/", "x")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("etcd unreachable", r.stderr)


class TestEtcdCluster(unittest.TestCase):
    def setUp(self):
        etcd_harness.require_etcd()
        self.etcd = EtcdCluster(3, fast_elections=True)
        self.etcd.start()
        self.bg = []

    def tearDown(self):
        for b in self.bg:
            if b.proc.poll() is None:
                b.proc.kill()
                b.stop()
        self.etcd.close()

    def test_failover_to_the_next_member(self):
        w = Background("watch", self.etcd.endpoints, "/fd/c1/")
        self.bg.append(w)
        h = Background("hold", self.etcd.endpoints, "/fd/c1/alive/n", "2000")
        self.bg.append(h)
        w.wait_for(lambda ls: any(l.startswith("reset ") for l in ls))
        h.wait_for(lambda ls: ls)
        # The first endpoint is where both clients went: stop it.
        self.etcd.members[0].stop()
        other = self.etcd.through(self.etcd.members[1:])
        revs = [put_revision(other, "/fd/c1/k%d" % i, str(i)) for i in range(3)]
        w.wait_for(lambda ls: "put /fd/c1/k2 %d" % revs[2] in ls)
        # The lease is kept alive through the other members: the key outlives several TTLs.
        time.sleep(6)
        self.assertEqual(other.get("/fd/c1/alive/n"), b"1")
        self.assertEqual(w.stop(), 0, w.err_lines)
        self.assertEqual(h.stop(), 0, h.err_lines)

    def test_compacted_revision_rereads_the_prefix(self):
        first = self.etcd.members[0]
        w = Background("watch", first.endpoint, "/fd/c1/")
        self.bg.append(w)
        w.wait_for(lambda ls: any(l.startswith("reset ") for l in ls))
        put_revision(self.etcd, "/fd/c1/a", "1")
        w.wait_for(lambda ls: any(l.startswith("put /fd/c1/a ") for l in ls))
        first.stop()
        other = self.etcd.through(self.etcd.members[1:])
        put_revision(other, "/fd/c1/b", "2")
        delete_revision(other, "/fd/c1/a")
        rev = put_revision(other, "/fd/c1/c", "3")
        other.etcdctl("compact", str(rev))
        first.start()
        lines = w.wait_for(lambda ls: len([l for l in ls if l.startswith("reset ")]) >= 2, 60)
        w.wait_for(lambda ls: ls[-1].startswith("put /fd/c1/c"))
        lines = w.lines
        last_reset = max(i for i, l in enumerate(lines) if l.startswith("reset "))
        self.assertEqual(sorted(l.split()[1] for l in lines[last_reset + 1:]),
                         ["/fd/c1/b", "/fd/c1/c"], lines)
        self.assertEqual(w.stop(), 0, w.err_lines)
        self.assertTrue(any("compacted" in l for l in w.err_lines), w.err_lines)


class TestEtcdTls(unittest.TestCase):
    """etcd serving https only and asking for client certificates (etcd_harness.Tls)."""

    def setUp(self):
        etcd_harness.require_etcd()
        self.etcd = EtcdCluster(1, tls=True)
        self.etcd.start()
        tls = self.etcd.tls
        self.env = {"COORD_PROBE_CA": tls.ca, "COORD_PROBE_CERT": tls.client_cert,
                    "COORD_PROBE_KEY": tls.client_key}

    def tearDown(self):
        self.etcd.close()

    def test_tls_with_a_client_certificate(self):
        ep = self.etcd.endpoint
        r = probe("put-member", ep, "/fd/c1/", "node-a", "0", env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        w = Background("watch", ep, "/fd/c1/", env=self.env)
        try:
            w.wait_for(lambda ls: "member node-a rank=0" in ls)
            rev = put_revision(self.etcd, "/fd/c1/x", "1")
            w.wait_for(lambda ls: "put /fd/c1/x %d" % rev in ls)
        finally:
            self.assertEqual(w.stop(), 0, w.err_lines)

    def test_refused_without_the_right_credentials(self):
        ep = self.etcd.endpoint
        for env in ({}, {"COORD_PROBE_CA": self.etcd.tls.ca}):
            r = probe("get-member", ep, "/fd/c1/", "x", env=env)
            self.assertEqual(r.returncode, 1, (env, r.stdout))
            self.assertIn("etcd unreachable", r.stderr)
        # A certificate without its key, or a pair without a CA: refused before any call.
        for env in ({"COORD_PROBE_CA": self.etcd.tls.ca, "COORD_PROBE_CERT": self.etcd.tls.client_cert},
                    {"COORD_PROBE_CERT": self.etcd.tls.client_cert,
                     "COORD_PROBE_KEY": self.etcd.tls.client_key}):
            r = probe("get-member", ep, "/fd/c1/", "x", env=env)
            self.assertEqual(r.returncode, 1, (env, r.stdout))
            self.assertIn("Failed to make the etcd client", r.stderr)
        # A CA file that is no PEM: named in the log.
        bogus = os.path.join(self.etcd.tmpdir, "bogus.pem")
        with open(bogus, "w") as f:
            f.write("not a certificate\n")
        r = probe("get-member", ep, "/fd/c1/", "x", env=dict(self.env, COORD_PROBE_CA=bogus))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("%s holds no PEM block" % bogus, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
