#!/usr/bin/python3
"""build_module's two kinds of build under torchrun: training handouts and frozen modules.

One daemon (the example registry, --host-devices 4), one torchrun job of two processes of this
file on a dp=2 mesh (the MLP is the plain member: both ranks hold the whole of it). Each
process builds the same MLP twice: trainable (build_module's default) and frozen
(trainable=False), and the test checks, per process:

- the trainable module is a training handout: a build of this process's own (private and
  writable) of its own rank, held by this process alone, its parameters requiring gradients;
  the other process presenting this one's token on the shard socket is refused
  (PERMISSION_DENIED, "belongs to another process"); after an AdamW step, a second descriptor
  of the same token, mapped read-only, reads the parameter's new values: the step wrote into
  the daemon's segment (MAP_SHARED), not into a copy-on-write copy;
- the frozen module is one build for the node, held by both processes, both ranks in one
  segment (dp replicas share), its parameters not requiring gradients; the daemon's shm in
  use grew by the handouts' two segments plus the frozen module's one (bytes counted once).
"""

import json
import mmap
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
import torch_job_common as C  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
TIMEOUT = 240
CONFIG = {"hidden_size": 32, "intermediate_size": 64, "initializer_range": 0.02}


def worker(outdir, socket_path):
    import numpy as np
    import torch
    import torch.distributed as dist
    import familyd
    import familyd.shard as S
    import familyd.torch as FT

    client = familyd.Client(socket_path)
    job = FT.init(client)
    jm = FT.job_mesh(client, job, {"dp": 2})
    status = client.protos.cls("familyd.v1.GetStatusRequest")
    dist.barrier()
    shm0 = int(client.call("familyd.v1.AdminService/GetStatus", status()).shm_bytes_in_use)
    dist.barrier()
    trained = FT.build_module(client, "mlp", CONFIG, mesh=jm, fqn="mlp", seed=3)
    frozen = FT.build_module(client, "mlp", CONFIG, mesh=jm, fqn="frozen", seed=3,
                             trainable=False)
    dist.barrier()
    shm1 = int(client.call("familyd.v1.AdminService/GetStatus", status()).shm_bytes_in_use)
    t_info, f_info = FT.build_info(trained), FT.build_info(frozen)
    out = {"rank": job.rank, "pid": os.getpid(), "familyd_rank": job.familyd_rank,
           "shm_grew": shm1 - shm0, "module_bytes": 0, "trainable": t_info.trainable,
           "frozen_trainable": f_info.trainable}
    for name, info in (("trained", t_info), ("frozen", f_info)):
        b = client.get_build(info.build_id)
        out[name] = {"build_id": info.build_id, "pids": sorted(r.pid for r in b.references),
                     "ranks": sorted(int(s.rank) for s in b.shards if s.allocation_bytes),
                     "writable": b.writable, "private": b.private_build}
    out["module_bytes"] = int(next(s.size_bytes for s in client.get_build(t_info.build_id).shards
                                   if s.allocation_bytes))
    out["requires_grad"] = [p.requires_grad for p in trained.parameters()]
    out["frozen_requires_grad"] = [p.requires_grad for p in frozen.parameters()]

    # The other process's token of its handout, presented here.
    mine = next(s.token for s in t_info.build.message.shards if s.token)
    tokens = [None] * 2
    dist.all_gather_object(tokens, mine)
    try:
        S.fetch(t_info.build.message.shard_socket, [tokens[1 - job.rank]])
        out["other"] = None
    except S.ShardError as e:
        out["other"] = [e.code_name, e.message]

    # One AdamW step writes the handout's parameters in place.
    x = torch.randn(8, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(job.rank))
    before = trained.gate_proj.to_local().detach().clone()
    trained(x).pow(2).mean().backward()
    torch.optim.AdamW(trained.parameters(), lr=1e-2).step()
    after = trained.gate_proj.to_local().detach()
    handle = S.fetch(t_info.build.message.shard_socket, [mine])[0]
    try:
        view = handle.map("read-only")
        sl = next(sl for s in t_info.build.message.shards if s.token
                  for sl in s.slices if sl.parameter == "gate_proj")
        count = int(np.prod(list(sl.local_shape)))
        seen = np.frombuffer(view, dtype=np.float32, count=count,
                             offset=int(sl.byte_offset)).reshape(tuple(sl.local_shape))
        out["step_changed"] = not torch.equal(before, after)
        out["segment_has_step"] = bool(np.array_equal(seen, after.numpy()))
        del seen
        view.close()
    finally:
        os.close(handle.fd)
    with open(os.path.join(outdir, "%d.json" % job.rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


class TorchHandout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = H.Daemon(registry=REGISTRY, host_devices=4, node_name="itest-handout")
        cls.daemon.start()
        outdir = tempfile.mkdtemp(prefix="fd-handout-", dir=cls.daemon.tmpdir)
        cls.returncode, cls.output, cls.results = C.worker_job(
            os.path.abspath(__file__), 2, cls.daemon.socket, outdir, timeout=TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def ranks(self):
        self.assertEqual(self.returncode, 0, self.output[-6000:])
        self.assertEqual(sorted(self.results), [0, 1], self.output[-6000:])
        return self.results

    def test_trainable_is_a_handout_of_this_process(self):
        r = self.ranks()
        self.assertNotEqual(r[0]["trained"]["build_id"], r[1]["trained"]["build_id"])
        for rank, got in r.items():
            self.assertTrue(got["trainable"])
            self.assertEqual(got["trained"]["pids"], [got["pid"]], rank)
            self.assertEqual(got["trained"]["ranks"], [got["familyd_rank"]], rank)
            self.assertEqual((got["trained"]["writable"], got["trained"]["private"]),
                             (True, True), rank)
            self.assertEqual(got["requires_grad"], [True, True, True])

    def test_no_other_process_maps_a_handout(self):
        for rank, got in self.ranks().items():
            self.assertIsNotNone(got["other"], "rank %d mapped the other's handout" % rank)
            code, message = got["other"]
            self.assertEqual(code, "PERMISSION_DENIED")
            self.assertIn("belongs to another process", message)

    def test_the_step_writes_the_daemon_segment(self):
        for rank, got in self.ranks().items():
            self.assertTrue(got["step_changed"], rank)
            self.assertTrue(got["segment_has_step"], rank)

    def test_frozen_is_one_shared_build(self):
        r = self.ranks()
        self.assertEqual(r[0]["frozen"]["build_id"], r[1]["frozen"]["build_id"])
        pids = sorted(got["pid"] for got in r.values())
        for rank, got in r.items():
            self.assertFalse(got["frozen_trainable"])
            self.assertEqual(got["frozen"]["pids"], pids)
            self.assertEqual(got["frozen"]["ranks"], [0, 1])
            self.assertEqual((got["frozen"]["writable"], got["frozen"]["private"]),
                             (False, False))
            self.assertEqual(got["frozen_requires_grad"], [False, False, False])

    def test_node_bytes_count_each_segment_once(self):
        # two handouts (one per process) and one frozen build whose dp replicas share a segment
        for rank, got in self.ranks().items():
            self.assertEqual(got["shm_grew"], 3 * got["module_bytes"], rank)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    unittest.main(verbosity=2)
