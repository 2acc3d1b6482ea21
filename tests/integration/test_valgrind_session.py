#!/usr/bin/python3
"""One client session against familyd running under valgrind (memcheck): families, Resolve,
a mesh, a materialising Build, its shards fetched over the shard socket, mapped and read,
Validate, status, errors (an unknown family, undecodable bytes, a bad shard token), ReleaseBuild,
DeleteMesh, Reload, then SIGTERM. valgrind runs with --error-exitcode=66, --leak-check=full and
--errors-for-leak-kinds=definite (the project's valgrind setup, meson.build): the daemon must
exit 0, so no invalid read or write, no use of uninitialised memory, no definite leak.

It needs a familyd built without sanitizers (they do not mix with valgrind): meson registers it
(suite 'valgrind') only in such builds, and it skips (77) when given a sanitizer build or when
valgrind is missing. tests/run-all.sh runs it in build-valgrind:

    meson test -C build-valgrind --suite valgrind

It wraps the daemon itself, so it runs without `--setup valgrind` (which would wrap Python).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_holder.py")
CONFIG = {"fields": {"num_experts": {"intValue": 8}, "hidden_size": {"intValue": 16},
                     "moe_intermediate_size": {"intValue": 8},
                     "initializer_range": {"doubleValue": 0.02}}}
VALGRIND = shutil.which("valgrind")


def sanitizer_build(path):
    with open(path, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__ubsan_handle" in data


class ValgrindDaemon(H.Daemon):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.vg_log = os.path.join(self.tmpdir, "valgrind.log")

    def argv(self):
        return [VALGRIND, "--error-exitcode=66", "--leak-check=full",
                "--errors-for-leak-kinds=definite", "--show-leak-kinds=definite",
                "--track-fds=no", "-q", "--log-file=" + self.vg_log] + super().argv()

    def valgrind_log(self):
        try:
            with open(self.vg_log) as f:
                return f.read()
        except OSError:
            return ""


class TestValgrindSession(unittest.TestCase):
    def test_session(self):
        d = ValgrindDaemon(registry=REGISTRY)
        self.addCleanup(d.cleanup)
        t0 = time.monotonic()
        d.start(timeout=120)
        c = d.client
        call = lambda rpc, req=None, **kw: c.call(rpc, req if req is not None else {}, timeout=60,
                                                  **kw)

        self.assertTrue(call("familyd.v1.FamilyService/ListFamilies").ok)
        r = call("familyd.v1.FamilyService/Resolve",
                 {"family": "grouped_experts", "arguments": {"use_mxfp8": {"boolValue": True}},
                  "context": {"epSize": 2, "ep": True}})
        self.assertEqual((r.code, r.reply.resolved.variant), ("OK", "mxfp8"), r)
        bad = call("familyd.v1.FamilyService/Resolve", {"family": "nope"})
        self.assertEqual(bad.code, "NOT_FOUND", bad)
        garbage = c.raw_call("/familyd.v1.FamilyService/Resolve", b"\x0a\xff\xff\xff", timeout=60)
        self.assertEqual(garbage.code, "INVALID_ARGUMENT", garbage)

        mesh = call("familyd.v1.MeshService/CreateMesh",
                    {"mesh": {"deviceMesh": [{"name": "dp", "size": 2}, {"name": "ep", "size": 4}]}})
        self.assertTrue(mesh.ok, mesh)
        mesh_id = mesh.reply.mesh_id
        b = call("familyd.v1.FamilyService/Build",
                 {"family": "grouped_experts", "config": CONFIG, "meshId": mesh_id,
                  "moduleFqn": "layers.0.moe",
                  "materialize": {"enabled": True, "dtype": "bfloat16", "seed": "3"}})
        self.assertTrue(b.ok, b)
        build = b.reply.build
        tokens = [s.token for s in build.shards if s.token]
        self.assertEqual(len(tokens), 8)
        reply, fds = SC.fetch(build.shard_socket, d.protos, tokens)
        self.assertEqual((reply.code, len(fds)), (0, 8), reply.message)
        total = 0
        for fd, size in zip(fds, reply.sizes):
            m = SC.map_readonly(fd, size)
            total += sum(m[:size])
            m.close()
            os.close(fd)
        self.assertGreater(total, 0)
        reply, fds = SC.fetch(build.shard_socket, d.protos, ["0" * 32])
        self.assertEqual((reply.code, fds), (5, []))

        v = call("familyd.v1.FamilyService/Validate",
                 {"boundaries": [{"fqns": ["layers.0.moe"], "buildId": build.build_id},
                                 {"fqns": ["x"], "buildId": "bld-gone"}],
                  "context": {"meshId": mesh_id}})
        self.assertTrue(v.ok, v)
        self.assertEqual([x.reason for x in v.reply.violations], ["UNKNOWN_BUILD"])
        self.assertEqual(call("familyd.v1.AdminService/GetStatus").reply.builds, 1)
        # Held by this process (watched without a pidfd under valgrind 3.19, which does not
        # know pidfd_open: polled), pinned, released, then freed by force.
        self.assertTrue(call("familyd.v1.FamilyService/PinBuild",
                             {"buildId": build.build_id}).ok)
        self.assertTrue(call("familyd.v1.FamilyService/ReleaseBuild",
                             {"buildId": build.build_id}).ok)
        rel = call("familyd.v1.FamilyService/ReleaseBuild",
                   {"buildId": build.build_id, "force": True})
        self.assertTrue(rel.ok and rel.reply.freed, rel)
        self.assertTrue(call("familyd.v1.MeshService/DeleteMesh", {"meshId": mesh_id}).ok)

        # A holder process that exits: seen by the poll (no pidfds under valgrind), its build
        # starts its grace period, then is freed by force.
        holder = subprocess.Popen([sys.executable, HOLDER, d.socket], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        holder.stdin.write(json.dumps({"op": "build", "request": {
            "family": "grouped_experts", "config": CONFIG, "privateBuild": True,
            "materialize": {"enabled": True}}}) + "\n")
        holder.stdin.flush()
        held = json.loads(holder.stdout.readline())
        self.assertEqual(held["code"], "OK", held)
        got = call("familyd.v1.FamilyService/GetBuild", {"buildId": held["build_id"]})
        self.assertEqual([r.pid for r in got.reply.references], [holder.pid])
        holder.stdin.write(json.dumps({"op": "exit"}) + "\n")
        holder.stdin.close()
        self.assertEqual(holder.wait(timeout=60), 0)
        holder.stdout.close()
        deadline = time.monotonic() + 30
        while True:
            got = call("familyd.v1.FamilyService/GetBuild", {"buildId": held["build_id"]})
            if not got.reply.references:
                break
            self.assertLess(time.monotonic(), deadline, "the exited holder still holds: %s" % got)
            time.sleep(0.2)
        self.assertGreater(got.reply.grace_deadline_unix_ms, 0)
        self.assertTrue(call("familyd.v1.FamilyService/ReleaseBuild",
                             {"buildId": held["build_id"], "force": True}).ok)
        self.assertTrue(call("familyd.v1.AdminService/Reload").ok)

        rc = d.stop(timeout=120, expect_status=None)
        log = d.valgrind_log()
        self.assertEqual(rc, 0, "familyd under valgrind exited %d:\n%s" % (rc, log[-6000:]))
        self.assertNotIn("definitely lost", log, log[-6000:])
        self.assertNotIn("Invalid ", log, log[-6000:])
        print("valgrind session: %.1f s, exit 0, valgrind log %d bytes"
              % (time.monotonic() - t0, len(log)))


if __name__ == "__main__":
    if not VALGRIND:
        print("SKIP: valgrind not installed")
        sys.exit(H.SKIP)
    if sanitizer_build(H.familyd_bin()):
        print("SKIP: %s is built with sanitizers; valgrind needs a plain build"
              % H.familyd_bin())
        sys.exit(H.SKIP)
    unittest.main(verbosity=2)
