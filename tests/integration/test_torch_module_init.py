#!/usr/bin/python3
"""init: module (docs/registry.md): a member initialised by its own reset_parameters, once per
node, into one build that the node's processes share; PublishBuild and its refusals.

One daemon (--host-devices 4, a long --build-grace-ms so the job's build is still listed after
it) serves a registry this test writes: a Linear member (weight [8, 4], bias [8], both tp
shard(0), init: module) whose constructor is nn.Linear's (reset_parameters: kaiming-uniform
weight, uniform bias), and the same with a normal init (not publishable). A torchrun job of 4
processes on tp=4 builds it frozen (trainable=False): all four get the same build id, the node
holds it once (one build of the family, not writable, sealed), and every rank's parameters
are its slices of nn.Linear(4, 8)'s reset_parameters under torch.manual_seed(the module's
derived seed), computed here independently; the same member as a training handout has the same
values; _hp_reset_after_materialization is False on both. Without the job, through the Python
client: a read-only Build before the publish is refused MODULE_INIT_PENDING with its sentence;
a publish while the shards are mapped writable is refused MAPPED_WRITABLE and leaves the build
writable (fetched writable again, written);
after the publish a descriptor fetched writable before it cannot map the memory writable
(F_SEAL_WRITE), a writable fetch is refused, and the read-only Build gets the same build; a
build without init: module is NOT_PUBLISHABLE; a process that is not its node's filler gives
up waiting for the publish with a sentence; another uid's PublishBuild of a root build is
PUBLISH_NOT_ALLOWED (a process of uid nobody, through other_uid.py).
"""

import json
import mmap
import os
import pwd
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
import torch_job_common as C  # noqa: E402

sys.path.insert(0, C.PACKAGE)

TIMEOUT = 300
CFG = {"hidden_size": 4, "out_size": 8}
SEED, FQN = 5, "lin"
CONSTRUCTOR = "itest_module_init.ModLinear"
REGISTRY = """\
families:
  - name: mi_linear
    baseline: itest_module_init.baselines.mi_linear
    default_variant: own
    parallel_axis: tp
    variants:
      own:
        constructor: %(c)s
        accepts: [config, module_fqn, context]
    parameters:
      weight: {shape: [out_size, hidden_size], placements: {tp: shard(0)}, init: module}
      bias: {shape: [out_size], placements: {tp: shard(0)}, init: module}
  - name: mi_plain
    baseline: itest_module_init.baselines.mi_plain
    default_variant: plain
    variants:
      plain:
        constructor: %(c)s
        accepts: [config, module_fqn]
    parameters:
      weight: {shape: [out_size, hidden_size], init: {normal: {std: 0.02}}}
      bias: {shape: [out_size], init: zeros}
""" % {"c": CONSTRUCTOR}
PUBLISH = "familyd.v1.FamilyService/PublishBuild"
PENDING = ("parameter 'weight' of mi_linear is initialised by its module (init: module) and no "
           "published build of this request is here yet: build it writable, run the module's "
           "init into it and PublishBuild it first (familyd.torch does)")


def mod_linear():
    import torch

    class ModLinear(torch.nn.Linear):
        """nn.Linear(hidden_size, out_size): its reset_parameters is the member's init."""

        def __init__(self, config, module_fqn="", context=None, *, device=None):
            tp = context.tp_size if context is not None else 1
            super().__init__(config["hidden_size"], config["out_size"] // tp, device=device)

    return ModLinear


def expected(seed):
    """nn.Linear(4, 8)'s parameters after reset_parameters under manual_seed(seed)."""
    import torch
    torch.manual_seed(seed)
    m = torch.nn.Linear(CFG["hidden_size"], CFG["out_size"])
    torch.manual_seed(seed)
    m.reset_parameters()
    return m.weight.detach(), m.bias.detach()


def worker(outdir, socket_path):
    import torch.distributed as dist
    import familyd
    import familyd.torch as FT

    FT.register(CONSTRUCTOR, mod_linear())
    client = familyd.Client(socket_path)
    job = FT.init(client)
    jm = FT.job_mesh(client, job, {"tp": 4})
    frozen = FT.build_module(client, "mi_linear", CFG, mesh=jm, fqn=FQN, seed=SEED,
                             trainable=False)
    handout = FT.build_module(client, "mi_linear", CFG, mesh=jm, fqn=FQN, seed=SEED)
    out = {"rank": FT.build_info(frozen).rank,
           "build_id": FT.build_info(frozen).build_id,
           "handout_id": FT.build_info(handout).build_id,
           "frozen": {n: p.to_local().tolist() for n, p in frozen.named_parameters()},
           "handout": {n: p.to_local().tolist() for n, p in handout.named_parameters()},
           "reset_flags": [frozen._hp_reset_after_materialization,
                           handout._hp_reset_after_materialization],
           "seed": FT.build_info(frozen).seed}
    FT.release(handout)
    with open(os.path.join(outdir, "%d.json" % job.rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


class ModuleInit(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        C.require_torch()
        cls.tmp = tempfile.mkdtemp(prefix="fd-modinit-")
        reg = os.path.join(cls.tmp, "registry")
        os.mkdir(reg)
        with open(os.path.join(reg, "families.yaml"), "w") as f:
            f.write(REGISTRY)
        cls.daemon = H.Daemon(registry=reg, host_devices=4, node_name="itest-modinit",
                              extra_args=["--build-grace-ms=600000"])
        os.chmod(cls.daemon.tmpdir, 0o755)
        cls.daemon.start()
        os.chmod(cls.daemon.socket, 0o666)  # the other uid's PublishBuild
        outdir = tempfile.mkdtemp(prefix="out-", dir=cls.tmp)
        cls.rc, cls.out, cls.results = C.worker_job(os.path.abspath(__file__), 4,
                                                    cls.daemon.socket, outdir, timeout=TIMEOUT)
        import familyd
        cls.client = familyd.Client(cls.daemon.socket)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def ranks(self):
        self.assertEqual(self.rc, 0, self.out[-6000:])
        self.assertEqual(sorted(self.results), [0, 1, 2, 3], self.out[-6000:])
        return self.results.values()

    def test_one_build_shared_with_the_modules_own_init(self):
        import torch
        ids = {r["build_id"] for r in self.ranks()}
        self.assertEqual(len(ids), 1, ids)
        build_id = ids.pop()
        for r in self.ranks():
            weight, bias = expected(r["seed"])
            rows = slice(2 * r["rank"], 2 * r["rank"] + 2)
            for kind in ("frozen", "handout"):
                self.assertTrue(torch.equal(torch.tensor(r[kind]["weight"]), weight[rows]),
                                (kind, r["rank"]))
                self.assertTrue(torch.equal(torch.tensor(r[kind]["bias"]), bias[rows]),
                                (kind, r["rank"]))
            # Not zeros: the module's values went in.
            self.assertGreater(float(torch.tensor(r["frozen"]["weight"]).abs().sum()), 0)
            self.assertEqual(r["reset_flags"], [False, False])
            self.assertNotEqual(r["handout_id"], build_id)
        # The node holds it once: one build of the family besides the handouts (released),
        # published read-only.
        shared = [b for b in self.client.list_builds()
                  if b.info.resolved.family == "mi_linear" and b.build_id == build_id]
        self.assertEqual(len(shared), 1)
        self.assertFalse(shared[0].writable)
        frozen = [b for b in self.client.list_builds() if b.info.resolved.family == "mi_linear"
                  and not b.private_build and len(b.shards) == 4]
        self.assertEqual([b.build_id for b in frozen], [build_id])

    def test_read_only_before_publish_then_publish(self):
        import familyd
        from familyd import shard as S
        kw = dict(config=CFG, seed=11)
        with self.assertRaises(familyd.FamilydError) as e:
            self.client.build("mi_linear", mode="read-only", **kw)
        self.assertEqual(e.exception.reason, "MODULE_INIT_PENDING")
        self.assertEqual(e.exception.message, PENDING)

        w = self.client.build("mi_linear", mode="shared", **kw)
        self.assertTrue(w.message.writable)
        token = [s.token for s in w.message.shards if s.token][0]
        (held,) = S.fetch(w.shard_socket, [token], True, protos=self.client.protos)
        with self.assertRaises(familyd.FamilydError) as e:
            self.client.publish_build(w.id)
        self.assertEqual(e.exception.reason, "MAPPED_WRITABLE")
        self.assertEqual(e.exception.message,
                         "build %s is still mapped writable (rank 0): unmap its shards before "
                         "PublishBuild" % w.id)
        (again,) = S.fetch(w.shard_socket, [token], True, protos=self.client.protos)
        again.close()
        w.ranks[0]["weight"][0, 0] = 7.0
        w.close()
        published = self.client.publish_build(w.id)
        self.assertFalse(published.writable)
        self.assertEqual(self.client.publish_build(w.id).build_id, w.id)  # again: no change
        # Sealed: the descriptor fetched writable before cannot map it writable any more.
        with self.assertRaises(PermissionError):
            mmap.mmap(held.fd, held.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        held.close()
        with self.assertRaises(S.ShardError):
            S.fetch(w.shard_socket, [token], True, protos=self.client.protos)
        r = self.client.build("mi_linear", mode="read-only", **kw)
        self.assertEqual(r.id, w.id)
        self.assertEqual(float(r.ranks[0]["weight"][0, 0]), 7.0)
        r.close()
        r.release()
        w.release()

    def test_a_process_that_is_not_the_filler_gives_up_waiting(self):
        # Its filler died (or never came): the read-only Build stays refused until the wait
        # ends, then the sentence.
        from familyd.torch import module_init as MI
        with self.assertRaises(TimeoutError) as e:
            MI.wait_published(self.client, "mi_linear", dict(config=CFG, seed=31), "W",
                              wait=0.3)
        self.assertEqual(str(e.exception), "W: waited 0.3 s for the node's filler (LOCAL_RANK "
                         "0) to publish the build of its init: module parameters")

    def test_familyctl_publish(self):
        # The C library's familyd_publish_build() through familyctl: refused while nothing
        # marks the build as init: module's, then published, --json the Build.
        import subprocess
        ctl = [H.familyctl_bin(), "--socket", self.daemon.socket]
        w = self.client.build("mi_linear", mode="shared", config=CFG, seed=41)
        w.ranks[0]["weight"][0, 0] = 3.0
        w.close()
        p = subprocess.run(ctl + ["publish", w.id], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("no (published)", p.stdout)
        p = subprocess.run(ctl + ["--json", "publish", w.id], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["buildId"], w.id)
        plain = self.client.build("mi_plain", mode="shared", config=CFG, seed=42)
        p = subprocess.run(ctl + ["publish", plain.id], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("build %s has no parameter with init: module" % plain.id, p.stderr)
        p = subprocess.run(ctl + ["publish"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("expected exactly one build id", p.stderr)
        r = self.client.build("mi_linear", mode="read-only", config=CFG, seed=41)
        self.assertEqual(r.id, w.id)
        self.assertEqual(float(r.ranks[0]["weight"][0, 0]), 3.0)
        for b in (r, plain):
            b.close()
            b.release()
        w.release()

    def test_publish_refusals(self):
        import familyd
        b = self.client.build("mi_plain", mode="shared", config=CFG, seed=1)
        b.close()
        with self.assertRaises(familyd.FamilydError) as e:
            self.client.publish_build(b.id)
        self.assertEqual((e.exception.code_name, e.exception.reason),
                         ("FAILED_PRECONDITION", "NOT_PUBLISHABLE"))
        self.assertEqual(e.exception.message, "build %s has no parameter with init: module; "
                         "only such a build is published" % b.id)
        b.release()
        with self.assertRaises(familyd.FamilydError) as e:
            self.client.publish_build("bld-nope")
        self.assertEqual(e.exception.code_name, "NOT_FOUND")

    def test_publish_by_another_uid(self):
        import other_uid
        uid = pwd.getpwnam("nobody").pw_uid
        w = self.client.build("mi_linear", mode="shared", config=CFG, seed=21)
        w.close()
        self.addCleanup(w.release)
        copy = other_uid.harness_copy(os.path.abspath(__file__),
                                      os.path.join(HERE, "torch_job_common.py"),
                                      prefix="fd-modinit-")
        self.addCleanup(copy.cleanup)
        argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                other_uid.other_uid_python(), copy.path(os.path.basename(__file__)),
                "--client", self.daemon.socket]
        c = other_uid.LineClient(argv, copy)
        self.addCleanup(c.close)
        ans = c.ask(PUBLISH, {"buildId": w.id})
        self.assertEqual((ans["code"], ans["reason"]), ("PERMISSION_DENIED",
                                                        "PUBLISH_NOT_ALLOWED"), ans)
        self.assertEqual(ans["message"], "PublishBuild needs the build's owner (uid 0) or an "
                         "admin; uid %d is neither" % uid)
        self.assertTrue(self.client.get_build(w.id).writable)


def client_main(socket_path):
    """--client SOCKET (as another uid): {"rpc", "request"} lines in, answers out."""
    protos = H.Protos()
    client = H.Client(socket_path, protos)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            return
        res = client.call(cmd["rpc"], cmd.get("request", {}), timeout=60)
        _, infos = client.error_details(res)
        sys.stdout.write(json.dumps({"code": res.code, "message": res.message,
                                     "reason": infos[0].reason if infos else ""}) + "\n")
        sys.stdout.flush()


class ModuleInitRestart(unittest.TestCase):
    """Under a service manager (fake_manager.py: the fd store) a daemon killed and started again
    gives back an init: module build as it was: published (read-only, its values) or still its
    filler's to publish (writable, and publishable then)."""

    def setUp(self):
        from fake_manager import FakeManager
        from test_durability_fdstore import ManagedDaemon
        self.tmp = H.short_tmpdir()
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)
        self.reg = os.path.join(self.tmp, "registry")
        os.mkdir(self.reg)
        with open(os.path.join(self.reg, "families.yaml"), "w") as f:
            f.write(REGISTRY)
        self.m = FakeManager(self.tmp)
        self.addCleanup(self.m.close)
        self.Managed = ManagedDaemon
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            if d.alive():
                d.stop()

    def start(self):
        import familyd
        mark = self.m.mark()
        d = self.Managed(self.m, self.tmp, extra_args=["--build-grace-ms=600000"])
        d.registry = self.reg
        self.daemons.append(d)
        d.start()
        self.m.wait_for("READY", "1", after=mark)
        return d, familyd.Client(d.socket)

    def kill(self, d, client):
        client.close()
        d.proc.send_signal(__import__("signal").SIGKILL)
        d.proc.wait()

    def test_published_and_unpublished_builds_come_back_as_they_were(self):
        d1, c1 = self.start()
        pub = c1.build("mi_linear", mode="shared", config=CFG, seed=31)
        pub.ranks[0]["weight"][0, 0] = 5.0
        pub.close()
        self.assertFalse(c1.publish_build(pub.id).writable)
        unpub = c1.build("mi_linear", mode="shared", config=CFG, seed=32)
        unpub.ranks[0]["weight"][0, 0] = 6.0
        unpub.close()
        self.kill(d1, c1)

        d2, c2 = self.start()
        self.assertRegex(d2.stderr(), r"Re-adopted 2 builds")
        # Published before the kill: read-only, shared by read-only Builds, its values.
        r = c2.build("mi_linear", mode="read-only", config=CFG, seed=31)
        self.assertEqual(r.id, pub.id)
        self.assertFalse(r.message.writable)
        self.assertEqual(float(r.ranks[0]["weight"][0, 0]), 5.0)
        r.close()
        # Not published yet: still writable, and its filler can publish it now.
        again = c2.build("mi_linear", mode="shared", config=CFG, seed=32)
        self.assertEqual(again.id, unpub.id)
        self.assertTrue(again.message.writable)
        self.assertEqual(float(again.ranks[0]["weight"][0, 0]), 6.0)
        again.close()
        self.assertFalse(c2.publish_build(unpub.id).writable)
        r = c2.build("mi_linear", mode="read-only", config=CFG, seed=32)
        self.assertEqual(r.id, unpub.id)
        r.close()
        c2.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    unittest.main(verbosity=2)
