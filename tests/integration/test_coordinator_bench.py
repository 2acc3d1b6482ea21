#!/usr/bin/python3
"""coord-bench's smoke run (tests/bench/coord-bench.py --smoke): 50 simulated members against a real
etcd and 2 real daemons in etcd mode. It runs, prints its tables, every daemon sees every member
up, and the daemons stop cleanly; the 10 s goal is the full run's (docs/benchmarks.md)."""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import etcd_harness  # noqa: E402

BENCH = os.path.join(HERE, "..", "bench", "coord-bench.py")


class TestCoordBenchSmoke(unittest.TestCase):
    def test_smoke(self):
        etcd_harness.require_etcd()
        r = subprocess.run([sys.executable, BENCH, "--smoke"], capture_output=True, text=True,
                           timeout=240)
        print(r.stdout)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for heading in ("== join: 50 simulated members", "== watch traffic from etcd per daemon",
                        "== CPU at rest", "goal "):
            self.assertIn(heading, r.stdout)
        self.assertEqual(r.stdout.count("| real"), 6)   # 2 daemons in each of 3 tables
        self.assertNotIn("| never |", r.stdout)


if __name__ == "__main__":
    unittest.main()
