#!/usr/bin/python3
"""Cluster credentials: --cluster-key, familyctl keygen, the authenticated handshake and its
refusals, key rotation with Reload and SIGHUP, and --listen off loopback without a key.

Real daemons on loopback (cluster_harness.Cluster, UCX over tcp on lo), real familyctl; the
daemons are judged only through gRPC (GetTopology, GetStatus) and their logs.
"""

import hashlib
import hmac
import os
import pwd
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from cluster_harness import Cluster, REGISTRY, free_port, new_key, write_key  # noqa: E402

DEVICES = 2


def wait_for(predicate, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


class StateRecorder:
    """Polls GetTopology on some daemons in a thread and keeps every node state it saw."""

    def __init__(self, cluster, among):
        self.cluster, self.among = cluster, among
        self.seen = set()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop_event.is_set():
            for i in self.among:
                try:
                    for n in self.cluster.topology(i).nodes:
                        self.seen.add((n.name, n.state))
                except Exception:
                    pass
            time.sleep(0.02)

    def close(self):
        self.stop_event.set()
        self.thread.join(5)
        return self.seen


class KeyDir:
    """A private folder for key files (mode 0700)."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="fd-keys-")
        os.chmod(self.path, 0o700)

    def file(self, name, *keys):
        return write_key(os.path.join(self.path, name), *keys)

    def cleanup(self):
        for f in os.listdir(self.path):
            os.unlink(os.path.join(self.path, f))
        os.rmdir(self.path)


class TestKeygen(unittest.TestCase):
    def setUp(self):
        self.ctl = H.familyctl_bin()
        if not self.ctl:
            self.skipTest("familyctl is not built")
        self.dir = KeyDir()

    def tearDown(self):
        self.dir.cleanup()

    def test_keygen_writes_a_private_key_and_never_overwrites(self):
        path = os.path.join(self.dir.path, "cluster.key")
        old_umask = os.umask(0)   # keygen must not rely on the caller's umask
        try:
            rc, out, _ = H.run_to_exit([self.ctl, "keygen", path], 10)
        finally:
            os.umask(old_umask)
        self.assertEqual(rc, 0, out)
        st = os.stat(path)
        self.assertEqual(st.st_mode & 0o7777, 0o600)
        with open(path) as f:
            text = f.read()
        keys = [l for l in text.splitlines() if l and not l.startswith("#")]
        self.assertEqual(len(keys), 1)
        self.assertRegex(keys[0], r"^[0-9a-f]{64}$")

        rc, out, _ = H.run_to_exit([self.ctl, "keygen", path], 10)
        self.assertEqual(rc, 2, out)
        self.assertIn("exists; not overwriting it", out)
        with open(path) as f:
            self.assertEqual(f.read(), text)

        # Two keys are never the same.
        other = os.path.join(self.dir.path, "other.key")
        self.assertEqual(H.run_to_exit([self.ctl, "keygen", other], 10)[0], 0)
        with open(other) as f:
            self.assertNotIn(keys[0], f.read())

        # The key the daemon reads: a keyed daemon starts with it.
        port = free_port()
        with H.Daemon(REGISTRY, host_devices=DEVICES, node_name="k",
                      extra_args=["--listen", "127.0.0.1:%d" % port, "--cluster-key", path]) as d:
            self.assertTrue(wait_for(lambda: "authenticated with the cluster key" in d.output(), 5),
                            d.output())

    def test_keygen_usage(self):
        rc, out, _ = H.run_to_exit([self.ctl, "keygen"], 10)
        self.assertEqual(rc, 2, out)
        rc, out, _ = H.run_to_exit([self.ctl, "keygen", "--help"], 10)
        self.assertEqual(rc, 0, out)
        self.assertIn("--cluster-key", out)
        rc, out, _ = H.run_to_exit([self.ctl, "keygen", "/nonexistent-dir/k"], 10)
        self.assertEqual(rc, 4, out)
        self.assertIn("cannot create /nonexistent-dir/k", out)


class TestStartRefusals(unittest.TestCase):
    """What familyd refuses at start: each exits non-zero, names the file or address, and
    binds nothing."""

    def setUp(self):
        self.dir = KeyDir()
        self.tmp = H.short_tmpdir()

    def tearDown(self):
        self.dir.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_fails(self, *args):
        sock = os.path.join(self.tmp, "familyd.sock")
        argv = [H.familyd_bin(), "--socket", sock, "--shard-socket",
                os.path.join(self.tmp, "shard.sock"), "--registry", REGISTRY,
                "--host-devices", "1"] + list(args)
        rc, out, secs = H.run_to_exit(argv, 30)
        self.assertNotEqual(rc, 0, out)
        self.assertFalse(os.path.exists(sock), "the API socket was bound: " + out)
        return out

    def listen(self):
        return ["--listen", "127.0.0.1:%d" % free_port()]

    def test_key_file_mode(self):
        path = self.dir.file("k", new_key())
        for mode in (0o644, 0o640, 0o604, 0o660, 0o602):
            os.chmod(path, mode)
            out = self.start_fails(*self.listen(), "--cluster-key", path)
            self.assertIn("Cluster key file %s has mode %04o: it must not be readable or "
                          "writable by group or others" % (path, mode), out)

    def test_key_file_owner(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to give the file to another user")
        path = self.dir.file("k", new_key())
        nobody = pwd.getpwnam("nobody").pw_uid
        os.chown(path, nobody, -1)
        out = self.start_fails(*self.listen(), "--cluster-key", path)
        self.assertIn("Cluster key file %s belongs to uid %d, not to familyd's user" %
                      (path, nobody), out)

    def test_key_file_contents(self):
        k = new_key()
        cases = [
            ("", "holds no key"),
            ("# only a comment\n\n", "holds no key"),
            (k[:62] + "\n", "line 1: not a key of 64 hexadecimal characters"),
            ("# c\n" + k + "\n" + "x" * 64 + "\n", "line 3: not a key of 64 hexadecimal"),
            ("\n".join([k, new_key(), new_key()]) + "\n", "holds more than 2 keys"),
            ((k + "\n") * 100, "larger than 4096 bytes"),
        ]
        for text, expected in cases:
            path = os.path.join(self.dir.path, "bad")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            out = self.start_fails(*self.listen(), "--cluster-key", path)
            self.assertIn("Cluster key file %s" % path, out)
            self.assertIn(expected, out)

    def test_key_file_missing_or_a_directory(self):
        out = self.start_fails(*self.listen(), "--cluster-key", "/nonexistent/cluster.key")
        self.assertIn("Cannot open the cluster key file /nonexistent/cluster.key", out)
        out = self.start_fails(*self.listen(), "--cluster-key", self.dir.path)
        self.assertIn("Cluster key file %s is not a regular file" % self.dir.path, out)
        link = os.path.join(self.dir.path, "link")
        os.symlink(self.dir.file("k", new_key()), link)
        out = self.start_fails(*self.listen(), "--cluster-key", link)
        self.assertIn("Cannot open the cluster key file %s" % link, out)

    def test_key_file_from_the_config_file(self):
        path = self.dir.file("k", new_key())
        os.chmod(path, 0o644)
        conf = os.path.join(self.tmp, "familyd.conf")
        with open(conf, "w") as f:
            f.write("cluster-key = %s\n" % path)
        out = self.start_fails(*self.listen(), "--config", conf)
        self.assertIn("Cluster key file %s has mode 0644" % path, out)

    def test_listen_off_loopback_needs_a_key(self):
        port = free_port()
        out = self.start_fails("--listen", "0.0.0.0:%d" % port)
        self.assertIn("--listen 0.0.0.0:%d is not a loopback address and there is no "
                      "--cluster-key" % port, out)
        self.assertIn("--insecure-peers", out)

    def test_listen_off_loopback_with_insecure_peers_or_a_key(self):
        port = free_port()
        with H.Daemon(REGISTRY, host_devices=DEVICES, node_name="open",
                      extra_args=["--listen", "0.0.0.0:%d" % port, "--insecure-peers"]) as d:
            self.assertTrue(wait_for(lambda: "Peers are not authenticated" in d.output(), 5))
            self.assertIn("--insecure-peers", d.output())
        path = self.dir.file("k", new_key())
        with H.Daemon(REGISTRY, host_devices=DEVICES, node_name="keyed",
                      extra_args=["--listen", "0.0.0.0:%d" % free_port(),
                                  "--cluster-key", path]) as d:
            self.assertTrue(wait_for(lambda: "authenticated with the cluster key" in d.output(),
                                     5))
            self.assertNotIn("not authenticated", d.output())

    def test_loopback_without_key_says_so_at_every_start(self):
        for _ in range(2):
            with H.Daemon(REGISTRY, host_devices=DEVICES, node_name="lo",
                          extra_args=["--listen", "127.0.0.1:%d" % free_port()]) as d:
                self.assertTrue(wait_for(lambda: "Peers are not authenticated (no --cluster-key)"
                                         in d.output(), 5), d.output())


class TestAuthenticatedCluster(unittest.TestCase):
    def setUp(self):
        self.dir = KeyDir()

    def tearDown(self):
        self.dir.cleanup()

    def test_same_key_forms_a_cluster(self):
        path = self.dir.file("k", new_key())
        with Cluster(3, host_devices=DEVICES, cluster_key=path) as c:
            _, view = c.wait_agreement(world_size=3 * DEVICES)
            self.assertEqual([n[3] for n in view[2]], ["up"] * 3)
            for d in c.daemons:
                self.assertIn("Peers are authenticated with the cluster key", d.output())
                self.assertNotIn("not authenticated", d.output())
            # A node killed is still seen down (heartbeats pass the MACs), and comes back.
            c.daemons[2].kill()
            c.wait_agreement(states=["up", "up", "down"], among=[0, 1], timeout=20)
            c.restart(2)
            c.wait_agreement(world_size=3 * DEVICES, states=["up"] * 3)

    def test_wrong_key_or_no_key_is_refused(self):
        good, bad = self.dir.file("good", new_key()), self.dir.file("bad", new_key())
        for name, key in (("wrongkey", bad), ("nokey", None)):
            with self.subTest(name), \
                    Cluster(2, host_devices=DEVICES, cluster_key=good) as c:
                _, before = c.wait_agreement(world_size=2 * DEVICES)
                extra = ["--cluster-key", key] if key else []
                rogue = H.Daemon(REGISTRY, host_devices=DEVICES, node_name=name,
                                 extra_args=["--listen", "127.0.0.1:%d" % free_port(),
                                             "--peers", c.seeds] + c.timing + extra,
                                 protos=c.protos)
                try:
                    rogue.start()
                    seed_log = c.daemons[0].output
                    refusal = "hung up before its proof" if key else "without a cluster key"
                    self.assertTrue(wait_for(lambda: "did not prove the cluster key (the last "
                                             "from 127.0.0.1:" in seed_log() and
                                             refusal in seed_log(), 15), seed_log())
                    time.sleep(1.0)   # several heartbeat intervals
                    for i in range(2):
                        self.assertEqual(c.view(i), before)
                    # The rogue knows no one either, and says why.
                    self.assertEqual(len(rogue.client.call(
                        "familyd.v1.MeshService/GetTopology").reply.nodes), 1)
                    why = ("does not hold this cluster's key" if key else
                           "not a familyd, or one that requires a cluster key")
                    self.assertTrue(wait_for(lambda: why in rogue.output(), 10), rogue.output())
                finally:
                    rogue.stop_checked()

    def test_refusal_travels_back_on_the_authenticated_link(self):
        """A member's refusal is the one message answered on the link it came in on: keyed, it
        is a frame of the listener's side of that session, and the dialer must open it."""
        path = self.dir.file("k", new_key())
        with Cluster(2, host_devices=1, cluster_key=path) as c:
            _, view = c.wait_agreement(world_size=2, timeout=20)
            dup = c.make(0, name="node1", port=free_port())
            try:
                dup.start()
                self.assertTrue(wait_for(lambda: "refused this node" in dup.stderr(), 10),
                                dup.stderr())
                self.assertIn("node name 'node1' is already in use by the live node at %s"
                              % c.address(1), dup.stderr())
                self.assertNotIn("bad MAC", dup.stderr())
                time.sleep(0.5)
                self.assertEqual(c.wait_agreement(timeout=5)[1][2], view[2])
            finally:
                dup.stop_checked()

    def test_keyed_daemon_does_not_join_an_open_cluster(self):
        path = self.dir.file("k", new_key())
        with Cluster(2, host_devices=DEVICES) as c:
            _, before = c.wait_agreement(world_size=2 * DEVICES)
            keyed = H.Daemon(REGISTRY, host_devices=DEVICES, node_name="keyed",
                             extra_args=["--listen", "127.0.0.1:%d" % free_port(),
                                         "--peers", c.seeds, "--cluster-key", path] + c.timing,
                             protos=c.protos)
            try:
                keyed.start()
                self.assertTrue(wait_for(lambda: "not a familyd with a cluster key" in
                                         keyed.output(), 10), keyed.output())
                for i in range(2):
                    self.assertEqual(c.view(i), before)
                self.assertEqual(len(keyed.client.call(
                    "familyd.v1.MeshService/GetTopology").reply.nodes), 1)
            finally:
                keyed.stop_checked()


def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def crypto_auth(key, message):
    """libsodium's crypto_auth: HMAC-SHA-512 cut to 32 bytes."""
    return hmac.new(key, message, hashlib.sha512).digest()[:32]


class TestHandshakeOnTheWire(unittest.TestCase):
    """The keyed handshake as docs/security.md describes it, spoken by hand over TCP: the
    worker address comes only after a good proof."""

    def setUp(self):
        self.dir = KeyDir()
        self.key = new_key()
        self.port = free_port()
        self.daemon = H.Daemon(REGISTRY, host_devices=DEVICES, node_name="listener",
                               extra_args=["--listen", "127.0.0.1:%d" % self.port,
                                           "--cluster-key", self.dir.file("k", self.key)])
        self.daemon.start()

    def tearDown(self):
        self.daemon.stop_checked()
        self.dir.cleanup()

    def dial(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        nonce = os.urandom(32)
        s.sendall(b"FAMILYK1" + nonce)
        answer = recv_exactly(s, 8 + 32 + 64)
        self.assertEqual(len(answer), 104)
        self.assertEqual(answer[:8], b"FAMILYK1")
        return s, nonce, answer[8:40], answer[40:72]

    def test_a_good_proof_gets_the_worker_address(self):
        key = bytes.fromhex(self.key)
        s, nd, nl, proof = self.dial()
        with s:
            self.assertEqual(proof, crypto_auth(key, b"familyd peer proof v1: listener" + nd + nl))
            s.sendall(crypto_auth(key, b"familyd peer proof v1: dialer" + nd + nl))
            head = recv_exactly(s, 4)
            length = int.from_bytes(head, "little")
            self.assertTrue(0 < length <= 16384, length)
            self.assertEqual(len(recv_exactly(s, length)), length)

    def test_bad_proofs_get_nothing(self):
        key = bytes.fromhex(self.key)
        bad = {
            "random": lambda nd, nl: os.urandom(32),
            "another key": lambda nd, nl: crypto_auth(os.urandom(32),
                                                      b"familyd peer proof v1: dialer" + nd + nl),
            "the listener's own proof sent back": lambda nd, nl: crypto_auth(
                key, b"familyd peer proof v1: listener" + nd + nl),
            "nonces swapped": lambda nd, nl: crypto_auth(
                key, b"familyd peer proof v1: dialer" + nl + nd),
        }
        for what, make in bad.items():
            with self.subTest(what):
                s, nd, nl, _ = self.dial()
                with s:
                    s.sendall(make(nd, nl))
                    self.assertEqual(s.recv(100), b"", "the listener answered a bad proof")
        # A proof recorded from one handshake does not open another.
        s, nd, nl, _ = self.dial()
        recorded = crypto_auth(key, b"familyd peer proof v1: dialer" + nd + nl)
        s.close()
        s, _, _, _ = self.dial()
        with s:
            s.sendall(recorded)
            self.assertEqual(s.recv(100), b"")
        # The unkeyed handshake gets nothing from a keyed listener.
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(b"FAMILYD1")
            self.assertEqual(s.recv(100), b"")
        out = self.daemon.output
        self.assertTrue(wait_for(lambda: "without a cluster key" in out(), 5), out())
        self.assertEqual(out().count("a wrong proof"), 5, out())


class TestRotation(unittest.TestCase):
    """Three daemons move from key A to key B: add B first, reload every node, remove A,
    reload again; no node is ever suspect, and afterwards only B lets a node in."""

    def setUp(self):
        self.dir = KeyDir()

    def tearDown(self):
        self.dir.cleanup()

    def reload(self, c, i, how):
        if how == "rpc":
            res = c.client(i).call("familyd.v1.AdminService/Reload")
            self.assertTrue(res.ok, res)
        else:
            c.daemons[i].signal(signal.SIGHUP)

    def wait_reloaded(self, c, i, n_before, keys):
        d = c.daemons[i]
        self.assertTrue(wait_for(lambda: d.output().count("reloaded: %d key" % keys) > n_before,
                                 10), d.output())

    def test_rotation_with_no_node_suspect(self):
        a, b = new_key(), new_key()
        files = [self.dir.file("node%d" % i, a) for i in range(3)]
        with Cluster(3, host_devices=DEVICES, cluster_key=files) as c:
            c.wait_agreement(world_size=3 * DEVICES, states=["up"] * 3)
            rec = StateRecorder(c, range(3))
            try:
                for keys in ((b, a), (b,)):
                    for i in range(3):
                        before = c.daemons[i].output().count("reloaded: %d key" % len(keys))
                        write_key(files[i], *keys)
                        self.reload(c, i, "rpc" if i % 2 == 0 else "sighup")
                        self.wait_reloaded(c, i, before, len(keys))
                        time.sleep(0.3)
                    c.wait_agreement(world_size=3 * DEVICES, states=["up"] * 3)
                time.sleep(1.0)
            finally:
                seen = rec.close()
            self.assertEqual({s for _, s in seen}, {"up"}, seen)

            # After the rotation: a restart with B rejoins; a node holding only A is refused.
            c.daemons[2].kill()
            c.restart(2)
            c.wait_agreement(world_size=3 * DEVICES, states=["up"] * 3)
            old = H.Daemon(REGISTRY, host_devices=DEVICES, node_name="old",
                           extra_args=["--listen", "127.0.0.1:%d" % free_port(),
                                       "--peers", c.seeds, "--cluster-key",
                                       self.dir.file("old", a)] + c.timing,
                           protos=c.protos)
            try:
                old.start()
                self.assertTrue(wait_for(lambda: "does not hold this cluster's key" in
                                         old.output(), 10), old.output())
                self.assertEqual(c.view(0)[1], 3 * DEVICES)
            finally:
                old.stop_checked()

    def test_mid_rotation_both_directions_connect(self):
        """During a rotation a node holds A, (B, A) or (A, B): every pair connects, in both
        directions (every node dials every other)."""
        a, b = new_key(), new_key()
        files = [self.dir.file("n0", b, a), self.dir.file("n1", a), self.dir.file("n2", a, b)]
        with Cluster(3, host_devices=DEVICES, cluster_key=files, seeds="all") as c:
            c.wait_agreement(world_size=3 * DEVICES, states=["up"] * 3)
            for d in c.daemons:
                self.assertNotIn("did not prove", d.output())

    def test_bad_key_file_on_reload_keeps_the_keys_in_use(self):
        a = new_key()
        files = [self.dir.file("n%d" % i, a) for i in range(2)]
        with Cluster(2, host_devices=DEVICES, cluster_key=files) as c:
            c.wait_agreement(world_size=2 * DEVICES)
            os.chmod(files[0], 0o644)
            res = c.client(0).call("familyd.v1.AdminService/Reload")
            self.assertTrue(res.ok, res)   # the registry reload itself succeeded
            out = c.daemons[0].output
            self.assertTrue(wait_for(lambda: "not reloaded: keeping the keys in use" in out(), 5),
                            out())
            self.assertIn("has mode 0644", out())
            os.chmod(files[0], 0o600)
            # Still keyed with A: node1 restarted with A rejoins.
            c.daemons[1].kill()
            c.restart(1)
            c.wait_agreement(world_size=2 * DEVICES, states=["up", "up"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
