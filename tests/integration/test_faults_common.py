"""What the fault tests (test_faults_*.py) share: a healthy client that keeps calling while a
fault happens, and the daemon's own descriptor and memory counts from /proc.

Not a test itself (tests/integration/meson.build does not register it).
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
# grouped_experts of the conformance registry: 4 experts, 8 wide: 4*8*8*4 + 4*4*8*4 bytes.
SMALL = {"fields": {"num_experts": {"intValue": 4}, "hidden_size": {"intValue": 8},
                    "moe_intermediate_size": {"intValue": 4},
                    "initializer_range": {"doubleValue": 0.02}}}
SMALL_BYTES = 4 * 8 * 8 * 4 + 4 * 4 * 8 * 4
# 64 experts, 1024 wide, 512 intermediate: 384 MiB of float32, a fill of a second or more.
BIG = {"fields": {"num_experts": {"intValue": 64}, "hidden_size": {"intValue": 1024},
                  "moe_intermediate_size": {"intValue": 512},
                  "initializer_range": {"doubleValue": 0.02}}}


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_for(predicate, timeout, interval=0.05):
    """Polls predicate() until it is true or timeout passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


class HealthyClient:
    """A client of its own (own channel, own connection) that keeps calling while a fault
    happens elsewhere: Resolve, a small materialising Build, a fetch of its shard over the
    shard socket, ReleaseBuild, Health. Every answer must be right; stop() returns the
    problems seen and the slowest call.

        with HealthyClient(daemon) as hc:
            ... the fault ...
        self.assertEqual(hc.problems, [])
    """

    def __init__(self, daemon, build=True, shards=True):
        self.daemon = daemon
        self.build = build
        self.shards = shards
        self.problems = []
        self.calls = 0
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        # At least one round before the fault.
        wait_for(lambda: self.calls > 0 or self.problems, 30)
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def stop(self):
        self._stop.set()
        self._thread.join(60)
        if self._thread.is_alive():
            self.problems.append("the healthy client is stuck in a call")
        return self.problems

    def _check(self, what, res, elapsed_limit=10.0):
        self.slowest = max(self.slowest, res.elapsed)
        if not res.ok:
            self.problems.append("%s: %s %s" % (what, res.code, res.message))
            return False
        return True

    def _run(self):
        import shard_client as SC
        c = H.Client(self.daemon.socket, self.daemon.protos)
        try:
            while not self._stop.is_set():
                r = c.call("familyd.v1.FamilyService/Resolve",
                           {"family": "grouped_experts", "context": {"epSize": 2, "ep": True}})
                if self._check("Resolve", r) and r.reply.resolved.variant != "grouped_ep":
                    self.problems.append("Resolve: variant %s" % r.reply.resolved.variant)
                if self.build:
                    b = c.call("familyd.v1.FamilyService/Build",
                               {"family": "grouped_experts", "config": SMALL,
                                "materialize": {"enabled": True, "seed": "5"}})
                    if self._check("Build", b):
                        build = b.reply.build
                        if self.shards:
                            try:
                                reply, fds = SC.fetch(build.shard_socket, self.daemon.protos,
                                                      [build.shards[0].token])
                                for fd in fds:
                                    os.close(fd)
                                if reply.code != 0 or len(fds) != 1 or \
                                        reply.sizes[0] != SMALL_BYTES:
                                    self.problems.append("shard fetch: code %d %s, %d fds"
                                                         % (reply.code, reply.message, len(fds)))
                            except (OSError, EOFError, AssertionError) as e:
                                self.problems.append("shard fetch: %r" % e)
                        self._check("ReleaseBuild",
                                    c.call("familyd.v1.FamilyService/ReleaseBuild",
                                           {"buildId": build.build_id}))
                h = c.health()
                if self._check("Health", h) and h.reply.status != 1:
                    self.problems.append("Health: status %d" % h.reply.status)
                self.calls += 1
                time.sleep(0.01)
        except Exception as e:  # pragma: no cover - reported by the test
            self.problems.append("healthy client crashed: %r" % e)
        finally:
            c.close()
