#!/usr/bin/python3
"""A materialising Build's progress: WatchBuild, GetStatus and ListBuilds while it fills.

A Build of over 1 GiB (1.125 GiB: grouped_experts, float32) runs on one thread with a progress_tag; a second
thread watches it by tag with WatchBuild: the bytes never go down, reach the total, and the
stream ends after the final state (DONE, naming the id Build answered). GetStatus and
ListBuilds show the build in flight meanwhile. A watcher that goes away mid-fill leaves the
build intact (another watcher still sees it end). A Build whose call ends mid-fill is FAILED
with the Build's own text. Unknown ids and tags, both or neither, and over-long names are
refused with the texts of docs/semantics.md.
"""

import os
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
# grouped_experts holds E*H*2I + E*I*H float32 elements: 128 * 1024 * 768 * 12 bytes.
GIB = 128 * 1024 * 768 * 12
assert GIB >= 1 << 30
CONFIG_1GIB = {"fields": {"num_experts": {"intValue": 128}, "hidden_size": {"intValue": 1024},
                          "moe_intermediate_size": {"intValue": 768},
                          "initializer_range": {"doubleValue": 0.02}}}
WATCH = "familyd.v1.FamilyService/WatchBuild"
FILLING, DONE, FAILED = 1, 2, 3


def build_request(tag, config=CONFIG_1GIB, seed="7"):
    return {"family": "grouped_experts", "config": config, "progressTag": tag,
            "privateBuild": True, "materialize": {"enabled": True, "seed": seed}}


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = H.Daemon(registry=REGISTRY, host_devices=1)
        cls.daemon.start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop_checked()

    def client(self):
        c = H.Client(self.daemon.socket, self.daemon.protos)
        self.addCleanup(c.close)
        return c

    def start_build(self, tag, timeout=600, **kw):
        """Build on a thread of its own, over its own connection; returns (thread, result)."""
        result = {}
        c = self.client()

        def run():
            result["res"] = c.call("familyd.v1.FamilyService/Build", build_request(tag, **kw),
                                   timeout=timeout)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, result

    def open_watch(self, c, request, deadline=60):
        """WatchBuild, retried while the build is not known yet (NOT_FOUND); the stream and
        its first message."""
        end = time.monotonic() + deadline
        while True:
            it = c.stream(WATCH, request, timeout=600)
            try:
                return it, next(it)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND or time.monotonic() > end:
                    raise
            time.sleep(0.01)

    def release(self, build_id):
        res = self.client().call("familyd.v1.FamilyService/ReleaseBuild",
                                 {"buildId": build_id, "force": True})
        self.assertTrue(res.ok, res)


class TestWatchBuild(Base):
    def test_1gib_build_watched_by_tag(self):
        t, result = self.start_build("progress-1gib")
        watcher = self.client()
        seen, in_status, in_list = [], [], []
        errors = []

        def watch():
            try:
                it, first = self.open_watch(watcher, {"progressTag": "progress-1gib"})
                seen.append(first)
                for msg in it:
                    seen.append(msg)
            except grpc.RpcError as e:
                errors.append("%s %s" % (e.code(), e.details()))
        w = threading.Thread(target=watch, daemon=True)
        w.start()

        poller = self.client()
        while t.is_alive():
            st = poller.call("familyd.v1.AdminService/GetStatus")
            if st.ok:
                in_status += [p for p in st.reply.builds_in_flight
                              if p.progress_tag == "progress-1gib"]
            lb = poller.call("familyd.v1.FamilyService/ListBuilds")
            if lb.ok:
                in_list += [p for p in lb.reply.in_flight if p.progress_tag == "progress-1gib"]
            time.sleep(0.05)
        t.join()
        w.join(60)
        self.assertFalse(w.is_alive(), "the stream did not end after the final state")
        self.assertEqual(errors, [])
        res = result["res"]
        self.assertTrue(res.ok, res)
        build_id = res.reply.build.build_id
        self.addCleanup(self.release, build_id)

        self.assertGreater(len(seen), 2, seen)
        filled = [m.bytes_filled for m in seen]
        self.assertEqual(filled, sorted(filled), "progress went backwards: %s" % filled)
        self.assertTrue(all(m.bytes_total == GIB for m in seen), seen[:3])
        self.assertTrue(all(m.build_id == build_id for m in seen))
        self.assertTrue(all(m.family == "grouped_experts" for m in seen))
        self.assertEqual([m.state for m in seen[:-1]], [FILLING] * (len(seen) - 1))
        last = seen[-1]
        self.assertEqual((last.state, last.bytes_filled, last.error), (DONE, GIB, ""))
        self.assertTrue(any(0 < m.bytes_filled < GIB for m in seen),
                        "no message while filling: %s" % filled)
        self.assertGreater(last.bytes_per_second, 0)
        self.assertGreater(last.started_unix_ms, 0)
        print("%d messages over %.1f s, %.0f MB/s" % (len(seen), last.elapsed_ms / 1000,
                                                        last.bytes_per_second / 1e6))

        # In flight meanwhile: GetStatus and ListBuilds showed it FILLING, under its id.
        self.assertTrue(in_status, "GetStatus never showed the build in flight")
        self.assertTrue(in_list, "ListBuilds never showed the build in flight")
        for p in in_status + in_list:
            self.assertEqual((p.build_id, p.state, p.bytes_total), (build_id, FILLING, GIB))
        # Once done it is a live build, not in flight.
        lb = poller.call("familyd.v1.FamilyService/ListBuilds")
        self.assertIn(build_id, [b.build_id for b in lb.reply.builds])
        self.assertNotIn(build_id, [p.build_id for p in lb.reply.in_flight])

        # A late watcher, by id: the final state at once, then the end of the stream.
        late = list(watcher.stream(WATCH, {"buildId": build_id}, timeout=30))
        self.assertEqual([(m.state, m.bytes_filled) for m in late], [(DONE, GIB)])

    def test_a_watcher_that_goes_away_leaves_the_build_intact(self):
        t, result = self.start_build("progress-leaver", seed="8")
        leaver, stayer = self.client(), self.client()
        it, first = self.open_watch(leaver, {"progressTag": "progress-leaver"})
        got = [first]
        for msg in it:
            got.append(msg)
            if len(got) >= 2:
                break
        it.cancel()
        leaver.close()
        self.assertEqual(got[0].state, FILLING, got)

        stay, first = self.open_watch(stayer, {"buildId": got[0].build_id})
        rest = [first] + list(stay)
        t.join()
        res = result["res"]
        self.assertTrue(res.ok, res)
        self.addCleanup(self.release, res.reply.build.build_id)
        self.assertEqual(res.reply.build.build_id, got[0].build_id)
        self.assertEqual((rest[-1].state, rest[-1].bytes_filled), (DONE, GIB))
        got_build = self.client().call("familyd.v1.FamilyService/GetBuild",
                                       {"buildId": got[0].build_id})
        self.assertTrue(got_build.ok, got_build)
        self.assertTrue(got_build.reply.shards[0].token)

    def test_a_build_whose_call_ends_is_failed(self):
        t, result = self.start_build("progress-deadline", timeout=1.5, seed="9")
        c = self.client()
        try:
            it, first = self.open_watch(c, {"progressTag": "progress-deadline"}, deadline=1.5)
        except grpc.RpcError as e:
            self.skipTest("the Build ended before its fill could be watched: %s" % e.code())
        msgs = [first] + list(it)
        t.join()
        self.assertEqual(result["res"].code, "DEADLINE_EXCEEDED", result["res"])
        last = msgs[-1]
        self.assertEqual(last.state, FAILED, msgs)
        self.assertEqual(last.error, "the call ended (deadline or shutdown) while "
                                     "materialising; nothing was kept")
        lb = c.call("familyd.v1.FamilyService/ListBuilds")
        self.assertNotIn(last.build_id, [b.build_id for b in lb.reply.builds])


class TestPythonClient(Base):
    """familyd.Client.build(progress_tag=...) and watch_build()."""

    def test_watch_build_from_python(self):
        sys.path.insert(0, os.path.join(H.SOURCE_ROOT, "client", "python"))
        os.environ.setdefault("FAMILYD_DESCRIPTORS", H.descriptor_set_path())
        try:
            import familyd
        except ImportError as e:
            self.skipTest("the Python package does not import here: %s" % e)
        builder = familyd.Client(self.daemon.socket, timeout=600)
        result = {}
        t = threading.Thread(target=lambda: result.update(b=builder.build(
            "grouped_experts", config={"num_experts": 64, "hidden_size": 1024,
                                       "moe_intermediate_size": 512,
                                       "initializer_range": 0.02},
            seed=21, private_build=True, map_shards=False, progress_tag="py-tag")), daemon=True)
        t.start()
        watcher = familyd.Client(self.daemon.socket, timeout=30)
        seen, end = [], time.monotonic() + 60
        while not seen:
            try:
                seen = list(watcher.watch_build(progress_tag="py-tag", timeout=600))
            except familyd.FamilydError as e:
                if e.code_name != "NOT_FOUND" or time.monotonic() > end:
                    raise
                time.sleep(0.01)
        t.join()
        b = result["b"]
        self.addCleanup(self.release, b.id)
        self.assertEqual((seen[-1].state, seen[-1].build_id), (DONE, b.id))
        self.assertEqual(seen[-1].bytes_filled, 384 << 20)
        filled = [m.bytes_filled for m in seen]
        self.assertEqual(filled, sorted(filled))


class TestWatchBuildErrors(Base):
    def expect(self, request, code, reason, message, rpc=WATCH):
        c = self.client()
        if rpc == WATCH:
            res = c.stream_first(WATCH, request, timeout=10)
        else:
            res = c.call(rpc, request, timeout=10)
        self.assertEqual((res.code, res.message), (code, message), res)
        _st, infos = c.error_details(res)
        self.assertEqual([i.reason for i in infos], [reason])

    def test_unknown_id_and_tag(self):
        self.expect({"buildId": "bld-00000000-99"}, "NOT_FOUND", "BUILD_NOT_FOUND",
                    "no build in flight with id 'bld-00000000-99'")
        self.expect({"progressTag": "no-such-tag"}, "NOT_FOUND", "BUILD_NOT_FOUND",
                    "no build in flight with progress tag 'no-such-tag'")

    def test_exactly_one_name(self):
        for req in ({}, {"buildId": "bld-1", "progressTag": "t"}):
            with self.subTest(request=req):
                self.expect(req, "INVALID_ARGUMENT", "BAD_REQUEST",
                            "give exactly one of build_id and progress_tag")

    def test_limits(self):
        long = "x" * 257
        self.expect({"progressTag": long}, "INVALID_ARGUMENT", "LIMIT",
                    "progress_tag is longer than 256 bytes")
        self.expect({"buildId": long}, "INVALID_ARGUMENT", "LIMIT",
                    "build_id is longer than 256 bytes")
        self.expect(build_request(long), "INVALID_ARGUMENT", "LIMIT",
                    "progress_tag is longer than 256 bytes",
                    rpc="familyd.v1.FamilyService/Build")

    def test_a_layout_only_build_is_not_followed(self):
        c = self.client()
        req = build_request("layout-only")
        del req["materialize"]
        res = c.call("familyd.v1.FamilyService/Build", req)
        self.assertTrue(res.ok, res)
        self.expect({"progressTag": "layout-only"}, "NOT_FOUND", "BUILD_NOT_FOUND",
                    "no build in flight with progress tag 'layout-only'")


if __name__ == "__main__":
    unittest.main(verbosity=2)
