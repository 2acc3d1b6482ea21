"""What the torch-train tests share: the example job's paths, the workers' environment,
running torchrun and the unsharded example, comparing losses, waiting out a grace period.
"""

import json
import os
import socket
import subprocess
import sys
import time

import familyd_harness as H

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(SOURCE_ROOT, "client", "python")
EXAMPLE = os.path.join(PACKAGE, "examples", "train_moe.py")
WORKER = os.path.join(HERE, "torch_job_worker.py")
REGISTRY = os.path.join(SOURCE_ROOT, "deploy", "registry")
SKIP = 77
JOB_TIMEOUT = 240
GRACE_MS = 2000
STEPS = 3
# The example's modules, by fqn, and the registry member each must resolve to on dp=2,tp=2
# with ep=2 (2 layers).
MODULES = {"embed": "vocab_parallel", "norm": "plain", "head": "vocab_parallel"}
for _i in range(2):
    MODULES.update({"layers.%d.attn_norm" % _i: "plain", "layers.%d.attn" % _i: "eager",
                    "layers.%d.moe_norm" % _i: "plain", "layers.%d.experts" % _i: "grouped_ep"})
INIT_ENV = ["LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RANK",
            "WORLD_SIZE"]
# Every variable torchrun or the launcher may set: none may leak in from the test's own
# environment.
SCRUB_PREFIXES = ("TORCHELASTIC_", "ROLE_", "GROUP_")
SCRUB = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "LOCAL_ROLE_RANK")


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the machine
        sys.stderr.write("torch missing (bash deploy/dev/python-env.sh)\n")
        sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(extra=None):
    """The launcher's (and so the workers') environment: this one without torchrun's variables,
    with the package, the descriptors, one thread and gloo on loopback."""
    env = {k: v for k, v in os.environ.items()
           if k not in SCRUB and not k.startswith(SCRUB_PREFIXES)}
    env.update(FAMILYD_DESCRIPTORS=H.descriptor_set_path(), PYTHONPATH=PACKAGE,
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra or {})
    return env


def run(argv, timeout=JOB_TIMEOUT, env=None):
    """(exit status, output) of a command; killed at the timeout."""
    p = subprocess.Popen(argv, env=env or job_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        out = p.communicate()[0]
    return p.returncode, out.decode(errors="replace")


def launcher(nproc, port, script_argv, nnodes=1, node_rank=0, monitor_interval=None):
    """torchrun (python -m torch.distributed.run) starting nproc workers of a static job on
    loopback. monitor_interval: how often torchrun looks at its workers (seconds); a job whose
    every rank fails on its own is given time to, before torchrun stops the others."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr",
            "127.0.0.1", "--master-port", str(port)]
    if monitor_interval is not None:
        argv += ["--monitor-interval", str(monitor_interval)]
    return argv + script_argv


def worker_job(script, world, socket_path, outdir, timeout=JOB_TIMEOUT):
    """torchrun running `script --worker OUTDIR SOCKET` on `world` processes; (exit status,
    output, {rank: the JSON each worker wrote to OUTDIR/RANK.json})."""
    rc, out = run(launcher(world, free_port(), [script, "--worker", outdir, socket_path]),
                  timeout=timeout)
    results = {}
    for rank in range(world):
        path = os.path.join(outdir, "%d.json" % rank)
        if os.path.exists(path):
            with open(path) as f:
                results[rank] = json.load(f)
    return rc, out, results


def example_args(socket_path, json_path, *extra):
    return ["--socket", socket_path, "--steps", str(STEPS), "--json", json_path] + list(extra)


def run_unsharded(socket_path, tmpdir):
    """The example whole in one plain process: its JSON (losses, builds)."""
    path = os.path.join(tmpdir, "unsharded.json")
    rc, out = run([sys.executable, EXAMPLE, "--unsharded"]
                  + example_args(socket_path, path))
    if rc != 0:
        raise AssertionError("the unsharded run failed (%d):\n%s" % (rc, out))
    with open(path) as f:
        return json.load(f), out


def assert_steps(test, got, want):
    """A job's steps (the example's JSON: losses, grad_norms) against the unsharded run's: the
    dp-mean losses within 1e-5 relative at step 0 and 1e-4 after; the gradient norms within
    1e-4 at every step (AdamW hides a gradient's scale from the losses: the norms show it)."""
    for key, first in (("losses", 1e-5), ("grad_norms", 1e-4)):
        test.assertEqual(len(got[key]), STEPS, key)
        test.assertEqual(len(want[key]), STEPS, key)
        for step, (g, w) in enumerate(zip(got[key], want[key])):
            tolerance = first if step == 0 else 1e-4
            test.assertLessEqual(abs(g - w), tolerance * abs(w),
                                 "%s, step %d: %r against unsharded %r" % (key, step, g, w))
    test.assertNotEqual(want["losses"][0], want["losses"][-1])          # it trains


def status(client):
    res = client.call("familyd.v1.AdminService/GetStatus")
    assert res.ok, res
    return res.reply


def wait_idle(client, builds, timeout=GRACE_MS / 1000.0 + 10):
    """Waits until the daemon holds `builds` builds and none in grace; its last status."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(client)
        if (st.builds == builds and st.builds_in_grace == 0) or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def list_builds(client):
    res = client.call("familyd.v1.FamilyService/ListBuilds")
    assert res.ok, res
    return list(res.reply.builds)


def segments(build):
    """The distinct contents of a build's local ranks: replicas share one segment."""
    return len({tuple((sl.parameter, tuple(sl.global_offset), tuple(sl.local_shape))
                      for sl in s.slices) for s in build.shards if s.token})


class Close:
    """A unittest mixin: assertClose(got, want, what, rtol), tensors of one shape and dtype
    whose largest difference is within rtol of want's largest magnitude."""

    def assertClose(self, got, want, what, rtol=1e-5):
        self.assertEqual(tuple(got.shape), tuple(want.shape), what)
        self.assertEqual(got.dtype, want.dtype, what)
        scale = float(want.abs().max()) if want.numel() else 0.0
        err = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
        self.assertLessEqual(err, rtol * max(scale, 1e-30), "%s: max error %g, scale %g"
                             % (what, err, scale))
