#!/usr/bin/python3
"""topology-bench: the cost of familyd's membership protocol at 2, 4 and 8 daemons on loopback.

    tests/bench/run-topology-bench.sh [--smoke] [BUILD_DIR] [-- ARGS...]   (builds, then runs this)
    /usr/bin/python3 tests/bench/topology-bench.py [--quick] [--sizes 2,4,8] [--reps 5] ...

Real daemons (tests/integration/cluster_harness.Cluster, familyd_harness.Daemon) talk UCX over
tcp on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo); the bench talks to them only through gRPC and reads
/proc. Four measurements, each printed as a table:

1. Convergence. The seed (node0) is spawned, and as soon as it serves every other daemon is
   spawned at once, all joining through the seed (a cluster boot). GetTopology is polled on
   every daemon in a tight loop; agreement is the first poll round in which every daemon
   answers with the same version, world size and node list, all nodes up. Reported: the time
   from spawning the seed to agreement; from the last daemon answering its first GetTopology
   (serving) to the first round in which every daemon lists every node up (the members are
   complete, the versions may still differ), and from there to agreement: both leave out
   process start. Median and [min-max] over --reps runs, per heartbeat interval
   (--converge-heartbeats, default 1000 and 100 ms). Also the agreed version and the bytes all
   daemons had sent when the members were complete (GetStatus peer_bytes_sent: hellos,
   announces and the few heartbeats of that time).
2. Traffic. After agreement (on the last run at --traffic-heartbeat), GetStatus's
   peer_messages_sent and peer_bytes_sent of every daemon, --traffic-seconds apart: messages
   and bytes one daemon sends per heartbeat interval (mean over the daemons), and per peer.
3. Idle CPU. In one run, a cluster of --idle-daemons daemons (default 8: 7 peers each) and one
   daemon started without --listen (no peers, same registry and devices): utime+stime from
   /proc/PID/stat of each over the same --idle-seconds window (default 60) after agreement, with
   no RPC during the window. Reported per heartbeat (--idle-heartbeats, default 1000 and
   100 ms; suspect and down at 3x and 10x the heartbeat, the defaults' ratios): the peered
   daemons' median [min-max], the lone daemon's, and their ratio. utime+stime counts 10 ms
   ticks; the on-CPU nanoseconds of every thread (/proc/PID/task/*/schedstat) are printed
   beside it, and the ratio of those too, because a lone idle daemon may not use one tick.
4. The cluster key's cost. --auth-reps boots (default 5) of --auth-daemons daemons
   (default 8) with --cluster-key and as many without (loopback needs no --insecure-peers),
   alternating, at each converge heartbeat: serving -> agreed is the handshakes, hellos and
   the version round; then a keyed and a plain cluster at rest side by side over the same
   windows (--auth-windows, default 5, of 20 s) at each idle heartbeat: on-CPU time of the
   keyed daemons against the plain ones, per window, and the median of those ratios. The goal:
   keyed/plain idle CPU <= 1.10 (authentication costs at most 10%).

--quick: sizes 2 and 4, one run at 100 ms, 2 s of traffic, 5 s idle windows with 4 daemons:
4 daemons and one boot per mode for the key: a smoke run (about a minute). Lines `ratio ...` and `goal ...` summarise; --check-goals
exits 1 when a goal (traffic per peer flat within 1.5x from the smallest N to the largest;
the key's idle CPU) is missed. --json FILE writes every raw number.

All daemons and this script share the machine's cores (2 on the CI machine), often with other
load: convergence times are noisy, CPU time (not wall time) is what the idle figure counts.
"""

import argparse
import json
import math
import os
import random
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import familyd_harness as H  # noqa: E402
from cluster_harness import Cluster, REGISTRY, new_key, write_key  # noqa: E402

HOST_DEVICES = 2
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
AUTH_IDLE_GOAL = 1.10   # authentication costs at most 10% of idle CPU


def log(msg):
    sys.stderr.write("topology-bench: %s\n" % msg)
    sys.stderr.flush()


def timing(hb):
    """Suspect and down at the defaults' ratios (1000/3000/10000 ms)."""
    return dict(heartbeat_ms=hb, suspect_ms=3 * hb, down_ms=10 * hb)


def median_range(xs, fmt="%.2f"):
    if not xs:
        return "-"
    return (fmt + " [" + fmt + "-" + fmt + "]") % (statistics.median(xs), min(xs), max(xs))


def quiet_ports(n):
    """n free loopback ports below the kernel's ephemeral range. cluster_harness.free_port()
    returns an ephemeral port, and with tens of daemons UCX's tcp transport (which binds
    ephemeral ports for its own listeners in every daemon) takes one of them before the daemon
    meant to listen there starts: "Address already in use"."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = max(low, 2048)
    ports = []
    for port in random.sample(range(1024, top), min(top - 1024, 4 * n + 64)):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        ports.append(port)
        if len(ports) == n:
            return ports
    return None


def make_cluster(n, hb, cluster_key=None):
    c = Cluster(n, host_devices=HOST_DEVICES, cluster_key=cluster_key, **timing(hb))
    ports = quiet_ports(n)
    if ports:
        for d in c.daemons:
            d.cleanup()           # never started: removes the temporary folder it made
        c.ports = ports
        c.seeds = c.address(0)
        c.daemons = [c.make(i) for i in range(n)]
    return c


# ---------------------------------------------------------------------------------------------
# 1. Convergence

def view_of(t):
    return (t.version, t.world_size, tuple((n.name, n.first_rank, len(n.devices), n.state)
                                           for n in t.nodes))


def converge_once(n, hb, timeout=60.0, cluster_key=None):
    """One cluster boot; returns (the Cluster, still running, and a dict of timings)."""
    c = make_cluster(n, hb, cluster_key)
    want_world = n * HOST_DEVICES
    clients = [None] * n
    serving = [None] * n
    try:
        t0 = time.monotonic()
        c.daemons[0].start()              # spawn the seed, wait until it serves
        serving[0] = time.monotonic() - t0
        clients[0] = c.daemons[0].client
        for d in c.daemons[1:]:
            d.spawn()
        deadline = t0 + timeout
        views = [None] * n
        t_members = None
        while True:
            now = time.monotonic()
            if now > deadline:
                raise AssertionError("no agreement within %.0f s at N=%d:\n%s" % (
                    timeout, n, "\n".join("  %d: %r" % (i, v) for i, v in enumerate(views))))
            for i, d in enumerate(c.daemons):
                if clients[i] is None:
                    rc = d.proc.poll()
                    if rc is not None:
                        d._fail("familyd exited with status %d during the join" % rc)
                    # A channel that failed to connect backs off: make it once the socket is up.
                    if not H.socket_accepts(d.socket):
                        continue
                    clients[i] = d.client = H.Client(d.socket, c.protos)
                res = clients[i].call("familyd.v1.MeshService/GetTopology", timeout=5)
                if not res.ok:
                    continue
                if serving[i] is None:
                    serving[i] = time.monotonic() - t0
                views[i] = view_of(res.reply)
            complete = all(v is not None and v[1] == want_world and
                           all(x[3] == "up" for x in v[2]) for v in views)
            if complete and t_members is None and all(v[1:] == views[0][1:] for v in views):
                # Every daemon lists every node, all up; the versions may still differ.
                t_members = time.monotonic() - t0
                st = [c.status(i) for i in range(n)]
            if complete and t_members is not None and all(v == views[0] for v in views):
                t_agree = time.monotonic() - t0
                break
            time.sleep(0.005)
        return c, {
            "n": n, "heartbeat_ms": hb,
            "start_to_agreement_s": t_agree,
            "serving_to_members_s": t_members - max(serving),
            "serving_to_agreement_s": t_agree - max(serving),
            "serving_s": serving,
            "version": views[0][0],
            # Read when the members were complete: hellos and announces, a few heartbeats.
            "join_bytes_all": sum(x.peer_bytes_sent for x in st),
            "join_messages_all": sum(x.peer_messages_sent for x in st),
        }
    except BaseException:
        c.cleanup()
        raise


def shutdown(c):
    try:
        c.stop()          # SIGTERM; asserts every daemon exits 0
    finally:
        c.cleanup()


# ---------------------------------------------------------------------------------------------
# 2. Traffic per heartbeat interval

def traffic(c, n, hb, seconds):
    time.sleep(max(0.5, 3 * hb / 1000.0))    # announces and the version round are over
    a, ta = [], []
    for i in range(n):
        a.append(c.status(i))
        ta.append(time.monotonic())
    time.sleep(seconds)
    b, tb = [], []
    for i in range(n):
        b.append(c.status(i))
        tb.append(time.monotonic())
    msgs, byts, up = [], [], []
    for x, y, t1, t2 in zip(a, b, ta, tb):
        intervals = (t2 - t1) * 1000.0 / hb
        msgs.append((y.peer_messages_sent - x.peer_messages_sent) / intervals)
        byts.append((y.peer_bytes_sent - x.peer_bytes_sent) / intervals)
        up.append(y.peers_up)
    peers = n - 1
    return {
        "n": n, "heartbeat_ms": hb, "seconds": seconds,
        "messages_per_interval": statistics.mean(msgs),
        "bytes_per_interval": statistics.mean(byts),
        "messages_per_interval_max": max(msgs),
        "bytes_per_interval_max": max(byts),
        "messages_per_peer": statistics.mean(msgs) / peers,
        "bytes_per_peer": statistics.mean(byts) / peers,
        "bytes_per_message": statistics.mean(byts) / statistics.mean(msgs) if sum(msgs) else 0.0,
        "peers_up_min": min(up),
    }


# ---------------------------------------------------------------------------------------------
# 3. Idle CPU

def cpu_ticks(pid):
    """utime + stime of the whole process (every thread, live or gone), in clock ticks."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])     # fields 14 and 15 of proc(5)


def cpu_ns(pid):
    """On-CPU nanoseconds summed over the live threads (schedstat's first field)."""
    total = 0
    tdir = "/proc/%d/task" % pid
    for tid in os.listdir(tdir):
        try:
            with open(os.path.join(tdir, tid, "schedstat")) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def idle_cpu(n, hb, seconds):
    alone = H.Daemon(REGISTRY, host_devices=HOST_DEVICES, node_name="alone", state_dir=False)
    c = None
    try:
        alone.start()
        c = make_cluster(n, hb).start()
        c.wait_agreement(world_size=n * HOST_DEVICES, states=["up"] * n, timeout=60)
        time.sleep(max(2.0, 2 * hb / 1000.0))
        pids = [d.proc.pid for d in c.daemons] + [alone.proc.pid]
        t1 = [(cpu_ticks(p), cpu_ns(p)) for p in pids]
        w0 = time.monotonic()
        time.sleep(seconds)                  # no RPC to anyone in the window
        window = time.monotonic() - w0
        t2 = [(cpu_ticks(p), cpu_ns(p)) for p in pids]
        # Still one cluster, nobody suspected on the way.
        c.wait_agreement(world_size=n * HOST_DEVICES, states=["up"] * n, timeout=10)
        flaps = [c.status(i).peers_suspect + c.status(i).peers_down for i in range(n)]
        ms = [(b[0] - a[0]) * TICK_S * 1000.0 for a, b in zip(t1, t2)]
        ns = [(b[1] - a[1]) / 1e6 for a, b in zip(t1, t2)]
        return {
            "n": n, "peers": n - 1, "heartbeat_ms": hb, "window_s": window,
            "peered_ms": ms[:-1], "alone_ms": ms[-1],
            "peered_sched_ms": ns[:-1], "alone_sched_ms": ns[-1],
            "suspect_or_down_after": flaps,
        }
    finally:
        if c is not None:
            shutdown(c)
        try:
            alone.stop()
        finally:
            alone.cleanup()


def ratio(a, b):
    return a / b if b > 0 else float("inf")


# ---------------------------------------------------------------------------------------------
# 4. What the cluster key costs

def auth_joins(n, hb, reps, key):
    """reps boots of n daemons with the key and as many without, alternating which goes first
    so that drift hits both alike; returns {"keyed": [...], "plain": [...]} of converge_once's
    timings."""
    out = {"keyed": [], "plain": []}
    for rep in range(reps):
        order = ["keyed", "plain"] if rep % 2 == 0 else ["plain", "keyed"]
        for mode in order:
            log("auth: N=%d heartbeat %d ms, %s boot %d/%d" % (n, hb, mode, rep + 1, reps))
            c, r = converge_once(n, hb, cluster_key=key if mode == "keyed" else None)
            shutdown(c)
            out[mode].append(r)
    return out


def auth_idle(n, hb, seconds, windows, key):
    """A cluster of n daemons with the key and one of n without (loopback needs no
    --insecure-peers), at rest side by side: CPU of each daemon over `windows` consecutive
    windows of `seconds`, so that a burst of other load shows as one odd window."""
    keyed = plain = None
    try:
        keyed = make_cluster(n, hb, key).start()
        plain = make_cluster(n, hb).start()
        for c in (keyed, plain):
            c.wait_agreement(world_size=n * HOST_DEVICES, states=["up"] * n, timeout=60)
        time.sleep(max(2.0, 2 * hb / 1000.0))
        pids = [d.proc.pid for d in keyed.daemons + plain.daemons]
        out = {"n": n, "heartbeat_ms": hb, "windows": []}
        for _ in range(windows):
            t1 = [(cpu_ticks(p), cpu_ns(p)) for p in pids]
            w0 = time.monotonic()
            time.sleep(seconds)
            window = time.monotonic() - w0
            t2 = [(cpu_ticks(p), cpu_ns(p)) for p in pids]
            ms = [(b[0] - a[0]) * TICK_S * 1000.0 for a, b in zip(t1, t2)]
            ns = [(b[1] - a[1]) / 1e6 for a, b in zip(t1, t2)]
            out["windows"].append({"window_s": window, "keyed_ms": ms[:n], "plain_ms": ms[n:],
                                   "keyed_sched_ms": ns[:n], "plain_sched_ms": ns[n:]})
        for c in (keyed, plain):
            c.wait_agreement(world_size=n * HOST_DEVICES, states=["up"] * n, timeout=10)
        return out
    finally:
        for c in (keyed, plain):
            if c is not None:
                shutdown(c)


def auth_report(joins, idle, goal):
    """Prints the key's cost; returns whether the idle-CPU goal was met."""
    print()
    print("cluster key: boots of N daemons with --cluster-key against without, alternating; "
          "median [min-max] s")
    print("%-6s %3s %-7s %-19s %-19s" % ("hb ms", "N", "mode", "spawn->agreed s",
                                        "serving->agreed s"))
    for (n, hb), by_mode in sorted(joins.items()):
        for mode in ("keyed", "plain"):
            rs = by_mode[mode]
            print("%-6d %3d %-7s %-19s %-19s" % (
                hb, n, mode, median_range([r["start_to_agreement_s"] for r in rs]),
                median_range([r["serving_to_agreement_s"] for r in rs])))
        k = statistics.median([r["serving_to_agreement_s"] for r in by_mode["keyed"]])
        p = statistics.median([r["serving_to_agreement_s"] for r in by_mode["plain"]])
        print("ratio auth join N=%d @%dms keyed/plain: %.2f (%+.0f ms)" % (
            n, hb, ratio(k, p), (k - p) * 1000.0))
    met = True
    for r in idle:
        qs = []
        for w in r["windows"]:
            ks = statistics.median(w["keyed_sched_ms"])
            ps = statistics.median(w["plain_sched_ms"])
            qs.append(ratio(ks, ps))
            print("auth idle @%dms, %d peers, %.0f s: keyed %s ms (sched %s), plain %s ms "
                  "(sched %s), sched ratio %.3f" % (
                      r["heartbeat_ms"], r["n"] - 1, w["window_s"],
                      median_range(w["keyed_ms"], "%.0f"),
                      median_range(w["keyed_sched_ms"], "%.1f"),
                      median_range(w["plain_ms"], "%.0f"),
                      median_range(w["plain_sched_ms"], "%.1f"), qs[-1]))
        q = statistics.median(qs)
        print("ratio auth idle cpu keyed/plain @%dms: sched %.3f (median of %d windows)" % (
            r["heartbeat_ms"], q, len(qs)))
        ok = q <= goal
        met = met and ok
        print("goal auth idle cpu @%dms keyed/plain <= %.2f: %.3f %s" % (
            r["heartbeat_ms"], goal, q, "met" if ok else "NOT MET"))
    return met


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--sizes", help="daemon counts for convergence and traffic (default 2,4,8)")
    ap.add_argument("--reps", type=int, help="cluster boots per size and heartbeat (default 5)")
    ap.add_argument("--converge-heartbeats", help="heartbeat intervals in ms (default 1000,100)")
    ap.add_argument("--traffic-heartbeat", type=int, default=100,
                    help="heartbeat of the traffic runs in ms (default 100)")
    ap.add_argument("--traffic-seconds", type=float, help="traffic window (default 5)")
    ap.add_argument("--idle-daemons", type=int, help="cluster size of the idle run (default 8)")
    ap.add_argument("--idle-seconds", type=float, help="idle window (default 60)")
    ap.add_argument("--idle-heartbeats", help="heartbeats of the idle runs (default 1000,100)")
    ap.add_argument("--auth-daemons", type=int, help="cluster size of the key's cost (default 8)")
    ap.add_argument("--auth-reps", type=int, help="boots per mode for the key's cost (default 5)")
    ap.add_argument("--auth-windows", type=int,
                    help="idle windows of the key's cost, the ratio their median (default 5)")
    ap.add_argument("--skip", default="",
                    help="comma list of converge,traffic,idle,auth to skip")
    ap.add_argument("--check-goals", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--json", help="write the raw numbers to this file")
    a = ap.parse_args()

    q = a.quick
    sizes = sorted(int(x) for x in (a.sizes or ("2,4" if q else "2,4,8")).split(","))
    reps = a.reps or (1 if q else 5)
    conv_hbs = [int(x) for x in (a.converge_heartbeats or ("100" if q else "1000,100")).split(",")]
    boot_hbs = list(conv_hbs)     # traffic rides on the last boot at its heartbeat
    traffic_s = a.traffic_seconds or (2.0 if q else 5.0)
    idle_n = a.idle_daemons or (4 if q else 8)
    idle_s = a.idle_seconds or (5.0 if q else 60.0)
    idle_hbs = [int(x) for x in (a.idle_heartbeats or "1000,100").split(",")]
    auth_n = a.auth_daemons or (4 if q else 8)
    auth_reps = a.auth_reps or (1 if q else 5)
    auth_windows = a.auth_windows or (1 if q else 5)
    auth_secs = idle_s if q else min(idle_s, 20.0)
    skip = set(x for x in a.skip.split(",") if x)
    if a.traffic_heartbeat not in boot_hbs and "traffic" not in skip:
        boot_hbs.append(a.traffic_heartbeat)

    if not os.path.exists(H.familyd_bin()):
        sys.stderr.write("topology-bench: familyd not found at %s (set FAMILYD_BIN)\n"
                         % H.familyd_bin())
        return 1
    print("topology-bench: familyd %s" % H.familyd_bin())
    print("topology-bench: UCX_TLS=%s UCX_NET_DEVICES=%s, %d host devices per daemon, "
          "%d CPUs, load average %.2f %.2f %.2f" % ((os.environ.get("UCX_TLS"),
                                                    os.environ.get("UCX_NET_DEVICES"),
                                                    HOST_DEVICES, os.cpu_count())
                                                   + os.getloadavg()))
    raw = {"converge": [], "traffic": [], "idle": []}

    # 1 and 2
    if "converge" not in skip or "traffic" not in skip:
        for hb in boot_hbs:
            only_traffic = "converge" in skip or hb not in conv_hbs
            if only_traffic and (hb != a.traffic_heartbeat or "traffic" in skip):
                continue
            for n in sizes:
                runs = 1 if only_traffic else reps
                for rep in range(runs):
                    log("N=%d heartbeat %d ms: boot %d/%d" % (n, hb, rep + 1, runs))
                    c, r = converge_once(n, hb)
                    try:
                        if not only_traffic:
                            raw["converge"].append(r)
                        if rep == runs - 1 and hb == a.traffic_heartbeat and "traffic" not in skip:
                            log("N=%d: traffic over %.0f s" % (n, traffic_s))
                            raw["traffic"].append(traffic(c, n, hb, traffic_s))
                    finally:
                        shutdown(c)

    if raw["converge"]:
        print()
        print("convergence: seed first, then N-1 daemons at once joining through it; "
              "%d boot%s each; median [min-max]" % (reps, "" if reps == 1 else "s"))
        print("%-6s %3s %-19s %-19s %-19s %-7s %s" % (
            "hb ms", "N", "spawn->agreed s", "serving->members s", "serving->agreed s",
            "version", "join KiB sent, all daemons"))
        for hb in conv_hbs:
            for n in sizes:
                rs = [r for r in raw["converge"] if r["n"] == n and r["heartbeat_ms"] == hb]
                if not rs:
                    continue
                print("%-6d %3d %-19s %-19s %-19s %-7s %s" % (
                    hb, n, median_range([r["start_to_agreement_s"] for r in rs]),
                    median_range([r["serving_to_members_s"] for r in rs]),
                    median_range([r["serving_to_agreement_s"] for r in rs]),
                    "%d" % statistics.median([r["version"] for r in rs]),
                    median_range([r["join_bytes_all"] / 1024.0 for r in rs], "%.1f")))
        # How the join burst's bytes grow: total ~ N^k, k from consecutive sizes.
        for hb in conv_hbs:
            pts = []
            for n in sizes:
                rs = [r["join_bytes_all"] for r in raw["converge"]
                      if r["n"] == n and r["heartbeat_ms"] == hb]
                if rs:
                    pts.append((n, statistics.median(rs)))
            if len(pts) > 1:
                print("ratio join bytes @%dms: %s" % (hb, " ".join(
                    "N=%d/N=%d %.2f (N^%.2f)" % (n2, n1, b2 / b1, math.log(b2 / b1) / math.log(n2 / n1))
                    for (n1, b1), (n2, b2) in zip(pts, pts[1:]) if b1 > 0 and b2 > 0)))

    goals_ok = True
    if raw["traffic"]:
        print()
        print("traffic: one daemon, per heartbeat interval (%d ms), %.0f s after agreement, "
              "mean over the daemons" % (a.traffic_heartbeat, traffic_s))
        print("%3s %5s %10s %10s %10s %10s %9s" % ("N", "peers", "msgs", "bytes", "msgs/peer",
                                                  "bytes/peer", "bytes/msg"))
        for t in raw["traffic"]:
            print("%3d %5d %10.2f %10.1f %10.3f %10.1f %9.1f" % (
                t["n"], t["n"] - 1, t["messages_per_interval"], t["bytes_per_interval"],
                t["messages_per_peer"], t["bytes_per_peer"], t["bytes_per_message"]))
    if len(raw["traffic"]) > 1:
        lo, hi = raw["traffic"][0], raw["traffic"][-1]
        rm = ratio(hi["messages_per_peer"], lo["messages_per_peer"])
        rb = ratio(hi["bytes_per_peer"], lo["bytes_per_peer"])
        print("ratio traffic per peer N=%d/N=%d: messages %.3f bytes %.3f" % (
            hi["n"], lo["n"], rm, rb))
        print("ratio traffic per daemon N=%d/N=%d: messages %.3f bytes %.3f (peers %d/%d = %.3f)"
              % (hi["n"], lo["n"], ratio(hi["messages_per_interval"], lo["messages_per_interval"]),
                 ratio(hi["bytes_per_interval"], lo["bytes_per_interval"]),
                 hi["n"] - 1, lo["n"] - 1, (hi["n"] - 1) / (lo["n"] - 1)))
        worst = max(rm, rb)
        met = worst <= 1.5
        goals_ok = goals_ok and met
        print("goal traffic per peer flat N=%d/N=%d <= 1.50: %.3f %s" % (
            hi["n"], lo["n"], worst, "met" if met else "NOT MET"))

    # 3
    if "idle" not in skip:
        for hb in idle_hbs:
            log("idle: %d daemons and a lone one, heartbeat %d ms, %.0f s window"
                % (idle_n, hb, idle_s))
            raw["idle"].append(idle_cpu(idle_n, hb, idle_s))
        print()
        print("idle CPU over %.0f s: a daemon with %d peers against one without --listen, same "
              "window (utime+stime, ms; on-CPU ns of all threads beside)" % (idle_s, idle_n - 1))
        print("%-6s %-26s %-9s %-7s %-26s %-10s %-7s %s" % (
            "hb ms", "peered ms med [min-max]", "alone ms", "ratio", "peered sched ms",
            "alone sch", "ratio", "% core"))
        for r in raw["idle"]:
            med = statistics.median(r["peered_ms"])
            smed = statistics.median(r["peered_sched_ms"])
            print("%-6d %-26s %-9.0f %-7s %-26s %-10.1f %-7.2f %.3f" % (
                r["heartbeat_ms"], median_range(r["peered_ms"], "%.0f"), r["alone_ms"],
                "%.2f" % ratio(med, r["alone_ms"]) if r["alone_ms"] > 0 else "inf",
                median_range(r["peered_sched_ms"], "%.1f"), r["alone_sched_ms"],
                ratio(smed, r["alone_sched_ms"]), 100.0 * med / (r["window_s"] * 1000.0)))
        for r in raw["idle"]:
            med = statistics.median(r["peered_ms"])
            smed = statistics.median(r["peered_sched_ms"])
            print("ratio idle cpu %d peers/none @%dms: stat %s sched %.2f (peered %.1f ms, alone "
                  "%.1f ms of CPU in %.0f s)" % (
                      r["peers"], r["heartbeat_ms"],
                      "%.2f" % ratio(med, r["alone_ms"]) if r["alone_ms"] > 0 else "inf",
                      ratio(smed, r["alone_sched_ms"]), med, r["alone_ms"], r["window_s"]))
            if any(r["suspect_or_down_after"]):
                print("note: @%dms some daemon saw a peer suspect or down after the window: %r"
                      % (r["heartbeat_ms"], r["suspect_or_down_after"]))

    # 4
    if "auth" not in skip:
        raw["auth_joins"], raw["auth_idle"] = [], []
        with tempfile.TemporaryDirectory(prefix="fd-authbench-") as tmp:
            key = write_key(os.path.join(tmp, "cluster.key"), new_key())
            joins = {}
            for hb in conv_hbs:
                joins[(auth_n, hb)] = auth_joins(auth_n, hb, auth_reps, key)
                raw["auth_joins"].append({"n": auth_n, "heartbeat_ms": hb,
                                          **joins[(auth_n, hb)]})
            for hb in idle_hbs:
                log("auth idle: %d daemons with the key and %d without, heartbeat %d ms, "
                    "%d windows of %.0f s" % (auth_n, auth_n, hb, auth_windows, auth_secs))
                raw["auth_idle"].append(auth_idle(auth_n, hb, auth_secs, auth_windows, key))
        goals_ok = auth_report(joins, raw["auth_idle"], AUTH_IDLE_GOAL) and goals_ok

    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)
    print()
    print("goals %s" % ("met" if goals_ok else "NOT MET"))
    return 1 if a.check_goals and not goals_ok else 0


if __name__ == "__main__":
    sys.exit(main())
