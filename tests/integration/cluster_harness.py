"""Several real familyd daemons on this machine, joined over UCX on loopback.

    with Cluster(4, host_devices=2) as c:     # node0 is the seed; the others join through it
        c.wait_agreement()
        c.topology(2).world_size

Each daemon is a familyd_harness.Daemon with --listen on a free loopback port and --peers naming
the seed (or a full list); membership="swim" gives every daemon --membership swim (None: the
default, all-to-all). cluster_key=PATH gives every daemon --cluster-key PATH; a list gives
daemon i its own (None: no key); write_key() makes such a file. UCX runs over tcp on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo), the only
connection manager on this machine.
"""

import os
import random
import socket
import threading
import time

import familyd_harness as H

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
# UCX's own warnings about peers going away are expected in these tests.
os.environ.setdefault("UCX_LOG_LEVEL", "error")

REGISTRY = os.path.join(H.CONFORMANCE, "registry")


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_used_ports = set()


def free_port():
    """A free loopback port below the kernel's ephemeral range: UCX's tcp transport takes its
    own listening ports from that range, so a port picked there may be gone by the time a
    daemon binds it."""
    lo, _ = _ephemeral_range()
    top = max(lo - 1, 11000)
    for _ in range(1000):
        port = random.randint(10000, top)
        if port in _used_ports:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        _used_ports.add(port)
        return port
    raise RuntimeError("no free port below %d" % lo)


class DaemonViews:
    """What a set of daemons (self.daemons: familyd_harness.Daemon) sees of the cluster, and
    waiting for them to agree; shared by the embedded protocol's Cluster and etcd mode's tests."""

    def client(self, i):
        return self.daemons[i].client

    def topology(self, i):
        res = self.client(i).call("familyd.v1.MeshService/GetTopology")
        assert res.ok, res
        return res.reply

    def status(self, i):
        res = self.client(i).call("familyd.v1.AdminService/GetStatus")
        assert res.ok, res
        return res.reply

    def view(self, i):
        """What daemon i sees, reduced to what every daemon must agree on."""
        t = self.topology(i)
        return (t.version, t.world_size,
                tuple((n.name, n.first_rank, len(n.devices), n.state) for n in t.nodes))

    def live(self):
        return [i for i, d in enumerate(self.daemons) if d.alive()]

    def wait_agreement(self, world_size=None, states=None, timeout=30.0, among=None):
        """Waits until every live daemon (or those in `among`) reports the same version, world
        size and node list; returns (seconds waited, the common view)."""
        among = self.live() if among is None else among
        t0 = time.monotonic()
        views = None
        while time.monotonic() - t0 < timeout:
            views = [self.view(i) for i in among]
            same = all(v == views[0] for v in views)
            if same and (world_size is None or views[0][1] == world_size) and \
                    (states is None or [n[3] for n in views[0][2]] == states):
                return time.monotonic() - t0, views[0]
            time.sleep(0.05)
        raise AssertionError("no agreement within %.0f s:\n%s" % (
            timeout, "\n".join("  %d: %r" % (i, v) for i, v in zip(among, views or []))))

    def states(self, i):
        return {n.name: n.state for n in self.topology(i).nodes}


class Cluster(DaemonViews):
    def __init__(self, n, host_devices=2, heartbeat_ms=100, suspect_ms=1000, down_ms=2500,
                 forget_after_ms=None, seeds="first", registry=REGISTRY, extra_args=(),
                 names=None, cluster_key=None, membership=None):
        self.n = n
        self.protos = H.Protos()
        self.ports = [free_port() for _ in range(n)]
        self.timing = ["--heartbeat-ms", str(heartbeat_ms), "--suspect-ms", str(suspect_ms),
                       "--down-ms", str(down_ms)]
        if forget_after_ms is not None:
            self.timing += ["--forget-after-ms", str(forget_after_ms)]
        if membership is not None:
            self.timing += ["--membership", membership]
        self.host_devices = host_devices
        self.registry = registry
        self.extra_args = list(extra_args)
        self.names = names or ["node%d" % i for i in range(n)]
        self.cluster_key = cluster_key
        if seeds == "first":
            self.seeds = self.address(0)
        else:
            self.seeds = ",".join(self.address(i) for i in range(n))
        self.daemons = [self.make(i) for i in range(n)]

    def address(self, i):
        return "127.0.0.1:%d" % self.ports[i]

    def key_of(self, i):
        if isinstance(self.cluster_key, (list, tuple)):
            return self.cluster_key[i] if i < len(self.cluster_key) else None
        return self.cluster_key

    def make(self, i, name=None, port=None, peers=None, extra_args=()):
        args = ["--listen", "127.0.0.1:%d" % (port or self.ports[i]),
                "--peers", peers or self.seeds] + self.timing + self.extra_args + list(extra_args)
        if self.key_of(i):
            args += ["--cluster-key", self.key_of(i)]
        return H.Daemon(self.registry, host_devices=self.host_devices,
                        node_name=name or self.names[i], extra_args=args, protos=self.protos,
                        state_dir=False)

    def start(self):
        for d in self.daemons:
            d.start()
        return self

    def restart(self, i):
        """Starts daemon i anew (same name, port and flags) after it died."""
        old = self.daemons[i]
        old.cleanup()
        self.daemons[i] = self.make(i)
        self.daemons[i].start()
        return self.daemons[i]

    def stop(self):
        for d in self.daemons:
            if d.alive():
                d.stop()

    def cleanup(self):
        for d in self.daemons:
            d.cleanup()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.stop()
        finally:
            self.cleanup()
        return False


def new_key():
    """A fresh key as the key file writes it: 64 hexadecimal characters."""
    return os.urandom(32).hex()


def write_key(path, *keys):
    """Writes a key file of these keys (one per line), mode 0600, replacing any there."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(k + "\n" for k in keys))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


class TopologyWatch:
    """Follows WatchTopology on one daemon in a thread: seen is [(time.monotonic(), Topology)],
    every topology the daemon streamed, in order."""

    def __init__(self, client, timeout=300):
        self.seen = []
        self.call = client.stream("familyd.v1.MeshService/WatchTopology", timeout=timeout)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for t in self.call:
                self.seen.append((time.monotonic(), t))
        except Exception:
            pass    # cancelled, or the daemon went away

    def first(self, predicate, timeout, after=0.0):
        """(monotonic time, Topology) of the first topology seen at or after `after` for which
        predicate holds, waiting up to timeout seconds; None if none came."""
        deadline = time.monotonic() + timeout
        while True:
            for when, t in list(self.seen):
                if when >= after and predicate(t):
                    return when, t
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def close(self):
        self.call.cancel()
        self.thread.join(5)


def state_of(topology, name):
    """The state of node name in topology, or None when it is not there."""
    for n in topology.nodes:
        if n.name == name:
            return n.state
    return None
