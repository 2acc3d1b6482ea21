#!/usr/bin/python3
"""Builds that a node's trainers share (docs/sharing.md): one build per request.

Real processes (each its own pid, each the tests' interpreter running build_holder.py) call
the real daemon at the same moment; the daemon must answer one build, fill it once (GetStatus
fills_started moves by one build's segments) and hand all of them the same bytes on the shard
socket. A process of another uid, and a private_build request, get their own builds. The
holders run from a world-readable copy of build_holder.py and what it imports (other_uid.py):
the clone may sit where other uids cannot read (root's home is 0700).
"""

import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_holder.py")
GE = "grouped_experts"
# 4 experts x 32 x (64 + 32) float32 per rank, on a mesh of 4 ranks: big enough that the fill
# takes a moment, so the four Builds overlap it.
CFG = {"num_experts": {"intValue": 8}, "hidden_size": {"intValue": 64},
       "moe_intermediate_size": {"intValue": 64}, "initializer_range": {"doubleValue": 0.02}}
NOBODY = 65534

P = None
D = None
COPY = None  # what the holders run, readable by every uid
PYTHON = None


def setUpModule():
    global P, D, COPY, PYTHON
    PYTHON = other_uid.other_uid_python()
    COPY = other_uid.harness_copy(HOLDER, prefix="fd-share-")
    P = H.Protos()
    D = H.Daemon(registry=REGISTRY, host_devices=4, protos=P,
                 extra_args=["--build-grace-ms", "2000"])
    # Another uid must reach the socket: the test's folder is open to everyone.
    os.chmod(D.tmpdir, 0o755)
    D.start()
    os.chmod(D.socket, 0o666)


def tearDownModule():
    try:
        if D is not None:
            D.stop_checked()
    finally:
        if COPY is not None:
            COPY.cleanup()


class Holder:
    """One build_holder.py process; uid: run it as that uid (setpriv)."""

    def __init__(self, uid=None):
        argv = [PYTHON, COPY.path(os.path.basename(HOLDER)), D.socket]
        if uid is not None:
            argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups"] + argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=other_uid.harness_env(COPY),
                                     cwd=COPY.root)

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self):
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("holder %d died" % self.proc.pid)
        return json.loads(line)

    def ask(self, **cmd):
        self.send(**cmd)
        return self.answer()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="exit")
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except BrokenPipeError:
                pass


def request(mesh_id="", private=False, seed=7):
    r = {"family": GE, "config": {"fields": CFG}, "meshId": mesh_id,
         "materialize": {"enabled": True, "seed": str(seed)}}
    if private:
        r["privateBuild"] = True
    return r


class TestSharing(unittest.TestCase):
    def setUp(self):
        self.c = D.client
        res = self.c.call("familyd.v1.MeshService/CreateMesh",
                          {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}]}})
        self.assertTrue(res.ok, res)
        self.mesh = res.reply.mesh_id

    def status(self):
        return self.c.call("familyd.v1.AdminService/GetStatus", {}).reply

    def holders(self, n, uid=None):
        hs = [Holder(uid) for _ in range(n)]
        for h in hs:
            self.addCleanup(h.close)
        return hs

    def test_four_processes_one_build_one_fill(self):
        before = self.status()
        go = os.path.join(D.tmpdir, "go-%d" % time.monotonic_ns())
        hs = self.holders(4)
        for h in hs:
            h.send(op="build", request=request(self.mesh), go=go)
        time.sleep(1.0)  # every process is waiting for the file
        open(go, "w").close()
        answers = [h.answer() for h in hs]
        for a in answers:
            self.assertEqual(a["code"], "OK", a)
        ids = {a["build_id"] for a in answers}
        self.assertEqual(len(ids), 1, answers)
        self.assertEqual(sorted(a["shared"] for a in answers), [False, True, True, True])
        segments = len(answers[0]["tokens"])
        self.assertEqual(segments, 4)
        after = self.status()
        self.assertEqual(after.fills_started - before.fills_started, segments)
        self.assertEqual(after.builds - before.builds, 1)
        digests = {h.ask(op="fetch")["digest"] for h in hs}
        self.assertEqual(len(digests), 1)
        got = self.c.call("familyd.v1.FamilyService/GetBuild", build_id=ids.pop()).reply
        self.assertEqual(sorted(r.pid for r in got.references),
                         sorted(a["pid"] for a in answers))
        self.assertFalse(got.private_build)

        # Another uid: its own build, its own fill.
        other = self.holders(1, uid=NOBODY)[0]
        a = other.ask(op="build", request=request(self.mesh))
        self.assertEqual(a["code"], "OK", a)
        self.assertNotEqual(a["build_id"], answers[0]["build_id"])
        self.assertFalse(a["shared"])
        self.assertEqual(self.status().fills_started - after.fills_started, segments)

        # A private build: its own, never found by others.
        p = hs[0].ask(op="build", request=request(self.mesh, private=True))
        self.assertEqual(p["code"], "OK", p)
        self.assertNotEqual(p["build_id"], answers[0]["build_id"])
        self.assertFalse(p["shared"])
        again = hs[1].ask(op="build", request=request(self.mesh))
        self.assertEqual(again["build_id"], answers[0]["build_id"])
        self.assertTrue(again["shared"])
        got = self.c.call("familyd.v1.FamilyService/GetBuild", build_id=p["build_id"]).reply
        self.assertTrue(got.private_build)
        # A different seed is another build.
        s = hs[1].ask(op="build", request=request(self.mesh, seed=8))
        self.assertNotEqual(s["build_id"], answers[0]["build_id"])
        for b in (a["build_id"], p["build_id"], s["build_id"], answers[0]["build_id"]):
            self.c.call("familyd.v1.FamilyService/ReleaseBuild", build_id=b, force=True)

    def test_fill_continues_for_a_waiter_when_the_first_caller_is_killed(self):
        before = self.status()
        first, second = self.holders(2)
        req = request(self.mesh, seed=99)
        first.send(op="build", request=req)
        time.sleep(0.05)
        second.send(op="build", request=req)
        time.sleep(0.05)
        first.proc.kill()
        first.proc.wait()
        a = second.answer()
        self.assertEqual(a["code"], "OK", a)
        got = self.c.call("familyd.v1.FamilyService/GetBuild", build_id=a["build_id"]).reply
        self.assertEqual([r.pid for r in got.references], [a["pid"]])
        self.assertLessEqual(self.status().fills_started - before.fills_started, 4)
        r = second.ask(op="release", build_id=a["build_id"])
        self.assertEqual((r["code"], r["freed"]), ("OK", False), r)
        self.c.call("familyd.v1.FamilyService/ReleaseBuild", build_id=a["build_id"], force=True)

    def test_layout_only_build_is_not_shared(self):
        r = {"family": GE, "config": {"fields": CFG}, "meshId": self.mesh}
        a = self.c.call("familyd.v1.FamilyService/Build", r)
        b = self.c.call("familyd.v1.FamilyService/Build", r)
        self.assertTrue(a.ok and b.ok)
        self.assertNotEqual(a.reply.build.build_id, b.reply.build.build_id)
        self.assertEqual(len(a.reply.build.references), 0)
        for x in (a, b):
            rel = self.c.call("familyd.v1.FamilyService/ReleaseBuild",
                              build_id=x.reply.build.build_id)
            self.assertTrue(rel.ok and rel.reply.freed, rel)


if __name__ == "__main__":
    unittest.main(verbosity=2)
