#!/usr/bin/python3
"""The fill pool (docs/semantics.md, "Fill threads"): started once, shared, cancellable.

The real familyd fills every Build's shards on one pool of threads started with it:
- a thousand small materialising Builds (Build, then ReleaseBuild) start no thread: the
  daemon's Threads (/proc/PID/status), sampled all along, never move;
- two large Builds filling at once both progress (GetStatus builds_in_flight), and a small
  Build meanwhile is answered before either ends (it does not wait for a build thread);
- a Build whose only caller cancels its call stops within a chunk or so: WatchBuild says FAILED
  with far fewer bytes than the total, soon, and the shared memory in use is back where it was;
- SIGTERM during a large fill: the daemon exits 0 within a second.
"""

import os
import sys
import threading
import time
import unittest

import grpc
from google.protobuf import json_format

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
BUILD = "familyd.v1.FamilyService/Build"
RELEASE = "familyd.v1.FamilyService/ReleaseBuild"
STATUS = "familyd.v1.AdminService/GetStatus"
WATCH = "familyd.v1.FamilyService/WatchBuild"
FILLING, DONE, FAILED = 1, 2, 3
CHUNK_BYTES = (1 << 16) * 4  # core/fill.c FILL_CHUNK float32 elements


def config(experts, hidden, inter):
    return {"fields": {"num_experts": {"intValue": experts}, "hidden_size": {"intValue": hidden},
                       "moe_intermediate_size": {"intValue": inter},
                       "initializer_range": {"doubleValue": 0.02}}}


def size_of(experts, hidden, inter):
    return experts * hidden * inter * 3 * 4


SMALL = (4, 128, 128)       # 768 KiB: three chunks and a bit, so a fill with helpers
LARGE = (128, 1024, 768)    # 1.125 GiB


def request(dims, seed, tag=None):
    r = {"family": "grouped_experts", "config": config(*dims), "privateBuild": True,
         "materialize": {"enabled": True, "seed": str(seed)}}
    if tag:
        r["progressTag"] = tag
    return r


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line")


class Base(unittest.TestCase):
    extra_args = ()

    def setUp(self):
        self.daemon = H.Daemon(registry=REGISTRY, host_devices=1, extra_args=self.extra_args)
        self.daemon.start()
        self.addCleanup(self.daemon.cleanup)

    def client(self):
        c = H.Client(self.daemon.socket, self.daemon.protos)
        self.addCleanup(c.close)
        return c

    def build_future(self, c, req, timeout=600):
        path, req_cls, resp_cls, _ = c.protos.method(BUILD)
        fn = c.channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=resp_cls.FromString)
        return fn.future(json_format.ParseDict(req, req_cls()), timeout=timeout)

    def in_flight(self, c, tag):
        st = c.call(STATUS)
        self.assertTrue(st.ok, st)
        return [p for p in st.reply.builds_in_flight if p.progress_tag == tag]

    def wait_filling(self, c, tag, at_least=1, deadline=120):
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            p = self.in_flight(c, tag)
            if p and p[0].bytes_filled >= at_least:
                return p[0]
            time.sleep(0.005)
        self.fail("build %s never filled %d bytes" % (tag, at_least))


class TestThreads(Base):
    def test_thread_count_constant_across_1000_builds(self):
        c = self.client()
        pid = self.daemon.proc.pid
        # Warm up: gRPC's own threads and the build threads start on first use.
        for i in range(20):
            res = c.call(BUILD, request(SMALL, i))
            self.assertTrue(res.ok, res)
            self.assertTrue(c.call(RELEASE, {"buildId": res.reply.build.build_id}).ok)
        baseline = threads_of(pid)
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(threads_of(pid))
                time.sleep(0.0005)
        s = threading.Thread(target=sample, daemon=True)
        s.start()
        t0 = time.monotonic()
        for i in range(1000):
            res = c.call(BUILD, request(SMALL, 1000 + i))
            self.assertTrue(res.ok, res)
            self.assertEqual(res.reply.build.shards[0].size_bytes, size_of(*SMALL))
            rel = c.call(RELEASE, {"buildId": res.reply.build.build_id})
            self.assertTrue(rel.ok, rel)
        stop.set()
        s.join()
        print("1000 Builds in %.1f s; Threads %d, %d samples between %d and %d"
              % (time.monotonic() - t0, baseline, len(samples), min(samples), max(samples)))
        self.assertGreater(len(samples), 100)
        self.assertEqual((min(samples), max(samples)), (baseline, baseline))
        self.daemon.stop_checked()


class TestConcurrentFills(Base):
    def test_two_fills_both_progress(self):
        a, b, poller = self.client(), self.client(), self.client()
        fa = self.build_future(a, request(LARGE, 1, "pool-a"))
        fb = self.build_future(b, request(LARGE, 2, "pool-b"))
        both = None
        while not (fa.done() and fb.done()):
            st = poller.call(STATUS)
            if st.ok:
                p = {x.progress_tag: x.bytes_filled for x in st.reply.builds_in_flight}
                if 0 < p.get("pool-a", 0) < size_of(*LARGE) and \
                        0 < p.get("pool-b", 0) < size_of(*LARGE):
                    both = both or (p["pool-a"], p["pool-b"])
            time.sleep(0.01)
        ra, rb = fa.result(), fb.result()
        print("both in flight and filling at once: %s" % (both,))
        self.assertIsNotNone(both, "the two fills never progressed together")
        for r in (ra, rb):
            self.assertTrue(r.build.shards[0].token, r)
            self.assertTrue(a.call(RELEASE, {"buildId": r.build.build_id, "force": True}).ok)
        self.daemon.stop_checked()


class TestSmallBesideLarge(Base):
    def test_small_build_answered_while_two_large_fill(self):
        a, b, small, poller = self.client(), self.client(), self.client(), self.client()
        fa = self.build_future(a, request(LARGE, 5, "pool-big-a"))
        fb = self.build_future(b, request(LARGE, 6, "pool-big-b"))
        self.wait_filling(poller, "pool-big-a")
        self.wait_filling(poller, "pool-big-b")
        t0 = time.monotonic()
        res = small.call(BUILD, request(SMALL, 7))
        took = time.monotonic() - t0
        self.assertTrue(res.ok, res)
        filling = {p.progress_tag: p.bytes_filled for p in poller.call(STATUS).reply.builds_in_flight
                   if p.state == FILLING}
        print("a small Build beside two large fills: answered after %.3f s; the large ones "
              "still filling: %s" % (took, filling))
        # With two build threads (before 2026-12-07) it waited for one of the large fills.
        self.assertFalse(fa.done() or fb.done(), "a large fill ended before the small Build")
        self.assertEqual(sorted(filling), ["pool-big-a", "pool-big-b"])
        self.assertTrue(small.call(RELEASE, {"buildId": res.reply.build.build_id}).ok)
        fa.cancel()
        fb.cancel()
        a.close()
        b.close()
        self.daemon.stop_checked()


class TestCancel(Base):
    def test_cancelled_fill_stops_and_frees_its_memory(self):
        caller, poller = self.client(), self.client()
        before = poller.call(STATUS).reply.shm_bytes_in_use
        fut = self.build_future(caller, request(LARGE, 3, "pool-cancel"))
        seen = self.wait_filling(poller, "pool-cancel", at_least=4 * CHUNK_BYTES)
        t0 = time.monotonic()
        fut.cancel()
        caller.close()  # every caller gone
        msgs = list(poller.stream(WATCH, {"progressTag": "pool-cancel"}, timeout=30))
        ended = time.monotonic() - t0
        last = msgs[-1]
        self.assertEqual(last.state, FAILED, msgs)
        self.assertEqual(last.error, "the call ended (deadline or shutdown) while "
                                     "materialising; nothing was kept")
        after_cancel = last.bytes_filled - seen.bytes_filled
        print("cancelled at %d bytes, stopped at %d (+%d, %.1f chunks), FAILED after %.3f s"
              % (seen.bytes_filled, last.bytes_filled, after_cancel,
                 after_cancel / CHUNK_BYTES, ended))
        # Without the pool's cancel the rank's fill ran to its end (all 1.125 GiB).
        self.assertLess(last.bytes_filled, size_of(*LARGE) // 2)
        self.assertLess(ended, 1.0)
        # Its memory is back: the shared memory in use is what it was before.
        end = time.monotonic() + 5
        while poller.call(STATUS).reply.shm_bytes_in_use != before and time.monotonic() < end:
            time.sleep(0.01)
        self.assertEqual(poller.call(STATUS).reply.shm_bytes_in_use, before)
        lb = poller.call("familyd.v1.FamilyService/ListBuilds")
        self.assertEqual([b.build_id for b in lb.reply.builds], [])
        self.daemon.stop_checked()


class TestSigterm(Base):
    def test_sigterm_during_a_large_fill_exits_within_a_second(self):
        caller, poller = self.client(), self.client()
        fut = self.build_future(caller, request(LARGE, 4, "pool-term"))
        self.wait_filling(poller, "pool-term", at_least=4 * CHUNK_BYTES)
        poller.close()
        t0 = time.monotonic()
        self.daemon.signal(15)
        self.daemon.proc.wait(30)
        took = time.monotonic() - t0
        print("SIGTERM during a 1.125 GiB fill: exit %d after %.3f s"
              % (self.daemon.proc.returncode, took))
        self.assertEqual(self.daemon.proc.returncode, 0, self.daemon.output()[-3000:])
        self.assertLess(took, 1.0)
        with self.assertRaises(grpc.RpcError) as e:
            fut.result(timeout=30)
        # Answered (the daemon's stop) or cut off with the connection: never a build.
        self.assertIn(e.exception.code(), (grpc.StatusCode.DEADLINE_EXCEEDED,
                                           grpc.StatusCode.UNAVAILABLE,
                                           grpc.StatusCode.CANCELLED))
        err = self.daemon.stderr()
        self.assertNotIn("runtime error:", err)
        self.assertNotIn("Sanitizer", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
