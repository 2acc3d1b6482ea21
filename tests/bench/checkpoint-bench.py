#!/usr/bin/python3
"""checkpoint-bench.py: loading a safetensors checkpoint through familyd against the disk, memory
and the usual per-rank path, in one run (docs/benchmarks.md, "Checkpoint loads").

    .venv/bin/python3 tests/bench/checkpoint-bench.py [--smoke] [--gib G] [--files N]
                                                     [--repeat R] [--dir DIR]
                                                     [--build-dir DIR] [--json F]
                                                     [--huge-pages N]

The checkpoint: L layers of Llama-style MLP weights (model.layers.N.mlp.{gate,up,down}_proj.weight,
float32, intermediate = 4 x hidden), about --gib GiB, written by the safetensors library into
--files files (2 or 4) with a model.safetensors.index.json, in a new folder under --dir (default
/var/tmp; a tmpfs is refused: the point is a disk). The daemon (a release build, started here
with --host-devices 4) builds the example registry's family `mlp` from it. Measured, same run:

  1. cold load: every layer's Build (a client's deposit, then one Build per layer in turn, mesh
     dp=2 x tp=2) with the files' pages evicted first (posix_fadvise DONTNEED, checked with
     fincore), against fio's O_DIRECT sequential read of the same files (psync, bs 4m, one
     job): throughput ratio, goal >= 0.9; against the same fio stream through the page cache
     (buffered, evicted first; reported); the daemon's bytes read (/proc/PID/io rchar) over the
     bytes the shards need (goal <= 1.01);
  2. warm load: the same with the files in the page cache, against a memcpy of the same bytes
     from the files' resident mappings, on as many threads as the daemon has fill threads,
     into fresh memory made as the daemon makes a segment (a memfd of the size, mapped; its
     making and every page's allocation at first touch timed, as the load's are): goal >= 0.8;
     against the copy into present pages too (reported);
  3. four rank processes (dp=2 x tp=2), each depositing, building every layer and mapping its
     own shard (populated), sharing one build per layer, against four processes that open the
     files with safetensors' safe_open (mmap) and slice their tp shards with get_slice into
     their own arrays (numpy): seconds from "go" to every rank's parameters ready, cold
     (goal <= 0.3) and warm; the memory of each side: the workers' anonymous PSS grown during
     the load (smaps_rollup Pss_Anon), plus, for familyd, the daemon's own growth and its live
     shared memory (GetStatus shm_bytes_in_use: the segments that the workers' Pss_Shmem
     divides among them). The page cache, which both sides fill with the same files, is
     reported, not counted. Each rank's parameters are checked equal (CRC-32) across the sides;
  4. resharded (dp=2 x tp=2) against identity layout (dp=4 x tp=1: every tensor whole) on the
     same files, one client as in 1, cold and warm: goal <= 1.05;
  5. the read engine: fio on the same files, bs 4m, 8 in flight: psync with 8 jobs (each an
     eighth of the bytes) against io_uring with iodepth 8 and one job, cold (O_DIRECT), cold
     through the page cache (evicted first, as the daemon reads) and warm (buffered, cache
     kept): the io_uring / psync throughput ratio (docs/decisions.md, "Checkpoint reads").

1, 2 and 4 run in --repeat rounds, each load next to its baseline, and report the median of
the rounds' ratios (every round's shown); the daemon's user and system CPU during the loads
and the ranks' time inside Build calls are printed beside them, to show where time goes.
Prints a table of the ratios, each goal and met/missed. --smoke: a 0.02 GiB checkpoint, to check
that the bench runs and prints every ratio (goals not judged).

--huge-pages N (root): reserves N 2 MiB huge pages (vm.nr_hugepages) for the run and puts the
old value back at the end, so the daemon (--huge-pages auto, its default) makes its segments on
them, as on a node whose operator reserved them; the memcpy baseline's memfd is then a hugetlb
one too, and the safetensors ranks' arrays get what the kernel's transparent huge pages setting
gives anonymous memory (printed).
"""

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import huge_pages

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(ROOT, "client", "python")
INTEGRATION = os.path.join(ROOT, "tests", "integration")
for _p in (PACKAGE, INTEGRATION):
    if _p not in sys.path:
        sys.path.insert(0, _p)

BUILD = "familyd.v1.FamilyService/Build"
GIB = 1 << 30
MIB = 1 << 20
PARAMS = ("gate_proj", "up_proj", "down_proj")


def say(*args):
    print("checkpoint-bench:", *args, flush=True)


# -- the checkpoint ---------------------------------------------------------------------------

def model_shape(total):
    """(hidden, intermediate, layers) for about total bytes of float32 MLP weights: hidden
    2048 (intermediate 8192, 192 MiB a layer) halved until there are at least 4 layers."""
    hidden = 2048
    while hidden > 64 and 4 * 12 * hidden * hidden * 4 > total:
        hidden //= 2
    per_layer = 3 * hidden * 4 * hidden * 4
    return hidden, 4 * hidden, max(2, round(total / per_layer))


def tensor_names(layers):
    return ["model.layers.%d.mlp.%s.weight" % (i, p) for i in range(layers) for p in PARAMS]


def write_checkpoint(path, hidden, inter, layers, nfiles, seed=31):
    """The safetensors library writes nfiles files (consecutive tensors, as save_pretrained
    splits) and the index; each file is fsynced, so an eviction leaves nothing dirty."""
    import numpy as np
    from safetensors.numpy import save_file

    os.makedirs(path)
    names = tensor_names(layers)
    rng = np.random.default_rng(seed)
    weight_map = {}
    files = []
    for k in range(nfiles):
        part = names[k * len(names) // nfiles:(k + 1) * len(names) // nfiles]
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, nfiles)
        tensors = {}
        for n in part:
            shape = (hidden, inter) if ".down_proj." in n else (inter, hidden)
            tensors[n] = rng.standard_normal(shape, dtype=np.float32)
            weight_map[n] = fname
        fpath = os.path.join(path, fname)
        save_file(tensors, fpath, metadata={"format": "pt"})
        del tensors
        fd = os.open(fpath, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        files.append(fpath)
    total = sum(3 * hidden * inter * 4 for _ in range(layers))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return files, total


def disk_folder(base):
    """A new folder under base, which must not be a tmpfs (or ramfs)."""
    fstype = subprocess.run(["stat", "-f", "-c", "%T", base], check=True, capture_output=True,
                            text=True).stdout.strip()
    if fstype in ("tmpfs", "ramfs"):
        raise SystemExit("checkpoint-bench: %s is a %s; give --dir a folder on a disk" %
                         (base, fstype))
    return tempfile.mkdtemp(prefix="fd-ckpt-bench-", dir=base), fstype


def resident(paths):
    """Bytes of the files in the page cache (fincore, from util-linux-extra)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES"] + paths,
                         check=True, capture_output=True, text=True).stdout.split()
    return sum(int(x) for x in out)


def evict(paths):
    """Drops the files' pages from the page cache (they are clean: written and fsynced)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    left = resident(paths)
    if left > 0.01 * sum(os.path.getsize(p) for p in paths):
        say("warning: %d bytes still cached after the eviction" % left)
    return left


def warm(paths):
    """Reads the files into the page cache, and checks they are all resident."""
    buf = bytearray(16 * MIB)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    size = sum(os.path.getsize(p) for p in paths)
    got = resident(paths)
    if got < size:
        say("warning: only %d of %d bytes cached after warming" % (got, size))


# -- fio --------------------------------------------------------------------------------------

def fio(jobfile, text):
    """fio's total read throughput (bytes/s) for the job file's text (group reporting)."""
    with open(jobfile, "w") as f:
        f.write(text)
    run = subprocess.run(["fio", "--output-format=json", jobfile], capture_output=True,
                         text=True)
    if run.returncode != 0:
        raise SystemExit("checkpoint-bench: fio failed (%d) on\n%s\n%s%s"
                         % (run.returncode, text, run.stdout[-2000:], run.stderr[-2000:]))
    out = run.stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    if job["error"]:
        raise SystemExit("checkpoint-bench: fio: error %d" % job["error"])
    r = job["read"]
    return r["io_bytes"] / (r["runtime"] / 1000.0), r["io_bytes"]


def fio_global(direct):
    # invalidate=0: fio would otherwise drop the files' cached pages itself before a warm run.
    return ("[global]\nrw=read\nbs=4m\nthread\ngroup_reporting\ndirect=%d\ninvalidate=0\n"
            % (1 if direct else 0))


def fio_one_stream(files, direct):
    return fio_global(direct) + ("[seq]\nioengine=psync\nfile_service_type=sequential\n"
                                 "filename=%s\n" % ":".join(f.replace(":", "\\:") for f in files))


def fio_psync8(files, direct):
    """8 jobs, each a contiguous eighth of the bytes (8 / len(files) jobs per file), in whole
    blocks of 4 MiB (fio refuses a job smaller than its block; the last < 4 MiB of each file
    is left out, and throughput is bytes over time)."""
    per = 8 // len(files)
    text = fio_global(direct) + "ioengine=psync\n"
    n = 0
    for f in files:
        blocks = os.path.getsize(f) // (4 * MIB)
        for k in range(per):
            first, last = k * blocks // per, (k + 1) * blocks // per
            if last == first:
                continue
            n += 1
            text += "[part%d]\nfilename=%s\noffset=%d\nsize=%d\n" % (
                n, f.replace(":", "\\:"), first * 4 * MIB, (last - first) * 4 * MIB)
    if n == 0:
        raise SystemExit("checkpoint-bench: the files are smaller than fio's 4 MiB block")
    return text


def fio_uring8(files, direct):
    return fio_global(direct) + ("[uring]\nioengine=io_uring\niodepth=8\n"
                                 "file_service_type=sequential\nfilename=%s\n"
                                 % ":".join(f.replace(":", "\\:") for f in files))


# -- memcpy baseline --------------------------------------------------------------------------

def memcpy_seconds(files, threads, huge):
    """Seconds to copy the files' tensor bytes from their (resident, pre-touched) mappings into
    memory on threads threads, in pieces of 16 MiB: (into fresh memory made as the daemon makes
    a segment, a memfd of the size mapped shared, the making included and every page allocated
    at its first touch by the copy; into the same memory again, every page present: the copy
    alone), and the bytes. huge: the memfd on 2 MiB huge pages (MFD_HUGETLB, its size rounded
    up), as the daemon's segments are when huge pages are reserved."""
    import mmap
    import numpy as np

    maps, pieces, total = [], [], 0
    for p in files:
        with open(p, "rb") as f:
            head = int.from_bytes(f.read(8), "little")
            size = os.path.getsize(p)
            mm = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        maps.append(mm)
        data = np.frombuffer(mm, dtype=np.uint8, offset=8 + head)
        int(data[::4096].sum())              # every page mapped before the clock starts
        for off in range(0, data.size, 16 * MIB):
            piece = data[off:off + 16 * MIB]
            pieces.append((piece, total))
            total += piece.size
    lock = threading.Lock()
    dst = None

    def copy_all():
        todo = list(reversed(pieces))

        def run():
            while True:
                with lock:
                    if not todo:
                        return
                    src, at = todo.pop()
                np.copyto(dst[at:at + src.size], src)   # numpy lets go of the GIL here

        t0 = time.perf_counter()
        ts = [threading.Thread(target=run) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return time.perf_counter() - t0

    # Fresh memory as the daemon makes a segment: a memfd, its size set, mapped shared (each
    # page allocated at its first touch, by the copy).
    t0 = time.perf_counter()
    fd = os.memfd_create("checkpoint-bench-memcpy", os.MFD_HUGETLB if huge else 0)
    size = -(-total // huge_pages.HUGE_PAGE) * huge_pages.HUGE_PAGE if huge else total
    os.ftruncate(fd, size)
    seg = mmap.mmap(fd, size)
    os.close(fd)
    dst = np.frombuffer(seg, dtype=np.uint8)[:total]
    fresh = time.perf_counter() - t0 + copy_all()
    again = copy_all()
    dst = None
    seg.close()
    pieces.clear()
    data = piece = None           # noqa: F841 (the mappings close only without views)
    for m in maps:
        m.close()
    return fresh, again, total


# -- the daemon -------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def familyd_binary(a):
    if os.environ.get("FAMILYD_BIN"):
        return os.environ["FAMILYD_BIN"]
    build = a.build_dir or os.path.join(ROOT, "build-bench")
    if not os.path.isfile(os.path.join(build, "build.ninja")):
        say("configuring %s (release, no sanitizers)" % build)
        subprocess.run(["meson", "setup", build, ROOT, "-Dbuildtype=release",
                        "-Db_sanitize=none"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["ninja", "-C", build, "daemon/familyd", "proto/familyd.binpb"], check=True,
                   stdout=subprocess.DEVNULL)
    os.environ.setdefault("FAMILYD_DESCRIPTORS", os.path.join(build, "proto", "familyd.binpb"))
    return os.path.join(build, "daemon", "familyd")


def start_daemon(binary, tmp):
    sock = os.path.join(tmp, "familyd.sock")
    shard = os.path.join(tmp, "shard.sock")
    log = open(os.path.join(tmp, "familyd.log"), "w")
    proc = subprocess.Popen([binary, "--socket", sock, "--shard-socket", shard, "--registry",
                             os.path.join(ROOT, "deploy", "registry"), "--host-devices", "4",
                             "--build-grace-ms", "0"], stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not (os.path.exists(sock) and os.path.exists(shard)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("checkpoint-bench: familyd did not start (%s)" % log.name)
        time.sleep(0.05)
    time.sleep(0.2)
    return proc, sock, shard


def proc_io(pid):
    with open("/proc/%d/io" % pid) as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def disk_reads(path):
    """(read requests completed, sectors read) of the block device holding path (its
    /sys/dev/block/MAJ:MIN/stat: the whole machine's reads of that device)."""
    st = os.stat(path).st_dev
    with open("/sys/dev/block/%d:%d/stat" % (os.major(st), os.minor(st))) as f:
        w = f.read().split()
    return int(w[0]), int(w[2])


def cpu_seconds(pid):
    """(user, system) CPU seconds of process pid so far (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def rollup(pid="self"):
    """/proc/PID/smaps_rollup in bytes, by field."""
    out = {}
    with open("/proc/%s/smaps_rollup" % pid) as f:
        for line in f:
            w = line.split()
            if len(w) >= 3 and w[0].endswith(":") and w[2] == "kB":
                out[w[0][:-1]] = int(w[1]) * 1024
    return out


def shm_in_use(client):
    req = client.protos.cls("familyd.v1.GetStatusRequest")()
    return int(client.call("familyd.v1.AdminService/GetStatus", req).shm_bytes_in_use)


def build_request(client, cfg, mesh_id, token, layer, private):
    req = client.build_request("mlp", cfg, mesh_id, materialize=True, dtype="float32",
                               private_build=private)
    req.checkpoint.token = token
    req.checkpoint.prefix = "model.layers.%d.mlp" % layer
    return req


def load_layers(client, shard_sock, ckpt, mesh_id, cfg, layers):
    """One client: deposit, then every layer's Build in turn (private: never an earlier
    build's); seconds and the builds (released by release())."""
    import shard_client as SC

    t0 = time.perf_counter()
    token = SC.deposit(shard_sock, client.protos, ckpt)
    builds = [client.call(BUILD, build_request(client, cfg, mesh_id, token, i, True)).build
              for i in range(layers)]
    return time.perf_counter() - t0, builds


def release(client, builds, gone_ok=False):
    """Releases builds; with gone_ok, one already freed (its holders exited, grace 0) is
    passed over."""
    import familyd
    for b in builds:
        try:
            client.release_build(b.build_id, force=True)
        except familyd.FamilydError as e:
            if not (gone_ok and e.reason == "BUILD_NOT_FOUND"):
                raise


# -- rank workers (measure 3) -----------------------------------------------------------------

def worker(a):
    """One rank: waits for "go" on stdin, loads its parameters, prints a JSON line with its
    seconds, memory growth and the CRC-32 of each parameter, then waits for "exit"."""
    import numpy as np
    rank, tp = a.rank, a.rank % 2
    if a.side == "familyd":
        import familyd
        import familyd.shard as FS
        import shard_client as SC
        client = familyd.Client(a.socket, timeout=600)
        cfg = {"hidden_size": a.hidden, "intermediate_size": a.inter, "initializer_range": 0.02}
    else:
        from safetensors import safe_open
        with open(os.path.join(a.ckpt, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    before = rollup()
    t0 = time.perf_counter()
    params, keep = {}, []
    in_build = 0.0
    if a.side == "familyd":
        token = SC.deposit(a.shard_socket, client.protos, a.ckpt)
        for i in range(a.layers):
            t1 = time.perf_counter()
            b = client.call(BUILD, build_request(client, cfg, a.mesh, token, i, False)).build
            in_build += time.perf_counter() - t1
            s = next(s for s in b.shards if s.rank == rank)
            h = FS.fetch(b.shard_socket or a.shard_socket, [s.token], False, timeout=600,
                         protos=client.protos)[0]
            mm = h.map("read-only")          # populated: every page resident
            h.close()
            keep.append(mm)
            for sl in s.slices:
                params["%d.%s" % (i, sl.parameter)] = np.frombuffer(
                    mm, dtype=np.float32, count=sl.byte_length // 4,
                    offset=sl.byte_offset).reshape(tuple(sl.local_shape))
    else:
        half = a.inter // 2
        opened = {}
        for i in range(a.layers):
            for p in PARAMS:
                name = "model.layers.%d.mlp.%s.weight" % (i, p)
                fname = weight_map[name]
                if fname not in opened:
                    opened[fname] = safe_open(os.path.join(a.ckpt, fname), framework="numpy")
                sl = opened[fname].get_slice(name)
                if p == "down_proj":
                    arr = sl[:, tp * half:(tp + 1) * half]
                else:
                    arr = sl[tp * half:(tp + 1) * half]
                params["%d.%s" % (i, p)] = arr
    secs = time.perf_counter() - t0
    print("done", flush=True)           # the driver's clock stops at every rank's "done"
    after = rollup()
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in ("Pss_Anon", "Pss_File",
                                                               "Pss_Shmem", "Rss")}
    crcs = {k: zlib.crc32(np.ascontiguousarray(v).view(np.uint8).data) for k, v in
            sorted(params.items())}
    print(json.dumps({"rank": rank, "seconds": secs, "build_s": in_build, "grown": grown,
                      "crc": crcs}), flush=True)
    sys.stdin.readline()     # the mappings live until the driver has counted the memory
    del params, keep


def run_ranks(a, side, ckpt, sock, shard_sock, mesh_id, hidden, inter, layers, daemon_pid,
              client):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PACKAGE, INTEGRATION] +
                                                      [os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    procs = []
    for r in range(4):
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--side", side,
                "--rank", str(r), "--ckpt", ckpt, "--hidden", str(hidden), "--inter", str(inter),
                "--layers", str(layers)]
        if side == "familyd":
            argv += ["--socket", sock, "--shard-socket", shard_sock, "--mesh", mesh_id]
        procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env=env, text=True))
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("checkpoint-bench: a %s rank did not start" % side)
        daemon0 = rollup(daemon_pid)
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            if p.stdout.readline().strip() != "done":
                raise SystemExit("checkpoint-bench: a %s rank failed to load" % side)
        secs = time.perf_counter() - t0
        rows = [json.loads(p.stdout.readline()) for p in procs]
        daemon1 = rollup(daemon_pid)
        shm = shm_in_use(client) if side == "familyd" else 0
        for p in procs:
            p.stdin.write("exit\n")
            p.stdin.flush()
        for p in procs:
            if p.wait(120) != 0:
                raise SystemExit("checkpoint-bench: a %s rank failed" % side)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    anon = sum(r["grown"]["Pss_Anon"] for r in rows)
    daemon_anon = daemon1.get("Pss_Anon", 0) - daemon0.get("Pss_Anon", 0) \
        if side == "familyd" else 0
    return {"seconds": secs, "build_s": max(r["build_s"] for r in rows),
            "rank_s": max(r["seconds"] for r in rows), "workers_anon": anon,
            "daemon_anon": daemon_anon, "shm": shm,
            "memory": anon + daemon_anon + shm,
            "page_cache_mapped": sum(r["grown"]["Pss_File"] for r in rows),
            "workers_shmem": sum(r["grown"]["Pss_Shmem"] for r in rows),
            "crc": {r["rank"]: r["crc"] for r in rows}}


# -- the run ----------------------------------------------------------------------------------

def measure(a, tmp, ckpt, files, hidden, inter, layers, needed):
    import familyd

    binary = familyd_binary(a)
    proc, sock, shard_sock = start_daemon(binary, tmp)
    res = {}
    try:
        client = familyd.Client(sock, timeout=1200)
        cfg = {"hidden_size": hidden, "intermediate_size": inter, "initializer_range": 0.02}
        mesh22 = client.create_mesh([("dp", 2), ("tp", 2)]).mesh_id
        mesh41 = client.create_mesh([("dp", 4), ("tp", 1)]).mesh_id
        tensors = [f for f in files if f.endswith(".safetensors")]
        jobs = os.path.join(tmp, "job.fio")

        # 5: the read engines, cold (O_DIRECT needs no eviction) and warm.
        res["fio_psync8_direct"], _ = fio(jobs, fio_psync8(tensors, True))
        res["fio_uring8_direct"], _ = fio(jobs, fio_uring8(tensors, True))
        evict(tensors)      # cold through the page cache, as the daemon reads
        res["fio_psync8_buffered_cold"], _ = fio(jobs, fio_psync8(tensors, False))
        evict(tensors)
        res["fio_uring8_buffered_cold"], _ = fio(jobs, fio_uring8(tensors, False))
        warm(tensors)
        res["fio_psync8_buffered"], _ = fio(jobs, fio_psync8(tensors, False))
        res["fio_uring8_buffered"], _ = fio(jobs, fio_uring8(tensors, False))

        # 1, 2 and 4, each load next to its baseline, --repeat rounds.
        res["rounds"] = []
        for _ in range(a.repeat):
            r = {}
            r["fio_seq_direct"], _ = fio(jobs, fio_one_stream(tensors, True))
            evict(tensors)
            io0, cpu0, dk0 = proc_io(proc.pid), cpu_seconds(proc.pid), disk_reads(ckpt)
            r["cold_s"], builds = load_layers(client, shard_sock, ckpt, mesh22, cfg, layers)
            io1, cpu1, dk1 = proc_io(proc.pid), cpu_seconds(proc.pid), disk_reads(ckpt)
            r["cold_syscr"] = io1["syscr"] - io0["syscr"]
            r["cold_disk_requests"] = dk1[0] - dk0[0]
            r["cold_disk_sectors"] = dk1[1] - dk0[1]
            r["cold_user_s"], r["cold_sys_s"] = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
            release(client, builds)
            r["cold_rchar"] = io1["rchar"] - io0["rchar"]
            r["cold_disk"] = io1["read_bytes"] - io0["read_bytes"]
            evict(tensors)      # the same stream through the page cache, as pread reads
            r["fio_seq_buffered_cold"], _ = fio(jobs, fio_one_stream(tensors, False))
            evict(tensors)
            io0, dk0 = proc_io(proc.pid), disk_reads(ckpt)
            r["cold_identity_s"], builds = load_layers(client, shard_sock, ckpt, mesh41, cfg,
                                                       layers)
            io1, dk1 = proc_io(proc.pid), disk_reads(ckpt)
            r["cold_identity_syscr"] = io1["syscr"] - io0["syscr"]
            r["cold_identity_disk_requests"] = dk1[0] - dk0[0]
            r["cold_identity_disk_sectors"] = dk1[1] - dk0[1]
            release(client, builds)

            warm(tensors)
            cpu0 = cpu_seconds(proc.pid)
            r["warm_s"], builds = load_layers(client, shard_sock, ckpt, mesh22, cfg, layers)
            cpu1 = cpu_seconds(proc.pid)
            r["warm_user_s"], r["warm_sys_s"] = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
            release(client, builds)
            r["memcpy_s"], r["memcpy_warm_s"], copied = memcpy_seconds(tensors, a.fill_threads,
                                                                       a.huge_pages > 0)
            if copied != needed:
                raise SystemExit("checkpoint-bench: memcpy copied %d of %d bytes"
                                 % (copied, needed))
            r["warm_identity_s"], builds = load_layers(client, shard_sock, ckpt, mesh41, cfg,
                                                       layers)
            release(client, builds)
            res["rounds"].append(r)
        for k in res["rounds"][0]:
            res[k] = statistics.median(r[k] for r in res["rounds"])

        # 3: four ranks, cold then warm.
        for state in ("cold", "warm"):
            for side in ("familyd", "safetensors"):
                if state == "cold":
                    evict(tensors)
                else:
                    warm(tensors)
                r = run_ranks(a, side, ckpt, sock, shard_sock, mesh22, hidden, inter, layers,
                              proc.pid, client)
                res["ranks_%s_%s" % (state, side)] = r
                # This daemon's builds are ours; the workers' go as they exit (grace 0).
                release(client, client.list_builds(), gone_ok=True)
            f, s = res["ranks_%s_familyd" % state], res["ranks_%s_safetensors" % state]
            if f["crc"] != s["crc"]:
                raise SystemExit("checkpoint-bench: the ranks' parameters differ between "
                                 "familyd and safetensors (%s)" % state)
            del f["crc"], s["crc"]
        client.close()
    finally:
        proc.terminate()
        proc.wait(60)
    if proc.returncode != 0:
        raise SystemExit("checkpoint-bench: familyd exited with %d" % proc.returncode)
    return res


def report(a, res, hidden, inter, layers, needed, nfiles, fstype):
    gbs = lambda bps: bps / 1e9   # noqa: E731
    need = needed
    cold_bw, warm_bw = need / res["cold_s"], need / res["warm_s"]
    memcpy_bw, memcpy_warm_bw = need / res["memcpy_s"], need / res["memcpy_warm_s"]
    fc, sc = res["ranks_cold_familyd"], res["ranks_cold_safetensors"]
    fw, sw = res["ranks_warm_familyd"], res["ranks_warm_safetensors"]
    print("\ncheckpoint: %d layers x MLP (hidden %d, intermediate %d), float32, %.3f GiB of "
          "tensors in %d files on %s; dp=2 x tp=2, 4 host ranks; %d fill threads"
          % (layers, hidden, inter, need / GIB, nfiles, fstype, a.fill_threads))
    print("cold GB/s: load %.3f; fio O_DIRECT 1 stream %.3f, psync x8 %.3f, io_uring depth 8 "
          "%.3f; fio buffered 1 stream %.3f, psync x8 %.3f, io_uring depth 8 %.3f"
          % (gbs(cold_bw), gbs(res["fio_seq_direct"]), gbs(res["fio_psync8_direct"]),
             gbs(res["fio_uring8_direct"]), gbs(res["fio_seq_buffered_cold"]),
             gbs(res["fio_psync8_buffered_cold"]), gbs(res["fio_uring8_buffered_cold"])))
    print("warm GB/s: load %.3f; memcpy into fresh memory %.3f, into present pages %.3f; fio "
          "buffered psync x8 %.3f, io_uring depth 8 %.3f"
          % (gbs(warm_bw), gbs(memcpy_bw), gbs(memcpy_warm_bw), gbs(res["fio_psync8_buffered"]),
             gbs(res["fio_uring8_buffered"])))
    print("cold load: the daemon read %d bytes (rchar), %d from the disk (read_bytes), for %d "
          "bytes of tensors" % (res["cold_rchar"], res["cold_disk"], need))
    print("seconds: cold load %.3f (identity %.3f), warm load %.3f (identity %.3f), memcpy "
          "%.3f (present pages %.3f)"
          % (res["cold_s"], res["cold_identity_s"], res["warm_s"], res["warm_identity_s"],
             res["memcpy_s"], res["memcpy_warm_s"]))
    for name, pre in (("resharded (dp=2 x tp=2)", "cold"), ("identity (dp=4 x tp=1)",
                                                             "cold_identity")):
        print("cold load, %s: the daemon's read calls %d (%.0f KiB each); the disk's read "
              "requests %d (%.0f KiB each, the whole machine's)"
              % (name, res[pre + "_syscr"], need / 1024 / max(res[pre + "_syscr"], 1),
                 res[pre + "_disk_requests"],
                 res[pre + "_disk_sectors"] / 2 / max(res[pre + "_disk_requests"], 1)))
    print("the daemon's CPU during the loads (dp=2 x tp=2): cold %.3f s user, %.3f s system; "
          "warm %.3f s user, %.3f s system" % (res["cold_user_s"], res["cold_sys_s"],
                                               res["warm_user_s"], res["warm_sys_s"]))
    for state, f, s in (("cold", fc, sc), ("warm", fw, sw)):
        for side, r in (("familyd", f), ("safetensors", s)):
            print("4 ranks %s, %-11s: %.3f s to every rank's parameters (slowest rank %.3f, "
                  "of it in Build calls %.3f); memory %.3f GiB (workers' anonymous %.3f, "
                  "daemon's anonymous %.3f, shared memory %.3f); workers' shmem PSS %.3f, "
                  "mapped page cache %.3f"
                  % (state, side, r["seconds"], r["rank_s"], r["build_s"], r["memory"] / GIB,
                     r["workers_anon"] / GIB, r["daemon_anon"] / GIB, r["shm"] / GIB,
                     r["workers_shmem"] / GIB, r["page_cache_mapped"] / GIB))
    rounds = res["rounds"]

    def over_rounds(f):
        """The median over the rounds of a round's ratio, and every round's."""
        vals = [f(r) for r in rounds]
        return statistics.median(vals), vals

    rows = [
        ("cold load / fio O_DIRECT sequential (throughput)",
         over_rounds(lambda r: need / (r["cold_s"] * r["fio_seq_direct"])), ">=", 0.9),
        ("cold bytes read / bytes the shards need",
         over_rounds(lambda r: r["cold_rchar"] / need), "<=", 1.01),
        ("cold load / fio buffered sequential (throughput)",
         over_rounds(lambda r: need / (r["cold_s"] * r["fio_seq_buffered_cold"])), None, None),
        ("warm load / memcpy into fresh memory (throughput)",
         over_rounds(lambda r: r["memcpy_s"] / r["warm_s"]), ">=", 0.8),
        ("warm load / memcpy into present pages (throughput)",
         over_rounds(lambda r: r["memcpy_warm_s"] / r["warm_s"]), None, None),
        ("4 ranks cold: familyd / safetensors (time)", fc["seconds"] / sc["seconds"], "<=", 0.3),
        ("4 ranks cold: familyd / safetensors (memory)", fc["memory"] / max(sc["memory"], 1),
         None, None),
        ("4 ranks warm: familyd / safetensors (time)", fw["seconds"] / sw["seconds"], "<=", 0.3),
        ("4 ranks warm: familyd / safetensors (memory)", fw["memory"] / max(sw["memory"], 1),
         None, None),
        ("cold: resharded tp=2 / identity tp=1 (time)",
         over_rounds(lambda r: r["cold_s"] / r["cold_identity_s"]), "<=", 1.05),
        ("warm: resharded tp=2 / identity tp=1 (time)",
         over_rounds(lambda r: r["warm_s"] / r["warm_identity_s"]), "<=", 1.05),
        ("fio cold: io_uring depth 8 / psync x8 (throughput)",
         res["fio_uring8_direct"] / res["fio_psync8_direct"], None, None),
        ("fio cold buffered: io_uring depth 8 / psync x8",
         res["fio_uring8_buffered_cold"] / res["fio_psync8_buffered_cold"], None, None),
        ("fio warm: io_uring depth 8 / psync x8 (throughput)",
         res["fio_uring8_buffered"] / res["fio_psync8_buffered"], None, None),
    ]
    print("\n%-52s %8s %8s  %-10s %s" % ("ratio", "value", "goal", "result",
                                           "rounds" if len(rounds) > 1 else ""))
    out = []
    for name, v, op, goal in rows:
        each = []
        if isinstance(v, tuple):
            v, each = v
        if op is None:
            verdict, g = "(reported)", "-"
        else:
            ok = v >= goal if op == ">=" else v <= goal
            verdict, g = ("met" if ok else "missed"), "%s %.2f" % (op, goal)
        print("%-52s %8.3f %8s  %-10s %s" % (name, v, g, verdict,
                                             " ".join("%.3f" % x for x in each)
                                             if len(each) > 1 else ""))
        out.append({"ratio": name, "value": v, "goal": g, "result": verdict, "rounds": each})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--shard-socket", help=argparse.SUPPRESS)
    p.add_argument("--mesh", help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, help=argparse.SUPPRESS)
    p.add_argument("--inter", type=int, help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="a 0.02 GiB checkpoint, goals not judged")
    p.add_argument("--gib", type=float, default=2.0, help="checkpoint size (default 2)")
    p.add_argument("--files", type=int, choices=(2, 4), default=4,
                   help="safetensors files (default 4; 8 fio jobs split them evenly)")
    p.add_argument("--dir", default="/var/tmp",
                   help="where the checkpoint's folder goes (a disk, not a tmpfs)")
    p.add_argument("--build-dir", help="release build folder (default build-bench)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of the loads beside their baselines (1, 2, 4); medians")
    p.add_argument("--json", help="write the measurements and ratios here")
    p.add_argument("--huge-pages", type=int, default=0, metavar="N",
                   help="reserve N 2 MiB huge pages for the run (root; restored at the end)")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if a.smoke:
        a.gib = 0.02
    for tool in ("fio", "fincore"):
        if not shutil.which(tool):
            raise SystemExit("checkpoint-bench: no %s on PATH (deploy/dev/install-deps.sh --tests "
                             "installs it)" % tool)
    a.fill_threads = os.cpu_count() or 1      # the daemon's default (--fill-threads 0)
    hidden, inter, layers = model_shape(int(a.gib * GIB))
    folder, fstype = disk_folder(a.dir)
    tmp = tempfile.mkdtemp(prefix="fd-ckpt-bench-run-")
    try:
        ckpt = os.path.join(folder, "checkpoint")
        t0 = time.perf_counter()
        files, needed = write_checkpoint(ckpt, hidden, inter, layers, a.files)
        say("wrote %d layers (%.3f GiB) into %d files in %.1f s (%s)"
            % (layers, needed / GIB, a.files, time.perf_counter() - t0, ckpt))
        with huge_pages.reserved(a.huge_pages, "checkpoint-bench"):
            say("%d huge pages of 2 MiB reserved for the daemon; anonymous transparent huge "
                "pages: %s" % (a.huge_pages, huge_pages.thp_setting()))
            res = measure(a, tmp, ckpt, files, hidden, inter, layers, needed)
        rows = report(a, res, hidden, inter, layers, needed, a.files, fstype)
        if a.smoke:   # it ran: every ratio is there and finite (the goals are not judged)
            for r in rows:
                if not (r["value"] > 0 and math.isfinite(r["value"])):
                    raise SystemExit("checkpoint-bench: %s is %r" % (r["ratio"], r["value"]))
            say("smoke run complete")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"shape": {"hidden": hidden, "intermediate": inter, "layers": layers,
                                     "bytes": needed, "files": a.files},
                           "huge_pages": a.huge_pages, "measured": res, "ratios": rows}, f,
                          indent=1)
    except BaseException:
        # The daemon's log goes with tmp: its end first, for whoever reads the failure.
        try:
            with open(os.path.join(tmp, "familyd.log"), errors="replace") as f:
                sys.stderr.write("checkpoint-bench: the end of familyd's log:\n" +
                                 "".join(f.readlines()[-40:]))
        except OSError:
            pass
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
