#!/usr/bin/python3
"""One socket, one daemon: a second familyd on the same socket refuses to start.

gRPC's bind unlinks whatever sits at the path, so without a lock a second daemon would silently
steal the first one's socket. Also: a stale socket left by a SIGKILLed daemon does not block the
next start, and a clean stop frees the socket.
"""

import os
import re
import shutil
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")


class TestSecondDaemon(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-second-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sock = os.path.join(self.tmp, "api.sock")

    def daemon(self, sub):
        d = H.Daemon(registry=REGISTRY, tmpdir=os.path.join(self.tmp, sub), socket_path=self.sock)
        os.makedirs(d.tmpdir, exist_ok=True)
        self.addCleanup(d.kill)
        return d

    def assertServing(self, d):
        c = H.Client(self.sock, d.protos)
        try:
            h = c.health()
            self.assertEqual((h.code, h.reply.status if h.ok else None), ("OK", 1), repr(h))
            r = c.call("familyd.v1.FamilyService/Resolve",
                       {"family": "grouped_experts", "context": {"epSize": 4}})
            self.assertEqual(r.code, "OK", repr(r))
            self.assertEqual(r.reply.resolved.variant, "grouped_ep")
            st = c.call("familyd.v1.AdminService/GetStatus")
            self.assertEqual(st.code, "OK", repr(st))
        finally:
            c.close()

    def test_second_daemon_refuses(self):
        first = self.daemon("a").start()
        ino = os.stat(self.sock).st_ino
        second = self.daemon("b")
        rc, out, secs = H.run_to_exit(second.argv(), timeout=20)
        self.assertNotEqual(rc, 0, "second familyd on the same socket started:\n" + out)
        self.assertGreater(rc, 0, "second familyd died of signal %d:\n%s" % (-rc, out))
        self.assertTrue(re.search(r"(?i)lock|in use|already|running|busy", out)
                        and (self.sock in out or "lock" in out.lower()),
                        "refusal does not name the socket or its lock:\n" + out)
        # the first one keeps its socket (same inode) and serves
        self.assertTrue(first.alive())
        self.assertEqual(os.stat(self.sock).st_ino, ino, "the second daemon replaced the socket")
        self.assertServing(first)
        first.stop()
        # a clean stop frees the socket: the next daemon starts on it
        third = self.daemon("c").start()
        self.assertServing(third)
        third.stop()

    def test_stale_socket_after_sigkill(self):
        first = self.daemon("a").start()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        # the socket file may remain; its lock died with the process
        second = self.daemon("b").start()
        self.assertServing(second)
        second.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
