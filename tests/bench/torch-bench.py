#!/usr/bin/python3
"""torch-bench.py: a 4-rank job's first training step, familyd's builds against each rank
initialising its own shards in process (docs/benchmarks.md, "PyTorch job start").

    .venv/bin/python3 tests/bench/torch-bench.py [--smoke] [--build-dir DIR] [--layers L]
                                                [--hidden H] [--intermediate I] [--repeat N]
                                                [--huge-pages N]

The model: L blocks of (PlainRMSNorm, TPSwiGLUMLP) on a dp=2,tp=2 mesh over 4 worker processes
on one node (gloo, float32), about 1 GiB of parameters by default (L=5, H=2048, I=8192), torch 2
under torchrun. Three modes run in turn in the same run, each --repeat times (alternating):

  familyd    every module through familyd.torch.build_module (trainable, the default): each
             process's own training handout per module, filled by the daemon and mapped shared
             and writable, so the first AdamW step writes in place;
  frozen     the same modules with trainable=False: one build per module for the node (the dp
             replicas share their segments), mapped copy-on-write; a forward pass, no step (an
             evaluation or reference model);
  inprocess  every rank constructs the same modules on the CPU, initialised by torch
             (normal_), what a trainer does without familyd.

Measured per mode, by rank 0 between barriers: seconds from "process groups ready" to the end
of the first training step (build + forward + backward + dp gradient all-reduce + AdamW step),
split into build and step (rank 0's forward+backward, all-reduce and AdamW shown too); and the
job's memory on the node above what it was when the process groups were ready, after the build
(before any optimizer write) and after the step: the four workers' anonymous memory
(/proc/PID/smaps_rollup, copy-on-write copies included) plus the daemon's shared memory of live
builds (GetStatus shm_bytes_in_use), so other processes on the machine do not count. The daemon (a release build, started here with --host-devices 4) is the same
for both modes; each familyd run uses a new seed, so nothing is answered from an earlier run.
Prints a table of each mode's medians over the --repeat runs and the ratios familyd / inprocess. --smoke: a tiny model once, to check that
the benchmark still runs (goals not judged).

--huge-pages N (root): reserves N 2 MiB huge pages (vm.nr_hugepages) for the run and puts the
old value back at the end, so the daemon (--huge-pages auto, its default) makes every segment on
them, as on a node whose operator reserved them; the in-process ranks' memory is anonymous and
gets the kernel's transparent huge pages as the machine's setting says (printed).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import huge_pages

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(ROOT, "client", "python")


def anonymous_bytes():
    """This process's anonymous memory (its own pages, copy-on-write copies included)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Anonymous line in /proc/self/smaps_rollup")


def shm_in_use(client):
    """The bytes of the daemon's live builds (GetStatus shm_bytes_in_use)."""
    req = client.protos.cls("familyd.v1.GetStatusRequest")()
    return int(client.call("familyd.v1.AdminService/GetStatus", req).shm_bytes_in_use)


def node_bytes(client, dist):
    """The job's memory on the node: every worker's anonymous memory plus the daemon's shared
    memory of live builds (pages mapped but not copied are counted once, there)."""
    mine = [anonymous_bytes()]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return sum(x[0] for x in every) + shm_in_use(client)


# -- one worker ------------------------------------------------------------------------------

def worker(a):
    import torch
    import torch.distributed as dist
    import familyd
    import familyd.torch as FT
    from familyd.torch import modules as M

    torch.set_num_threads(1)
    client = familyd.Client(a.socket, timeout=600)
    job = FT.init(client, timeout=600)
    jm = FT.job_mesh(client, job, {"dp": 2, "tp": 2})
    cfg = {"hidden_size": a.hidden, "intermediate_size": a.intermediate,
           "initializer_range": 0.02, "rms_norm_eps": 1e-6}
    dist.barrier()
    mem0 = node_bytes(client, dist)
    dist.barrier()
    t0 = time.perf_counter()
    layers = []
    for i in range(a.layers):
        if a.mode in ("familyd", "frozen"):
            trainable = a.mode == "familyd"
            norm = FT.build_module(client, "norm", config=cfg, mesh=jm, fqn="layers.%d.norm" % i,
                                   seed=a.seed, trainable=trainable)
            mlp = FT.build_module(client, "mlp", config=cfg, mesh=jm, fqn="layers.%d.mlp" % i,
                                  seed=a.seed, trainable=trainable)
        else:
            norm = M.PlainRMSNorm(config=cfg)
            mlp = M.TPSwiGLUMLP(config=cfg, context=jm.context)
        layers.append(torch.nn.ModuleList([norm, mlp]))
    model = torch.nn.ModuleList(layers)
    dist.barrier()
    t_built = time.perf_counter()
    mem_built = node_bytes(client, dist)
    dist.barrier()
    t_built_again = time.perf_counter()

    gen = torch.Generator().manual_seed(1000 + jm.job.rank // 2)
    x = torch.randn(a.tokens, a.hidden, generator=gen)
    if a.mode == "frozen":        # an evaluation pass: no gradient, no optimizer
        with torch.no_grad():
            for norm, mlp in model:
                x = x + mlp(norm(x))
        dist.barrier()
        t_fwd = time.perf_counter()
        mem_fwd = node_bytes(client, dist)
        if job.rank == 0:
            params = sum(p.numel() * p.element_size() for p in model.parameters())
            row = {"build_s": t_built - t0, "step_s": t_fwd - t_built_again,
                   "fwd_bwd_s": t_fwd - t_built_again, "allreduce_s": 0.0, "adamw_s": 0.0,
                   "total_s": t_built - t0 + t_fwd - t_built_again,
                   "mem_built": mem_built - mem0, "mem_step": mem_fwd - mem0,
                   "rank0_param_bytes": params, "loss": float(x.pow(2).mean())}
            with open(a.out, "w") as f:
                json.dump(row, f)
        dist.barrier()
        return
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for norm, mlp in model:
        x = x + mlp(norm(x))
    loss = x.pow(2).mean()
    loss.backward()
    t_backward = time.perf_counter()
    dp = jm.groups["dp"]
    for p in model.parameters():
        if p.grad is not None:
            # build_module's parameters are DTensors: their gradients' local shards
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(grad, group=dp)
            grad /= 2
    t_reduced = time.perf_counter()
    opt.step()
    t_opt = time.perf_counter()
    dist.barrier()
    t_step = time.perf_counter()
    mem_step = node_bytes(client, dist)
    if job.rank == 0:
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        step = t_step - t_built_again
        row = {"build_s": t_built - t0, "step_s": step, "fwd_bwd_s": t_backward - t_built_again,
               "allreduce_s": t_reduced - t_backward, "adamw_s": t_opt - t_reduced,
               "total_s": t_built - t0 + step, "mem_built": mem_built - mem0,
               "mem_step": mem_step - mem0, "rank0_param_bytes": params, "loss": float(loss)}
        with open(a.out, "w") as f:
            json.dump(row, f)
    dist.barrier()


# -- the driver -------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def familyd_binary(a):
    if os.environ.get("FAMILYD_BIN"):
        return os.environ["FAMILYD_BIN"]
    build = a.build_dir or os.path.join(ROOT, "build-bench")
    if not os.path.isfile(os.path.join(build, "build.ninja")):
        print("torch-bench: configuring %s (release, no sanitizers)" % build, flush=True)
        subprocess.run(["meson", "setup", build, ROOT, "-Dbuildtype=release",
                        "-Db_sanitize=none"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["ninja", "-C", build, "daemon/familyd", "proto/familyd.binpb"], check=True,
                   stdout=subprocess.DEVNULL)
    os.environ.setdefault("FAMILYD_DESCRIPTORS", os.path.join(build, "proto", "familyd.binpb"))
    return os.path.join(build, "daemon", "familyd")


def start_daemon(binary, tmp):
    sock = os.path.join(tmp, "familyd.sock")
    log = open(os.path.join(tmp, "familyd.log"), "w")
    proc = subprocess.Popen([binary, "--socket", sock, "--shard-socket",
                             os.path.join(tmp, "shard.sock"), "--registry",
                             os.path.join(ROOT, "deploy", "registry"), "--host-devices", "4",
                             "--build-grace-ms", "0"], stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("torch-bench: familyd did not start (%s)" % log.name)
        time.sleep(0.05)
    time.sleep(0.2)
    return proc, sock


def run_mode(a, sock, tmp, mode, seed):
    out = os.path.join(tmp, "%s-%d.json" % (mode, seed))
    env = dict(os.environ, PYTHONPATH=PACKAGE + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), os.path.abspath(__file__), "--worker",
            "--mode", mode, "--socket", sock, "--out", out, "--seed", str(seed),
            "--layers", str(a.layers), "--hidden", str(a.hidden),
            "--intermediate", str(a.intermediate), "--tokens", str(a.tokens)]
    subprocess.run(argv, env=env, check=True, timeout=1800)
    with open(out) as f:
        return json.load(f)


def page_probe(mib=64):
    """Seconds per MiB: the first write to a private (copy-on-write) mapping of a filled memfd,
    what a bound parameter's first optimizer write costs, against the first write to fresh
    anonymous memory, what an in-process initialisation costs, and a re-write (warm)."""
    import mmap
    import torch

    n = mib << 20
    fd = os.memfd_create("torch-bench-probe")
    try:
        os.ftruncate(fd, n)
        with mmap.mmap(fd, n) as shared:
            shared.write(b"\1" * n)
        cow = mmap.mmap(fd, n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        t = torch.frombuffer(cow, dtype=torch.float32)
        t0 = time.perf_counter()
        t.mul_(0.5)
        t1 = time.perf_counter()
        t.mul_(0.5)
        t2 = time.perf_counter()
        fresh = torch.empty(n // 4)
        t3 = time.perf_counter()
        fresh.fill_(1.0)
        t4 = time.perf_counter()
        del t
        cow.close()
    finally:
        os.close(fd)
    return {"cow_first_write": (t1 - t0) / mib, "warm_write": (t2 - t1) / mib,
            "fresh_anonymous_write": (t4 - t3) / mib}


MODES = ("familyd", "frozen", "inprocess")


def median(xs):
    """The median: the machine may be shared, and one disturbed run should not move a row."""
    return statistics.median(xs)


def report(results, a):
    gib = 1 << 30
    print("\nmodel: %d x (RMSNorm, TP SwiGLU MLP) hidden %d, intermediate %d: %.2f GiB of "
          "float32 parameters; dp=2,tp=2, 4 processes, median of %d runs per mode"
          % (a.layers, a.hidden, a.intermediate,
             a.layers * (3 * a.hidden * a.intermediate + a.hidden) * 4 / gib, a.repeat))
    print("%-10s %8s %8s %8s %8s %8s %8s %14s %14s"
          % ("mode", "build s", "fwd+bwd", "reduce", "AdamW", "step s", "total s",
             "mem built GiB", "mem step GiB"))
    rows = {}
    for mode in MODES:
        rs = results[mode]
        row = {k: median([r[k] for r in rs]) for k in rs[0]}
        rows[mode] = row
        print("%-10s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %14.2f %14.2f"
              % (mode, row["build_s"], row["fwd_bwd_s"], row["allreduce_s"], row["adamw_s"],
                 row["step_s"], row["total_s"], row["mem_built"] / gib, row["mem_step"] / gib))
    f, z, i = rows["familyd"], rows["frozen"], rows["inprocess"]
    ratios = {"params_ready": f["build_s"] / i["build_s"],
              "first_step_end": f["total_s"] / i["total_s"],
              "memory_after_step": f["mem_step"] / max(i["mem_step"], 1),
              "frozen_memory": z["mem_built"] / max(i["mem_built"], 1)}
    print("familyd / inprocess: parameters ready %.2fx (goal <= 0.5x); end of the first "
          "training step %.2fx (goal <= 1.0x); memory after the step %.2fx (goal <= 1.0x); "
          "frozen / inprocess memory with the parameters ready %.2fx (goal <= 0.5x)"
          % (ratios["params_ready"], ratios["first_step_end"], ratios["memory_after_step"],
             ratios["frozen_memory"]))
    rows["ratios"] = ratios
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="a tiny model, once")
    p.add_argument("--build-dir", help="release build folder (default build-bench)")
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", help="write the median rows here (and every run's, under runs)")
    p.add_argument("--huge-pages", type=int, default=0, metavar="N",
                   help="reserve N 2 MiB huge pages for the run (root; restored at the end)")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if a.smoke:
        a.layers, a.hidden, a.intermediate, a.tokens, a.repeat = 2, 32, 64, 8, 1
    binary = familyd_binary(a)
    with huge_pages.reserved(a.huge_pages, "torch-bench"):
        print("torch-bench: %d huge pages of 2 MiB reserved for the daemon; anonymous "
              "transparent huge pages: %s" % (a.huge_pages, huge_pages.thp_setting()))
        code = run(a, binary)
    if code != 0:
        raise SystemExit("torch-bench: familyd exited with %d" % code)


def run(a, binary):
    """Every mode --repeat times beside one daemon; the report; the daemon's exit status."""
    tmp = tempfile.mkdtemp(prefix="fd-torch-bench-")
    try:
        proc, sock = start_daemon(binary, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        results = {mode: [] for mode in MODES}
        for r in range(a.repeat):
            for mode in MODES:
                results[mode].append(run_mode(a, sock, tmp, mode, seed=100 + r))
        rows = report(results, a)
        probe = page_probe()
        print("page cost here (ms per MiB): first write to a copy-on-write mapping %.2f, to fresh "
              "anonymous memory %.2f, to warm memory %.2f"
              % tuple(1000 * probe[k] for k in ("cow_first_write", "fresh_anonymous_write",
                                                "warm_write")))
        rows["page_probe"] = probe
        if a.smoke:   # it ran: every number is there and finite (the goals are not judged)
            for mode in MODES:
                for k, v in rows[mode].items():
                    if not (v == v and abs(v) != float("inf")):
                        raise SystemExit("torch-bench: %s %s is %r" % (mode, k, v))
            print("torch-bench: smoke run complete")
        rows["runs"] = results
        rows["huge_pages"] = a.huge_pages
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return proc.returncode


if __name__ == "__main__":
    main()
