#!/usr/bin/python3
"""coord-bench: etcd mode at scale: many simulated members against one local etcd, and real daemons.

    /usr/bin/python3 tests/bench/coord-bench.py [--members 1000] [--daemons 3] [--rest-seconds 20]
                                                [--smoke] [--json FILE]

One etcd (tests/integration/etcd_harness.py) on loopback; --daemons real familyd daemons in etcd
mode (cluster `bench`, --down-ms 10000, so a lease of 10 s); and a load generator in this
process, not daemons: --members simulated members, each with its own lease (granted with
LeaseGrant), a member record (familyd.coord.v1.CoordMember: name, node rank, boot id, cluster,
two host devices) and an alive key under its lease, kept alive on one LeaseKeepAlive stream
(every lease every 3 s). It speaks etcd's gRPC API through grpcio with hand-encoded protobuf,
so it needs nothing but Debian's python3-grpcio.

Measured, each printed as a table:

1. Join. The daemons start first and agree; then the generator writes every member (one
   LeaseGrant, one Put of the record, one Put of the alive key each, from --writers threads).
   From the last write's answer, GetTopology is polled on every daemon: the time until it
   lists all --members + --daemons nodes up (the goal: within 10 s), and the topology version
   it then shows against etcd's newest revision under the prefix.
2. Watch traffic. The bytes each daemon's sockets to etcd received (`ss -tin`, tcp_info's
   bytes_received) during the join, per member joined, and at rest (--rest-seconds after the
   join, the members kept alive, nothing written): the watch carries nothing at rest, only the
   daemon's own keep-alive answers.
3. CPU at rest. utime+stime of each daemon (/proc/PID/stat) over the same rest window, as a
   share of one core.

--smoke: 50 members, 2 daemons, a 3 s rest window; checks the tables are printed, every daemon
saw every member, and the daemons stop cleanly (exit 0). The 10 s goal is checked only with
--check-goals.
"""

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import familyd_harness as H  # noqa: E402
from etcd_harness import EtcdServer  # noqa: E402

import grpc  # noqa: E402

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_LOG_LEVEL", "error")

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
CLUSTER = "bench"
PREFIX = "/familyd/%s/" % CLUSTER
LEASE_TTL = 10
GOAL_S = 10.0


# --- protobuf by hand -------------------------------------------------------------------------

def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def field_bytes(number, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


def parse_varint_field(data, number):
    """The first varint field `number` of a message (0 when absent); enough for etcd's answers."""
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(data, i)
            if f == number:
                return v
        elif wt == 2:
            n, i = read_varint(data, i)
            i += n
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            break
    return 0


def read_varint(data, i):
    shift = v = 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7f) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def member_record(name, rank):
    devices = b""
    for d in range(2):
        dev = (field_varint(1, d) + field_bytes(2, "host") + field_bytes(3, "host%d" % d)
               + field_varint(5, 1 << 30) + field_varint(6, 0))
        devices += field_bytes(6, dev)
    return (field_bytes(1, name) + field_varint(2, rank) + field_varint(3, 0x5151 + rank)
            + field_varint(4, int(time.time() * 1000)) + devices + field_bytes(8, CLUSTER))


# --- the load generator -----------------------------------------------------------------------

class Generator:
    """Simulated members: a lease, a record and an alive key each, kept alive on one stream."""

    def __init__(self, endpoint):
        self.channel = grpc.insecure_channel(endpoint)
        ident = lambda b: b  # noqa: E731
        self.grant = self.channel.unary_unary("/etcdserverpb.Lease/LeaseGrant",
                                              request_serializer=ident,
                                              response_deserializer=ident)
        self.put = self.channel.unary_unary("/etcdserverpb.KV/Put", request_serializer=ident,
                                            response_deserializer=ident)
        self.keepalive = self.channel.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive",
                                                    request_serializer=ident,
                                                    response_deserializer=ident)
        self.leases = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = None

    def join(self, index, name, rank):
        ans = self.grant(field_varint(1, LEASE_TTL), timeout=10)
        lease = parse_varint_field(ans, 2)
        assert lease, "no lease granted"
        self.put(field_bytes(1, PREFIX + "members/" + name) +
                 field_bytes(2, member_record(name, rank)), timeout=10)
        self.put(field_bytes(1, PREFIX + "alive/" + name) + field_bytes(2, "1") +
                 field_varint(3, lease), timeout=10)
        with self.lock:
            self.leases.append(lease)

    def join_all(self, n, writers):
        work = queue.Queue()
        for i in range(n):
            work.put(i)
        errors = []

        def run():
            while True:
                try:
                    i = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    self.join(i, "sim%05d" % i, 100 + i)
                except Exception as e:  # noqa: BLE001
                    errors.append(e)
        threads = [threading.Thread(target=run) for _ in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def requests(self):
        while not self.stop.is_set():
            with self.lock:
                leases = list(self.leases)
            for lease in leases:
                yield field_varint(1, lease)
            self.stop.wait(3.0)

    def start_keepalive(self):
        def run():
            try:
                for _ in self.keepalive(self.requests()):
                    pass
            except grpc.RpcError:
                pass
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.channel.close()


# --- measuring the daemons --------------------------------------------------------------------

def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def bytes_from_etcd(pid, port):
    """What the daemon's TCP connections to etcd's port received, summed (tcp_info)."""
    out = subprocess.run(["ss", "-tinpH", "dst", "127.0.0.1:%d" % port], capture_output=True,
                         text=True).stdout
    total = 0
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "pid=%d," % pid not in line:
            continue
        info = lines[i + 1] if i + 1 < len(lines) else ""
        m = re.search(r"bytes_received:(\d+)", line + " " + info)
        if m:
            total += int(m.group(1))
    return total


def prefix_revision(etcd):
    out = json.loads(etcd.etcdctl("get", "--prefix", PREFIX, "--keys-only", "-w", "json"))
    return max(int(kv["mod_revision"]) for kv in out.get("kvs", []))


def nodes_up(daemon):
    res = daemon.client.call("familyd.v1.MeshService/GetTopology", timeout=30)
    assert res.ok, res
    t = res.reply
    return sum(1 for n in t.nodes if n.state == "up"), t.version


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--daemons", type=int, default=3)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--rest-seconds", type=float, default=20.0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--check-goals", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.smoke:
        args.members, args.daemons, args.rest_seconds = 50, 2, 3.0

    protos = H.Protos()
    hz = os.sysconf("SC_CLK_TCK")
    result = {"members": args.members, "daemons": args.daemons}
    with EtcdServer() as etcd:
        port = etcd.members[0].client_port
        daemons = [H.Daemon(REGISTRY, host_devices=2, node_name="real%d" % i,
                            extra_args=["--coordinator", "etcd://" + etcd.endpoint,
                                        "--cluster", CLUSTER, "--down-ms", str(LEASE_TTL * 1000),
                                        "--node-rank", str(i)],
                            protos=protos, state_dir=False)
                   for i in range(args.daemons)]
        gen = Generator(etcd.endpoint)
        try:
            for d in daemons:
                d.start()
            want = args.members + args.daemons
            before = [bytes_from_etcd(d.proc.pid, port) for d in daemons]
            t0 = time.monotonic()
            gen.join_all(args.members, args.writers)
            t_last = time.monotonic()
            gen.start_keepalive()
            seen = [None] * len(daemons)
            versions = [None] * len(daemons)
            while None in seen and time.monotonic() - t_last < 120:
                for i, d in enumerate(daemons):
                    if seen[i] is None:
                        up, version = nodes_up(d)
                        if up == want:
                            seen[i] = time.monotonic() - t_last
                            versions[i] = version
                time.sleep(0.05)
            join_bytes = [bytes_from_etcd(d.proc.pid, port) - b for d, b in zip(daemons, before)]
            revision = prefix_revision(etcd)

            rest_bytes0 = [bytes_from_etcd(d.proc.pid, port) for d in daemons]
            cpu0 = [cpu_ticks(d.proc.pid) for d in daemons]
            time.sleep(args.rest_seconds)
            cpu1 = [cpu_ticks(d.proc.pid) for d in daemons]
            rest_bytes = [bytes_from_etcd(d.proc.pid, port) - b for d, b in zip(daemons, rest_bytes0)]
            still = [nodes_up(d)[0] for d in daemons]
        finally:
            gen.close()
            for d in daemons:
                if d.alive():
                    d.stop()
                d.cleanup()

    print("== join: %d simulated members written in %.2f s (%d writers), then:"
          % (args.members, t_last - t0, args.writers))
    print("| daemon | sees all %d up after the last write (s) | version | prefix revision |" % want)
    print("|---|---:|---:|---:|")
    for i in range(len(daemons)):
        print("| real%d | %s | %s | %d |" % (i, "%.2f" % seen[i] if seen[i] is not None else
                                            "never", versions[i], revision))
    print("== watch traffic from etcd per daemon")
    print("| daemon | bytes during the join | bytes per member | bytes/s at rest |")
    print("|---|---:|---:|---:|")
    for i in range(len(daemons)):
        print("| real%d | %d | %.0f | %.0f |" % (i, join_bytes[i], join_bytes[i] / args.members,
                                               rest_bytes[i] / args.rest_seconds))
    print("== CPU at rest over %.0f s (%d members kept alive)" % (args.rest_seconds, want))
    print("| daemon | CPU (share of one core) |")
    print("|---|---:|")
    for i in range(len(daemons)):
        print("| real%d | %.2f%% |" % (i, 100.0 * (cpu1[i] - cpu0[i]) / hz / args.rest_seconds))
    worst = max(s if s is not None else float("inf") for s in seen)
    ok = all(s is not None for s in seen) and all(s == want for s in still)
    print("goal %s: every daemon saw all %d members within %.0f s of the last join (worst %.2f s)"
          % ("met" if worst <= GOAL_S else "missed", args.members, GOAL_S, worst))
    result.update(seen_s=seen, versions=versions, revision=revision, join_bytes=join_bytes,
                  rest_bytes_per_s=[b / args.rest_seconds for b in rest_bytes],
                  rest_cpu=[(cpu1[i] - cpu0[i]) / hz / args.rest_seconds
                            for i in range(len(daemons))])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not ok:
        print("FAILED: not every daemon saw every member up", file=sys.stderr)
        return 1
    if args.check_goals and worst > GOAL_S:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
