#!/usr/bin/python3
"""Training handouts (docs/sharing.md, "Training handouts"): a build both private_build and
writable belongs to the one process that made it.

Real processes against the real daemon (--build-grace-ms 0): process A (build_holder.py, as
uid nobody) makes a private writable build of one rank and maps it MAP_SHARED read-write;
process B, another process of the same uid, sees the build without tokens in GetBuild and
ListBuilds, and is refused A's token on the shard socket; so is root (an admin, this test's
own process), which sees no tokens either. A's writes show in A's second mapping, and the build
is freed when A exits. A plain writable build (not private) stays as before: another process
of the uid sees its tokens and maps it read-write. The holders run from a world-readable copy
of build_holder.py (other_uid.py): the clone may sit where other uids cannot read.
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
import shard_client as SC  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_holder.py")
GE = "grouped_experts"
CFG = {"num_experts": {"intValue": 8}, "hidden_size": {"intValue": 64},
       "moe_intermediate_size": {"intValue": 64}, "initializer_range": {"doubleValue": 0.02}}
NOBODY = 65534
PERMISSION_DENIED = 7
NOT_FOUND = 5
OTHER_PROCESS = ("shard token 1 of 1 belongs to another process: its build is a training "
                 "handout (private and writable), which only the process that made it may map")

P = None
D = None
COPY = None
PYTHON = None


def setUpModule():
    global P, D, COPY, PYTHON
    PYTHON = other_uid.other_uid_python()
    COPY = other_uid.harness_copy(HOLDER, prefix="fd-handout-")
    P = H.Protos()
    D = H.Daemon(registry=REGISTRY, host_devices=4, protos=P,
                 extra_args=["--build-grace-ms", "0"])
    os.chmod(D.tmpdir, 0o755)
    D.start()
    os.chmod(D.socket, 0o666)
    os.chmod(D.shard_socket, 0o666)


def tearDownModule():
    try:
        if D is not None:
            D.stop_checked()
    finally:
        if COPY is not None:
            COPY.cleanup()


class Holder:
    """One build_holder.py process of uid nobody."""

    def __init__(self):
        argv = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                PYTHON, COPY.path(os.path.basename(HOLDER)), D.socket]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=other_uid.harness_env(COPY),
                                     cwd=COPY.root)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("holder %d died" % self.proc.pid)
        return json.loads(line)

    def exit(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
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


def request(mesh_id, private, seed):
    return {"family": GE, "config": {"fields": CFG}, "meshId": mesh_id,
            "privateBuild": private, "writable": True,
            "materialize": {"enabled": True, "seed": str(seed), "ranks": ["1"]}}


class TestHandout(unittest.TestCase):
    def setUp(self):
        self.c = D.client
        res = self.c.call("familyd.v1.MeshService/CreateMesh",
                          {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}]}})
        self.assertTrue(res.ok, res)
        self.mesh = res.reply.mesh_id

    def holder(self):
        h = Holder()
        self.addCleanup(h.exit)
        return h

    def status(self):
        return self.c.call("familyd.v1.AdminService/GetStatus", {}).reply

    def get(self, build_id):
        return self.c.call("familyd.v1.FamilyService/GetBuild", build_id=build_id)

    def test_handout_belongs_to_its_process(self):
        before = self.status().shm_bytes_in_use
        a, b = self.holder(), self.holder()
        built = a.ask(op="build", request=request(self.mesh, True, 31))
        self.assertEqual(built["code"], "OK", built)
        self.assertEqual(len(built["tokens"]), 1, built)  # one rank, its token to A
        token, sock, bid = built["tokens"][0], built["shard_socket"], built["build_id"]
        # Its memory counts as any build's.
        got = self.get(bid)
        self.assertTrue(got.ok, got)
        self.assertTrue(got.reply.private_build and got.reply.writable)
        self.assertGreater(self.status().shm_bytes_in_use, before)

        # A maps it MAP_SHARED read-write and writes; a second mapping of A's shows it.
        w = a.ask(op="write", token=token, hex="deadbeef0badf00d")
        self.assertEqual((w["code"], w["n_fds"]), (0, 1), w)
        r = a.ask(op="read", token=token, size=8)
        self.assertEqual((r["code"], r["hex"]), (0, "deadbeef0badf00d"), r)
        # A itself sees its token in GetBuild and ListBuilds.
        seen = a.ask(op="seen", build_id=bid)
        self.assertEqual((seen["get_tokens"], seen["list_tokens"]), ([token], [token]), seen)

        # B, another process of the same uid: the build without its token.
        seen = b.ask(op="seen", build_id=bid)
        self.assertEqual(seen["get_code"], "OK", seen)
        self.assertEqual((seen["get_tokens"], seen["list_tokens"]), ([], []), seen)
        # A's token (passed on by the test) is refused to B, read-only and writable alike.
        for writable in (False, True):
            ans = b.ask(op="shard", shard_socket=sock, tokens=[token], writable=writable)
            self.assertEqual((ans["code"], ans["n_fds"]), (PERMISSION_DENIED, 0), ans)
            self.assertEqual(ans["message"], OTHER_PROCESS)

        # Root, an admin: no token shown, and refused on the shard socket too.
        self.assertTrue(all(not s.token for s in got.reply.shards), got.reply)
        listed = self.c.call("familyd.v1.FamilyService/ListBuilds", {}).reply
        self.assertTrue(all(not s.token for x in listed.builds if x.build_id == bid
                            for s in x.shards))
        reply, fds = SC.fetch(sock, P, [token])
        for fd in fds:
            os.close(fd)
        self.assertEqual((reply.code, len(fds)), (PERMISSION_DENIED, 0), reply)
        self.assertEqual(reply.message, OTHER_PROCESS)
        # Nor does a Build by B of the same request find it (private: never shared).
        other = b.ask(op="build", request=request(self.mesh, True, 31))
        self.assertEqual(other["code"], "OK", other)
        self.assertNotEqual(other["build_id"], bid)

        # A exits: its build goes with it (--build-grace-ms 0), its token with it.
        a.exit()
        deadline = time.monotonic() + 10
        while self.get(bid).ok and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.get(bid).code, "NOT_FOUND")
        reply, fds = SC.fetch(sock, P, [token])
        for fd in fds:
            os.close(fd)
        self.assertEqual(reply.code, NOT_FOUND, reply)
        b.exit()
        deadline = time.monotonic() + 10
        while self.status().shm_bytes_in_use != before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.status().shm_bytes_in_use, before)

    def test_admin_force_release_of_a_handout(self):
        a = self.holder()
        built = a.ask(op="build", request=request(self.mesh, True, 32))
        self.assertEqual(built["code"], "OK", built)
        res = self.c.call("familyd.v1.FamilyService/ReleaseBuild",
                          build_id=built["build_id"], force=True)
        self.assertTrue(res.ok and res.reply.freed, res)
        self.assertEqual(self.get(built["build_id"]).code, "NOT_FOUND")
        ans = a.ask(op="shard", tokens=built["tokens"])
        self.assertEqual(ans["code"], NOT_FOUND, ans)

    def test_plain_writable_build_is_the_uids(self):
        a, b = self.holder(), self.holder()
        built = a.ask(op="build", request=request(self.mesh, False, 33))
        self.assertEqual(built["code"], "OK", built)
        token, bid = built["tokens"][0], built["build_id"]
        seen = b.ask(op="seen", build_id=bid)
        self.assertEqual((seen["get_tokens"], seen["list_tokens"]), ([token], [token]), seen)
        w = b.ask(op="write", shard_socket=built["shard_socket"], token=token, hex="c0ffee")
        self.assertEqual((w["code"], w["n_fds"]), (0, 1), w)
        r = a.ask(op="read", token=token, size=3)
        self.assertEqual((r["code"], r["hex"]), (0, "c0ffee"), r)
        # Root, an admin, sees and maps it as before.
        got = self.get(bid).reply
        self.assertEqual([s.token for s in got.shards if s.token], [token])
        reply, fds = SC.fetch(built["shard_socket"], P, [token])
        for fd in fds:
            os.close(fd)
        self.assertEqual((reply.code, len(fds)), (0, 1), reply)
        self.c.call("familyd.v1.FamilyService/ReleaseBuild", build_id=bid, force=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
