#!/usr/bin/python3
"""Socket activation: familyd serves on listening sockets it inherits (LISTEN_FDS, names api
and shard) instead of binding, and refuses descriptors it cannot serve with a clear error.

- systemd's own systemd-socket-activate starts familyd on the first connection; Health,
  Resolve, a materialising Build and a shard handout all go over the inherited sockets, whose
  paths the replies name; familyd binds nothing of its own and leaves the manager's socket
  files in place when it stops.
- The fake manager (fake_manager.py) passes api and shard plus fd-store descriptors
  (shard-*, meta*), whose names familyd accepts (daemon/state takes them; test-sd-listen
  covers the taking).
- An inherited api or shard that is not a listening AF_UNIX stream socket, an unknown name,
  no names at all, or two sockets named api: non-zero exit, a line saying what is wrong, no
  READY=1, no socket file.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
from fake_manager import FakeManager  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
ACTIVATE = shutil.which("systemd-socket-activate") or "/usr/bin/systemd-socket-activate"
# What the daemon started by systemd-socket-activate keeps of the test's environment.
PASS_ENV = ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "HWLOC_COMPONENTS")
GE_SMALL = {"num_experts": 4, "hidden_size": 8, "moe_intermediate_size": 4,
            "initializer_range": 0.02}
P = None


def setUpModule():
    global P
    P = H.Protos()


def listening_unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(16)
    return s


def build_request():
    req = P.cls("familyd.v1.BuildRequest")(family="grouped_experts")
    req.config.SetInParent()
    for k, v in GE_SMALL.items():
        req.config.fields[k].CopyFrom(P.value(v))
    req.materialize.enabled = True
    return req


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-act-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.api = os.path.join(self.tmp, "api.sock")
        self.shard = os.path.join(self.tmp, "shard.sock")
        # The paths familyd would bind without activation: they must stay unused.
        self.own_api = os.path.join(self.tmp, "own.sock")
        self.own_shard = os.path.join(self.tmp, "own-shard.sock")
        self.err_path = os.path.join(self.tmp, "familyd.err")
        self.proc = None

    def tearDown(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def familyd_argv(self):
        return [H.familyd_bin(), "--socket", self.own_api, "--shard-socket", self.own_shard,
                "--registry", REGISTRY, "--host-devices", "2"]

    def exercise(self):
        """Health, Resolve, Build + shard handout over the inherited sockets."""
        client = H.Client(self.api, P)
        try:
            deadline = time.monotonic() + H.START_TIMEOUT
            while True:
                res = client.health(timeout=5)
                if res.ok:
                    break
                self.assertIsNone(self.proc.poll(), "familyd exited:\n" + self.stderr())
                self.assertLess(time.monotonic(), deadline, res)
                time.sleep(0.1)
                client.close()
                client = H.Client(self.api, P)
            self.assertEqual(res.reply.status, 1)

            res = client.call("familyd.v1.FamilyService/Resolve",
                              {"family": "grouped_experts", "context": {"epSize": "4"}})
            self.assertTrue(res.ok, res)
            self.assertEqual(res.reply.resolved.variant, "grouped_ep")

            res = client.call("familyd.v1.FamilyService/Build", build_request())
            self.assertTrue(res.ok, res)
            b = res.reply.build
            self.assertEqual(b.shard_socket, self.shard,
                             "the reply must name the inherited shard socket")
            tokens = [s.token for s in b.shards if s.token]
            self.assertTrue(tokens)
            reply, fds = SC.fetch(b.shard_socket, P, tokens)
            try:
                self.assertEqual(reply.code, 0, reply.message)
                self.assertEqual(len(fds), len(tokens))
                size = b.shards[0].size_bytes
                m = SC.map_readonly(fds[0], size)
                self.assertEqual(len(m[:size]), size)
                self.assertNotEqual(m[:size], b"\0" * size, "the shard holds its values")
                m.close()
            finally:
                for fd in fds:
                    os.close(fd)
        finally:
            client.close()
        # familyd bound nothing itself.
        self.assertFalse(os.path.exists(self.own_api))
        self.assertFalse(os.path.exists(self.own_shard))


class TestSystemdSocketActivate(Base):
    def test_first_connection_starts_familyd_on_inherited_sockets(self):
        if not os.access(ACTIVATE, os.X_OK):
            self.skipTest("systemd-socket-activate not installed")
        err = open(self.err_path, "wb")
        # Not --accept: one familyd gets both listening sockets, named by --fdname. The
        # activator hands the daemon only LISTEN_*: the tests' own variables (the sanitizers',
        # HWLOC_COMPONENTS) go through -E, as a unit's Environment= would set them.
        passed = [a for name in PASS_ENV if name in os.environ for a in ("-E", name)]
        self.proc = subprocess.Popen(
            [ACTIVATE, "-l", self.api, "-l", self.shard, "--fdname=api:shard", *passed,
             *self.familyd_argv()],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        err.close()
        deadline = time.monotonic() + 10
        while not (os.path.exists(self.api) and os.path.exists(self.shard)):
            self.assertLess(time.monotonic(), deadline, "systemd-socket-activate did not listen")
            time.sleep(0.05)
        self.exercise()
        self.assertIn("inherited socket %s" % self.api, self.stderr())

        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(H.STOP_TIMEOUT), 0, self.stderr())
        # The socket files are the manager's: familyd leaves them.
        self.assertTrue(os.path.exists(self.api))
        self.assertTrue(os.path.exists(self.shard))


class TestFakeManager(Base):
    def setUp(self):
        super().setUp()
        self.manager = FakeManager(self.tmp)
        self.addCleanup(self.manager.close)

    def spawn(self, listen, env=None):
        err = open(self.err_path, "wb")
        self.proc = self.manager.spawn(self.familyd_argv(), listen=listen, env=env,
                                       stdout=subprocess.DEVNULL, stderr=err,
                                       stdin=subprocess.DEVNULL)
        err.close()

    def expect_refusal(self, listen, *texts, env=None):
        self.spawn(listen, env=env)
        rc = self.proc.wait(H.START_TIMEOUT)
        self.assertNotEqual(rc, 0, self.stderr())
        for t in texts:
            self.assertIn(t, self.stderr())
        self.assertEqual(self.manager.count("READY", "1"), 0)
        self.assertFalse(os.path.exists(self.own_api))
        self.assertFalse(os.path.exists(self.own_shard))
        self.assertLess(len(self.stderr().splitlines()), 20, self.stderr())
        return self.stderr()

    def test_fdstore_names_are_accepted_beside_the_sockets(self):
        api, shard = listening_unix(self.api), listening_unix(self.shard)
        self.addCleanup(api.close)
        self.addCleanup(shard.close)
        stored = []
        for name in ("shard-0123", "meta"):
            fd = os.memfd_create(name)
            stored.append(fd)
            self.addCleanup(os.close, fd)
        # The fd-store entries come after the sockets, as systemd passes them. What they hold
        # is daemon/state's business (an empty store entry here); their names are no error.
        self.spawn([("api", api), ("shard", shard), ("shard-0123", stored[0]),
                    ("meta", stored[1])])
        self.manager.wait_for("READY", "1", timeout=H.START_TIMEOUT)
        self.exercise()
        self.assertNotIn("unknown name", self.stderr())
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(H.STOP_TIMEOUT), 0, self.stderr())
        self.assertTrue(os.path.exists(self.api))

    def test_only_api_inherited_shard_bound(self):
        api = listening_unix(self.api)
        self.addCleanup(api.close)
        self.spawn([("api", api)])
        self.manager.wait_for("READY", "1", timeout=H.START_TIMEOUT)
        client = H.Client(self.api, P)
        self.addCleanup(client.close)
        res = client.call("familyd.v1.FamilyService/Build", build_request())
        self.assertTrue(res.ok, res)
        self.assertEqual(res.reply.build.shard_socket, self.own_shard)
        self.assertTrue(os.path.exists(self.own_shard))
        self.assertFalse(os.path.exists(self.own_api))
        client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(H.STOP_TIMEOUT), 0, self.stderr())
        self.assertFalse(os.path.exists(self.own_shard), "familyd removes what it bound")

    def test_inherited_socket_is_locked_against_a_second_daemon(self):
        api = listening_unix(self.api)
        self.addCleanup(api.close)
        self.spawn([("api", api)])
        self.manager.wait_for("READY", "1", timeout=H.START_TIMEOUT)
        # A familyd started by hand on the manager's path must not unlink its socket.
        r = subprocess.run([H.familyd_bin(), "--socket", self.api, "--registry", REGISTRY,
                            "--shard-socket", os.path.join(self.tmp, "second-shard.sock")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=H.START_TIMEOUT)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("Another familyd is serving %s" % self.api, r.stderr)
        client = H.Client(self.api, P)
        self.addCleanup(client.close)
        self.assertTrue(client.health().ok)
        client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(H.STOP_TIMEOUT), 0, self.stderr())

    def test_regular_file_as_api(self):
        path = os.path.join(self.tmp, "file")
        with open(path, "w") as f:
            f.write("x")
        fd = os.open(path, os.O_RDONLY)
        self.addCleanup(os.close, fd)
        self.expect_refusal([("api", fd)], "Inherited descriptor 3 ('api') is not a listening "
                            "AF_UNIX stream socket: it is a regular file")

    def test_datagram_socket_as_shard(self):
        api = listening_unix(self.api)
        self.addCleanup(api.close)
        d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        d.bind(os.path.join(self.tmp, "dgram"))
        self.addCleanup(d.close)
        self.expect_refusal([("api", api), ("shard", d)],
                            "Inherited descriptor 4 ('shard') is not a listening AF_UNIX "
                            "stream socket: it is a datagram socket")

    def test_tcp_socket_as_api(self):
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.bind(("127.0.0.1", 0))
        t.listen(1)
        self.addCleanup(t.close)
        self.expect_refusal([("api", t)], "it is an AF_INET socket")

    def test_stream_socket_not_listening(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(self.api)
        self.addCleanup(s.close)
        self.expect_refusal([("api", s)], "it is a stream socket that is not listening")

    def test_unknown_name(self):
        api = listening_unix(self.api)
        self.addCleanup(api.close)
        self.expect_refusal([("web", api)], "Descriptor 3 has the unknown name 'web'")

    def test_no_names(self):
        api = listening_unix(self.api)
        self.addCleanup(api.close)
        self.expect_refusal([("api", api)], "without a name", env={"LISTEN_FDNAMES": None})

    def test_two_api_sockets(self):
        a, b = listening_unix(self.api), listening_unix(self.shard)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        self.expect_refusal([("api", a), ("api", b)], "a second socket named 'api'")

    def test_listen_pid_of_another_process_is_ignored(self):
        # LISTEN_FDS meant for another process (LISTEN_PID differs): familyd binds its own.
        env = dict(os.environ, LISTEN_FDS="1", LISTEN_FDNAMES="api", LISTEN_PID="1")
        out = open(self.err_path, "wb")
        self.proc = subprocess.Popen(self.familyd_argv(), env=env, stdout=subprocess.DEVNULL,
                                     stderr=out, stdin=subprocess.DEVNULL)
        out.close()
        deadline = time.monotonic() + H.START_TIMEOUT
        while not H.socket_accepts(self.own_api):
            self.assertIsNone(self.proc.poll(), self.stderr())
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(H.STOP_TIMEOUT), 0, self.stderr())


if __name__ == "__main__":
    unittest.main(verbosity=2)
