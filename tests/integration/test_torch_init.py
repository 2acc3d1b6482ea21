#!/usr/bin/python3
"""familyd.torch.init, create_mesh and process_groups: a torchrun-style job on a real familyd.

One daemon (--host-devices 4, one node). Worker processes of this file are started with
torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT) set by the test itself, so that torch ranks can be given in any order
of LOCAL_RANK (a rendezvous that did not follow familyd's), and gloo. Each calls init() against the daemon, creates the dp=2,tp=2 mesh with the expert view
edp_shard=2,ep=2 over job.familyd_ranks, builds the process groups and all-reduces its torch
rank over each (the sums are what the row-major layout over torch ranks says), all-gathers the
familyd ranks of its tp group, and runs a TPSwiGLUMLP over the tp group against the unsharded
member. job_mesh's torch DeviceMeshes (device and expert view) have familyd's axis names, lay
torch ranks row-major, and give the same groups; a DeviceMesh the job made itself with
init_device_mesh is taken, and one whose names, sizes or rank order differ from familyd's
layout is refused with a sentence on every rank. Torch ranks given in an order other than LOCAL_RANK's (a rendezvous that did not follow
familyd's order) give a mesh in torch's order. Five workers on four devices, and two workers
with the same LOCAL_RANK, fail on every rank with the sentence.
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(SOURCE_ROOT, "client", "python")
sys.path.insert(0, PACKAGE)
SKIP = 77
WORKER_TIMEOUT = 90
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE")

# The row-major layout of dp=2,tp=2 (and edp_shard=2,ep=2) over torch ranks 0..3, written out:
# tp groups {0,1} {2,3}, dp groups {0,2} {1,3}; the sum of the torch ranks of each rank's group.
TP_SUM = {0: 1, 1: 1, 2: 5, 3: 5}
DP_SUM = {0: 2, 1: 4, 2: 2, 3: 4}
TP_PEERS = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
MLP = {"hidden_size": 8, "intermediate_size": 6, "initializer_range": 0.02}


def worker(outdir, socket_path):
    """One process of the job: what it saw goes to OUTDIR/RANK.json."""
    import torch
    import torch.distributed as dist
    import familyd
    import familyd.torch as FT
    from familyd.torch import modules as M

    rank = int(os.environ["RANK"])
    out = {"rank": rank}
    client = familyd.Client(socket_path)
    try:
        job = FT.init(client, timeout=60)
    except FT.JobError as e:
        out["error"] = str(e)
        out["initialized_after"] = dist.is_initialized()
        with open(os.path.join(outdir, "%d.json" % rank), "w") as f:
            json.dump(out, f)
        return
    mesh = FT.create_mesh(client, job, {"dp": 2, "tp": 2}, {"edp_shard": 2, "ep": 2})
    groups = FT.process_groups(job, mesh)
    out.update(familyd_rank=job.familyd_rank, familyd_ranks=job.familyd_ranks,
               local_rank=job.local_rank, world_size=job.world_size,
               mesh_ranks=[int(r) for r in mesh.ranks], axes=sorted(groups), sums={})
    for name, group in groups.items():
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        out["sums"][name] = int(t.item())
    peers = [None] * dist.get_world_size(groups["tp"])
    dist.all_gather_object(peers, job.familyd_rank, group=groups["tp"])
    out["tp_familyd_ranks"] = peers
    ctx = FT.parallel_context(mesh, groups)
    out["context"] = [ctx.tp_size, ctx.ep_size, ctx.cp_size, ctx.pp_size, sorted(ctx.groups)]
    torch.manual_seed(0)                      # the same full weights and input on every rank
    plain = M.PlainSwiGLUMLP(MLP)
    x = torch.randn(5, 8)
    tp = M.TPSwiGLUMLP(MLP, context=ctx)
    part = dist.get_rank(groups["tp"])
    lo, hi = M.chunk_range(6, 2, part)
    with torch.no_grad():
        tp.gate_proj.copy_(plain.gate_proj[lo:hi])
        tp.up_proj.copy_(plain.up_proj[lo:hi])
        tp.down_proj.copy_(plain.down_proj[:, lo:hi])
    out["mlp_error"] = float((tp(x) - plain(x)).abs().max() / plain(x).abs().max())
    device_meshes(client, job, out)
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(outdir, "%d.json" % rank), "w") as f:
        json.dump(out, f)


def device_meshes(client, job, out):
    """job_mesh's DeviceMeshes, a user's init_device_mesh taken, mismatched ones refused."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    import familyd.torch as FT

    rank = dist.get_rank()
    jm = FT.job_mesh(client, job, {"dp": 2, "tp": 2}, {"edp_shard": 2, "ep": 2})
    out["meshes"] = {}
    for what, dm in (("device", jm.device_mesh), ("expert", jm.expert_mesh)):
        sums = {}
        for name in dm.mesh_dim_names:
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=dm.get_group(name))
            sums[name] = int(t.item())
        out["meshes"][what] = {"names": list(dm.mesh_dim_names), "ranks": dm.mesh.tolist(),
                               "sums": sums, "type": dm.device_type}
    out["same_groups"] = all(jm.groups[n] is jm.device_mesh.get_group(n) for n in ("dp", "tp"))
    mine = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    taken = FT.job_mesh(client, job, mine)
    out["taken"] = [taken.device_mesh is mine,
                    taken.mesh_id == FT.create_mesh(client, job, {"dp": 2, "tp": 2}).mesh_id,
                    taken.expert_mesh is None]
    refused = {}
    cases = {
        "order": DeviceMesh("cpu", torch.tensor([[0, 2], [1, 3]]), mesh_dim_names=("dp", "tp")),
        "unnamed": DeviceMesh("cpu", torch.arange(4).reshape(2, 2)),
        "sub": mine["tp"],
    }
    for name, dm in cases.items():
        try:
            FT.job_mesh(client, job, dm)
            refused[name] = None
        except FT.JobError as e:
            refused[name] = str(e)
    for name, spec in (("names", {"tp": 2, "dp": 2}), ("sizes", {"dp": 1, "tp": 4})):
        familyd_mesh = FT.create_mesh(client, job, spec)
        try:
            FT.check_device_mesh(job, familyd_mesh, mine)
            refused[name] = None
        except FT.JobError as e:
            refused[name] = str(e)
    out["refused"] = refused


class TorchInit(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import familyd_harness as H
        cls.H = H
        cls.daemon = H.Daemon(registry=os.path.join(H.CONFORMANCE, "registry"), host_devices=4,
                              node_name="itest-torch-init")
        cls.daemon.start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def launch(self, local_ranks, local_world_size=None):
        """Workers with torch rank i and LOCAL_RANK local_ranks[i]; their JSON by rank."""
        import tempfile
        world = len(local_ranks)
        outdir = tempfile.mkdtemp(prefix="fd-torch-init-", dir=self.daemon.tmpdir)
        port = self.H.free_port()
        base = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
        base.update(FAMILYD_DESCRIPTORS=self.H.descriptor_set_path(), OMP_NUM_THREADS="1",
                    GLOO_SOCKET_IFNAME="lo", PYTHONPATH=PACKAGE)
        procs = []
        for rank, local in enumerate(local_ranks):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(local_world_size or world), GROUP_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--worker",
                 outdir, self.daemon.socket],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=WORKER_TIMEOUT)[0].decode(errors="replace"))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for rank, p in enumerate(procs):
            self.assertEqual(p.returncode, 0, "worker %d:\n%s" % (rank, logs[rank]))
        results = {}
        for rank in range(world):
            with open(os.path.join(outdir, "%d.json" % rank)) as f:
                results[rank] = json.load(f)
        return results

    def check_groups(self, results, local_ranks):
        for rank, r in results.items():
            self.assertNotIn("error", r)
            self.assertEqual(r["familyd_rank"], local_ranks[rank])      # one node, first_rank 0
            self.assertEqual(r["familyd_ranks"], local_ranks)
            self.assertEqual(r["mesh_ranks"], local_ranks)              # mesh position = torch rank
            self.assertEqual(r["axes"], ["dp", "edp_shard", "ep", "tp"])
            self.assertEqual(r["sums"], {"tp": TP_SUM[rank], "ep": TP_SUM[rank],
                                         "dp": DP_SUM[rank], "edp_shard": DP_SUM[rank]})
            self.assertEqual(r["tp_familyd_ranks"], [local_ranks[p] for p in TP_PEERS[rank]])
            self.assertEqual(r["context"], [2, 2, 1, 1, ["ep", "tp"]])
            self.assertLess(r["mlp_error"], 1e-5)
            self.assertEqual(r["meshes"]["device"], {
                "names": ["dp", "tp"], "ranks": [[0, 1], [2, 3]], "type": "cpu",
                "sums": {"dp": DP_SUM[rank], "tp": TP_SUM[rank]}})
            self.assertEqual(r["meshes"]["expert"], {
                "names": ["edp_shard", "ep"], "ranks": [[0, 1], [2, 3]], "type": "cpu",
                "sums": {"edp_shard": DP_SUM[rank], "ep": TP_SUM[rank]}})
            self.assertTrue(r["same_groups"])
            self.assertEqual(r["taken"], [True, True, True])
            refused = r["refused"]
            self.assertRegex(refused["order"], r"^familyd.torch: the device DeviceMesh lays "
                             r"torch ranks \[\[0, 2\], \[1, 3\]\], but familyd lays mesh "
                             r"mesh-[0-9a-f]+ over the job's torch ranks in row-major order "
                             r"\[\[0, 1\], \[2, 3\]\]$")
            self.assertRegex(refused["unnamed"], "^familyd.torch.job_mesh: the device DeviceMesh "
                             "has no mesh_dim_names")
            self.assertEqual(refused["sub"], "familyd.torch.job_mesh: the device DeviceMesh "
                             "has 2 positions but the job has 4 ranks (pass the whole mesh, not "
                             "a sub-mesh)")
            self.assertRegex(refused["names"], r"^familyd.torch: the device DeviceMesh's "
                             r"dimensions \['dp', 'tp'\] are not mesh mesh-[0-9a-f]+'s axes "
                             r"\['tp', 'dp'\]$")
            self.assertRegex(refused["sizes"], r"^familyd.torch: the device DeviceMesh's sizes "
                             r"\{'dp': 2, 'tp': 2\} are not mesh mesh-[0-9a-f]+'s "
                             r"\{'dp': 1, 'tp': 4\}$")

    def test_job_in_familyd_order(self):
        self.check_groups(self.launch([0, 1, 2, 3]), [0, 1, 2, 3])

    def test_job_in_another_arrival_order(self):
        # torch rank i runs on the device LOCAL_RANK order[i]: the mesh follows torch's order.
        order = [2, 0, 3, 1]
        self.check_groups(self.launch(order), order)

    def test_more_processes_than_devices(self):
        results = self.launch([0, 1, 2, 3, 4])
        want = ("familyd.torch.init: the job does not fit: node itest-torch-init has 4 devices "
                "but torch rank 4 has LOCAL_RANK 4")
        for rank, r in results.items():
            self.assertEqual(r.get("error"), want, "rank %d" % rank)
            self.assertFalse(r["initialized_after"])

    def test_local_world_larger_than_devices(self):
        results = self.launch([0, 1], local_world_size=5)
        want = ("familyd.torch.init: the job does not fit: node itest-torch-init has 4 devices "
                "but LOCAL_WORLD_SIZE is 5 (torch rank 0)")
        for rank, r in results.items():
            self.assertEqual(r.get("error"), want, "rank %d" % rank)
            self.assertFalse(r["initialized_after"])

    def test_two_processes_on_one_device(self):
        results = self.launch([0, 1, 1, 3])
        want = ("familyd.torch.init: torch ranks 1 and 2 both claim familyd rank 1 "
                "(LOCAL_RANK 1 on node itest-torch-init): two processes on one device")
        for rank, r in results.items():
            self.assertEqual(r.get("error"), want, "rank %d" % rank)
            self.assertFalse(r["initialized_after"])

    def test_refusals_before_any_collective(self):
        import familyd
        import familyd.torch as FT
        env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
        for name in ("RANK", "MASTER_PORT"):
            partial = {k: v for k, v in env.items() if k != name}
            with self.assertRaisesRegex(FT.JobError, "^familyd.torch.init: %s is not set" % name):
                FT.init(env=partial)
        with self.assertRaisesRegex(FT.JobError, "LOCAL_RANK='x' is not an integer"):
            FT.init(env=dict(env, LOCAL_RANK="x"))
        with familyd.Client(self.daemon.socket, protos=familyd.Protos(
                self.H.descriptor_set_path())) as c:
            job = FT.Job(rank=0, world_size=4, local_rank=0, local_world_size=4, familyd_rank=0,
                         familyd_ranks=[0, 1, 2, 3])
            mesh = c.create_mesh({"dp": 2, "tp": 2}, ranks=[3, 2, 1, 0])
            with self.assertRaisesRegex(FT.JobError, "not this job's familyd ranks"):
                FT.process_groups(job, mesh)
            self.assertEqual(list(FT.create_mesh(c, job, [("tp", 4)]).ranks), [0, 1, 2, 3])

    def test_import_does_not_import_torch(self):
        code = ("import sys, familyd.torch as T; assert 'torch' not in sys.modules; "
                "T.Job; assert 'torch' in sys.modules")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=PACKAGE))

    def test_refuses_older_torch(self):
        """import familyd.torch reads the installed torch's version from its metadata: a torch
        release older than OLDEST_TORCH is refused with a sentence, the oldest itself and a
        newer one (minor + 10: compared as numbers, not as text) are taken. The metadata of a
        made-up install comes first on the path; torch itself is not imported."""
        import tempfile
        import familyd.torch as FT
        major, minor = FT.OLDEST_TORCH
        oldest = "%d.%d" % (major, minor)
        older = "%d.%d.1" % (major, minor - 1)
        newer = "%d.%d.0+cpu" % (major, minor + 10)
        code = "import familyd.torch as T; print(T.OLDEST_TORCH)"
        for version, refused in ((older, True), (newer, False), (oldest + ".0", False)):
            with tempfile.TemporaryDirectory() as tmp:
                info = os.path.join(tmp, "torch-%s.dist-info" % version.split("+")[0])
                os.mkdir(info)
                with open(os.path.join(info, "METADATA"), "w") as f:
                    f.write("Metadata-Version: 2.1\nName: torch\nVersion: %s\n" % version)
                p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   timeout=60, env=dict(os.environ,
                                                        PYTHONPATH=tmp + ":" + PACKAGE))
            if refused:
                self.assertNotEqual(p.returncode, 0, version)
                self.assertIn("ImportError: familyd.torch needs torch %s or newer, and this "
                              "Python has torch %s: install a newer torch" % (oldest, version),
                              p.stderr)
            else:
                self.assertEqual(p.returncode, 0, "%s: %s" % (version, p.stderr))

    def test_mesh_groups_layout(self):
        from familyd.torch import distributed as D
        self.assertEqual(D.axis_groups([("pp", 2), ("dp", 2), ("tp", 2)]),
                         [("pp", [[0, 4], [1, 5], [2, 6], [3, 7]]),
                          ("dp", [[0, 2], [1, 3], [4, 6], [5, 7]]),
                          ("tp", [[0, 1], [2, 3], [4, 5], [6, 7]])])


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the machine
        sys.stderr.write("test_torch_init: torch missing (bash deploy/dev/python-env.sh)\n")
        sys.exit(1 if os.environ.get("CI") else SKIP)
    unittest.main()
