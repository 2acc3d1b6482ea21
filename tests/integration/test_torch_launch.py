#!/usr/bin/python3
"""python3 -m familyd.torch.launch: torchrun's environment, static ranks, failures, signals.

Real launcher processes running real worker scripts (no torch needed: the workers only report
what they were given). Each worker writes OUT/RANK.json with its environment's torchrun
variables and its arguments.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(SOURCE_ROOT, "client", "python")
TORCHRUN = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_USE_AGENT_STORE"}
INIT_SIX = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}

WORKER = r'''
import json, os, signal, sys, time
out = sys.argv[1]
rank = os.environ["RANK"]
seen = {k: v for k, v in os.environ.items() if k in %r or k == "LAUNCH_TEST_MARK"}
with open(os.path.join(out, rank + ".json"), "w") as f:
    json.dump({"env": seen, "args": sys.argv[2:], "pid": os.getpid()}, f)
mode = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "fail" and rank == "1":
    sys.exit(3)
if mode == "fail":
    time.sleep(60)
if mode == "sleep":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    time.sleep(60)
''' % (sorted(TORCHRUN),)


class TestLaunch(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "out")
        os.mkdir(self.out)
        self.script = os.path.join(self.dir.name, "worker.py")
        with open(self.script, "w") as f:
            f.write(WORKER)

    def tearDown(self):
        self.dir.cleanup()

    def launch(self, *args, wait=True, env_extra=None):
        env = dict(os.environ, PYTHONPATH=PACKAGE, LAUNCH_TEST_MARK="kept",
                   RANK="99", GROUP_RANK="99")
        env.update(env_extra or {})
        argv = ["/usr/bin/python3", "-m", "familyd.torch.launch"] + list(args)
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        if not wait:
            return p
        out, err = p.communicate(timeout=60)
        return p.returncode, out, err

    def seen(self):
        got = {}
        for name in os.listdir(self.out):
            with open(os.path.join(self.out, name)) as f:
                got[int(name.split(".")[0])] = json.load(f)
        return got

    def test_torchrun_environment_and_static_ranks(self):
        rc, _, err = self.launch("--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1",
                                 "--master-port", "31111", self.script, self.out, "x", "--y")
        self.assertEqual(rc, 0, err)
        got = self.seen()
        self.assertEqual(sorted(got), [3, 4, 5])
        for rank, w in got.items():
            env = w["env"]
            self.assertEqual(set(env) - {"LAUNCH_TEST_MARK"}, TORCHRUN, rank)
            self.assertEqual(env["LAUNCH_TEST_MARK"], "kept")   # the launcher's own env passes
            self.assertEqual((env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"],
                              env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["MASTER_ADDR"],
                              env["MASTER_PORT"]),
                             (str(rank), str(rank - 3), "6", "3", "1", "127.0.0.1", "31111"))
            self.assertEqual(w["args"], ["x", "--y"])

    def test_minimal_environment_holds_only_init_variables(self):
        rc, _, err = self.launch("--nproc-per-node", "2", "--minimal-env", self.script, self.out)
        self.assertEqual(rc, 0, err)
        for rank, w in self.seen().items():
            # The caller's own RANK/GROUP_RANK do not leak: only init()'s six remain.
            self.assertEqual(set(w["env"]) - {"LAUNCH_TEST_MARK"}, INIT_SIX, rank)

    def test_a_failed_worker_stops_the_others(self):
        t0 = time.monotonic()
        rc, _, err = self.launch("--nproc-per-node", "3", "--kill-timeout", "2", self.script,
                                 self.out, "fail")
        self.assertEqual(rc, 3)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertIn("worker 1", err)
        self.assertIn("exited with 3; stopping the others", err)

    def test_keep_going_waits_for_every_worker(self):
        p = self.launch("--nproc-per-node", "2", "--keep-going", self.script, self.out, "fail",
                        wait=False)
        time.sleep(3)
        self.assertIsNone(p.poll())          # worker 0 still runs after worker 1 failed
        for w in self.seen().values():
            if w["env"]["RANK"] == "0":
                os.kill(w["pid"], signal.SIGKILL)
        p.communicate(timeout=30)
        self.assertEqual(p.returncode, 3)     # the first failure's status

    def test_sigterm_is_forwarded(self):
        p = self.launch("--nproc-per-node", "2", self.script, self.out, "sleep", wait=False)
        deadline = time.monotonic() + 20
        while len(os.listdir(self.out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        self.assertEqual(p.returncode, 7)

    def test_bad_arguments(self):
        for args, text in ((["--nproc-per-node", "0", self.script], "at least 1"),
                           (["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2",
                             self.script], "--node-rank must be in [0, 2)"),
                           (["--nproc-per-node", "1", "--master-port", "70000", self.script],
                            "--master-port"),
                           (["--nproc-per-node", "1", "/nonexistent.py"], "no such file")):
            rc, _, err = self.launch(*args)
            self.assertEqual(rc, 2, args)
            self.assertIn(text, err)
        self.assertEqual(os.listdir(self.out), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
