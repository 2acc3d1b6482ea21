#!/usr/bin/python3
"""A rank of a familyd.torch job SIGKILLed mid-step: the others fail as torch fails, and the
job's builds go after the grace period.

One daemon (--host-devices 4, --build-grace-ms GRACE_MS) with the example registry. Four worker
processes of this file, started by torchrun (`python -m torch.distributed.run`; the workers
ignore SIGTERM, with which torchrun stops the others once one has failed, so that the survivors
fail on their own: torchrun waits for them), join the job
with familyd.torch.init (a process-group timeout of PG_TIMEOUT seconds), lay a dp=2,tp=2 mesh
over it, build an RMSNorm and a tensor-parallel SwiGLU MLP through build_module (a training
handout per module and process) and train with AdamW, all-reducing the gradients over dp. Torch
rank KILLED kills itself with SIGKILL at step KILL_STEP, after its forward and before its
backward. Every other rank must get a RuntimeError from gloo, uncaught (exit status 1), and
every worker must have exited within EXIT_BOUND seconds of the kill (torchrun exits 1 and names
the killed rank's signal); once all have exited, the job's builds must be gone
after the grace period (ListBuilds empty, shm in use back to where it was, none in grace), and
the daemon still serves a new build.
"""

import json
import re
import os
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(SOURCE_ROOT, "client", "python")
sys.path.insert(0, PACKAGE)
SKIP = 77

GRACE_MS = 1000
PG_TIMEOUT = 5           # seconds: torch.distributed's collective timeout
EXIT_BOUND = 45          # seconds from the kill to the last survivor's exit (PG_TIMEOUT + slack)
WORKER_TIMEOUT = 180
STEPS, KILL_STEP, KILLED, WORLD = 5, 2, 3, 4
CFG = {"hidden_size": 16, "intermediate_size": 32, "initializer_range": 0.02}
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE")


def _write(outdir, rank, what, **fields):
    path = os.path.join(outdir, "%d.%s.json" % (rank, what))
    with open(path + ".tmp", "w") as f:
        json.dump(fields, f)
    os.rename(path + ".tmp", path)


def worker(outdir, socket_path):
    """One rank of the job. Writes RANK.ready.json once built, RANK.killing.json just before
    killing itself (rank KILLED), RANK.error.json with the exception that ends it."""
    import torch
    import torch.distributed as dist
    import familyd
    import familyd.torch as FT

    rank = int(os.environ["RANK"])
    # What is under test is how a survivor fails by itself (gloo's error, uncaught), not how
    # torchrun stops it: torchrun's SIGTERM to the others is ignored, and it waits for them.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # This rank's own stderr: the survivors' uncaught tracebacks would interleave in one stream.
    err = os.open(os.path.join(outdir, "%d.stderr" % rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    os.close(err)
    client = familyd.Client(socket_path)
    job = FT.init(client, timeout=PG_TIMEOUT)
    jm = FT.job_mesh(client, job, {"dp": 2, "tp": 2})
    norm = FT.build_module(client, "norm", CFG, mesh=jm, fqn="layers.0.norm", seed=1)
    mlp = FT.build_module(client, "mlp", CFG, mesh=jm, fqn="layers.0.mlp", seed=1)
    model = torch.nn.Sequential(norm, mlp)
    peers = {}
    for axis in ("dp", "tp"):           # who is in this rank's group of each axis
        got = [None] * dist.get_world_size(jm.groups[axis])
        dist.all_gather_object(got, rank, group=jm.groups[axis])
        peers[axis] = got
    _write(outdir, rank, "ready", pid=os.getpid(),
           builds=[FT.build_info(m).build_id for m in (norm, mlp)],
           variant=FT.build_info(mlp).member.variant, peers=peers,
           order=[name for name, _ in FT.mesh_groups(jm.mesh)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dp = jm.groups["dp"]
    gen = torch.Generator()
    step = -1
    try:
        for step in range(STEPS):
            gen.manual_seed(100 * step + dist.get_rank(dp))
            x = torch.randn(4, CFG["hidden_size"], generator=gen)
            loss = model(x).pow(2).mean()
            if rank == KILLED and step == KILL_STEP:
                _write(outdir, rank, "killing", at=time.time(), step=step)
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            for p in model.parameters():
                grad = p.grad.to_local()          # build_module's parameters are DTensors
                dist.all_reduce(grad, group=dp)
                grad /= 2
            opt.step()
            opt.zero_grad()
    except BaseException as e:
        _write(outdir, rank, "error", type=type(e).__name__, message=str(e)[:2000], step=step,
               at=time.time())
        raise
    _write(outdir, rank, "error", type=None, message="finished every step", step=step,
           at=time.time())


class KilledRank(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import familyd
        import familyd_harness as H
        cls.H = H
        cls.daemon = H.Daemon(registry=os.path.join(SOURCE_ROOT, "deploy", "registry"),
                              host_devices=4, node_name="itest-torch-killed",
                              extra_args=["--build-grace-ms", str(GRACE_MS)])
        cls.daemon.start()
        cls.client = familyd.Client(cls.daemon.socket,
                                    protos=familyd.Protos(H.descriptor_set_path()))

    @classmethod
    def tearDownClass(cls):
        try:
            cls.client.close()
            cls.daemon.stop_checked()
        finally:
            cls.daemon.cleanup()

    def status(self):
        return self.client.call("familyd.v1.AdminService/GetStatus",
                                self.client.protos.cls("familyd.v1.GetStatusRequest")())

    def launch(self, outdir, world=4):
        """torchrun: the workers of one node of `world` processes (each left to fail on its
        own: see the worker)."""
        env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
        env.update(FAMILYD_DESCRIPTORS=self.H.descriptor_set_path(), OMP_NUM_THREADS="1",
                   GLOO_SOCKET_IFNAME="lo", PYTHONPATH=PACKAGE)
        log = open(os.path.join(outdir, "launch.log"), "wb")
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                 str(world), "--master-addr", "127.0.0.1", "--master-port",
                 str(self.H.free_port()),
                 os.path.abspath(__file__), "--worker", outdir, self.daemon.socket],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    def read(self, outdir, rank, what):
        path = os.path.join(outdir, "%d.%s.json" % (rank, what))
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def log(self, outdir):
        with open(os.path.join(outdir, "launch.log"), "rb") as f:
            return f.read().decode(errors="replace")[-6000:]

    def test_killed_rank(self):
        import tempfile
        outdir = tempfile.mkdtemp(prefix="fd-killed-", dir=self.daemon.tmpdir)
        shm_before = self.status().shm_bytes_in_use
        launcher = self.launch(outdir)
        try:
            status = launcher.wait(WORKER_TIMEOUT)
        finally:
            if launcher.poll() is None:
                launcher.kill()       # its workers then die of their broken process group
                launcher.wait()
        all_exited = time.monotonic()
        ended = time.time()
        logs = self.log(outdir)
        # torchrun fails the job and names the killed rank's signal
        self.assertEqual(status, 1, logs)
        self.assertRegex(logs, r"rank\s*:\s*%d \(local_rank: %d\)\s+exitcode\s*:\s*-%d"
                         % (KILLED, KILLED, signal.SIGKILL))

        ready = [self.read(outdir, r, "ready") for r in range(WORLD)]
        self.assertNotIn(None, ready, logs)
        # trained modules: a training handout per module and process
        builds = [b for r in ready for b in r["builds"]]
        self.assertEqual(len(set(builds)), 2 * WORLD, logs)
        for rank, r in enumerate(ready):
            self.assertEqual(r["variant"], "tensor_parallel")
            # the process groups: row-major over torch ranks, created in the same order
            self.assertEqual(r["order"], ["dp", "tp"])
            self.assertEqual(r["peers"], {"dp": [rank % 2, rank % 2 + 2],
                                          "tp": [rank // 2 * 2, rank // 2 * 2 + 1]})

        killing = self.read(outdir, KILLED, "killing")
        self.assertIsNotNone(killing, logs)
        self.assertIsNone(self.read(outdir, KILLED, "error"), logs)   # killed, not failed
        # Every other rank raised gloo's RuntimeError, uncaught (exit status 1), and all had
        # exited (torchrun waits for every worker) within the bound.
        self.assertLess(ended - killing["at"], EXIT_BOUND, logs)
        for rank in range(WORLD):
            if rank == KILLED:
                continue
            err = self.read(outdir, rank, "error")
            self.assertIsNotNone(err, "rank %d wrote no error:\n%s" % (rank, logs))
            self.assertEqual(err["type"], "RuntimeError", "rank %d: %s\n%s" % (rank, err, logs))
            self.assertLessEqual(err["step"], KILL_STEP + 1, err)
            sys.stderr.write("rank %d: %.2f s after the kill, at step %d: %s: %s\n"
                             % (rank, err["at"] - killing["at"], err["step"], err["type"],
                                err["message"][:200]))
        for rank in range(WORLD):                               # each survivor's, uncaught
            with open(os.path.join(outdir, "%d.stderr" % rank), "rb") as f:
                text = f.read().decode(errors="replace")
            # torch 2 prefixes each line of an uncaught traceback with "[rankN]: "
            uncaught = re.search(r"^(\[rank\d+\]: )?Traceback \(most recent call last\)", text,
                                 re.M) is not None and \
                re.search(r"^(\[rank\d+\]: )?RuntimeError: ", text, re.M) is not None
            self.assertEqual(uncaught, rank != KILLED, "rank %d:\n%s" % (rank, text[-3000:]))
        sys.stderr.write("all exited %.2f s after the kill\n" % (ended - killing["at"]))

        # Every holder is gone: after the grace period nothing of the job remains.
        while time.monotonic() < all_exited + GRACE_MS / 1000 + 10:
            if not self.client.list_builds():
                break
            time.sleep(0.1)
        gone_after = time.monotonic() - all_exited
        sys.stderr.write("builds gone %.2f s after the last process exited (grace %d ms)\n"
                         % (gone_after, GRACE_MS))
        self.assertEqual([b.build_id for b in self.client.list_builds()], [],
                         "builds of the job remain %.1f s after its processes exited" % gone_after)
        st = self.status()
        self.assertEqual((st.builds, st.builds_in_grace, st.shm_bytes_in_use),
                         (0, 0, shm_before))
        for build_id in builds:
            import familyd
            with self.assertRaises(familyd.FamilydError) as cm:
                self.client.get_build(build_id)
            self.assertEqual(cm.exception.code.name, "NOT_FOUND")
        # the daemon serves the next job
        with self.client.build("norm", config=CFG, seed=1) as b:
            self.assertEqual(list(b.ranks), [0])


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the machine
        sys.stderr.write("test_torch_killed_rank: torch missing (bash deploy/dev/python-env.sh)\n")
        sys.exit(1 if os.environ.get("CI") else SKIP)
    unittest.main()
