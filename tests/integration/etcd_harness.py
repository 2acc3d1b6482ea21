"""A real etcd for tests: /usr/bin/etcd on free loopback ports with a temporary data dir.

    with EtcdServer() as etcd:          # one member; etcd.endpoint is "127.0.0.1:PORT"
        etcd.put("k", "v")              # etcdctl, for writes a test makes behind the client's back
        etcd.stop(); etcd.start()       # an outage: same ports, same data dir
    with EtcdCluster(3, fast_elections=True) as cluster:   # three members; cluster.endpoints
    with EtcdCluster(1, tls=True) as etcd:  # https only, client certificates required (etcd.tls)
        cluster.members[0].stop()

etcd 3.4 serves its v3 gRPC API in plaintext on the client port. Without /usr/bin/etcd (Debian's
etcd-server) a test skips (77), or fails when CI is set. The harness waits until the member
answers (`etcdctl endpoint health`) and stops it with SIGTERM, SIGKILL after 10 s.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ETCD = os.environ.get("ETCD_BIN", "/usr/bin/etcd")
ETCDCTL = os.environ.get("ETCDCTL_BIN", "/usr/bin/etcdctl")
SKIP = 77


def require_etcd():
    if not (os.access(ETCD, os.X_OK) and os.access(ETCDCTL, os.X_OK)):
        sys.stderr.write("etcd_harness: %s or %s missing (Debian's etcd-server, etcd-client)\n"
                         % (ETCD, ETCDCTL))
        sys.exit(1 if os.environ.get("CI") else SKIP)


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Tls:
    """A CA, a server pair for 127.0.0.1 and a client pair, made with openssl in folder."""

    def __init__(self, folder):
        self.ca = os.path.join(folder, "ca.pem")
        self.server_cert = os.path.join(folder, "server.pem")
        self.server_key = os.path.join(folder, "server-key.pem")
        self.client_cert = os.path.join(folder, "client.pem")
        self.client_key = os.path.join(folder, "client-key.pem")
        ca_key = os.path.join(folder, "ca-key.pem")
        ext = os.path.join(folder, "server.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        cext = os.path.join(folder, "client.ext")
        with open(cext, "w") as f:
            f.write("extendedKeyUsage=clientAuth\n")
        run = lambda *a: subprocess.run(["openssl"] + list(a), check=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", ca_key, "-out", self.ca, "-days", "2", "-subj", "/CN=familyd-test-ca")
        for cert, key, cn, extfile in ((self.server_cert, self.server_key, "127.0.0.1", ext),
                                       (self.client_cert, self.client_key, "familyd", cext)):
            csr = cert + ".csr"
            run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", key, "-out", csr, "-subj", "/CN=" + cn)
            run("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", ca_key, "-CAcreateserial",
                "-out", cert, "-days", "2", "-extfile", extfile)


def tls_flags(tls):
    if not tls:
        return []
    return ["--cacert", tls.ca, "--cert", tls.client_cert, "--key", tls.client_key]


class EtcdMember:
    """One etcd process; start() may be called again after stop() (same ports, same data)."""

    def __init__(self, name, client_port, peer_port, data_dir, initial_cluster, log_path,
                 fast_elections=False, tls=None):
        self.fast_elections = fast_elections
        self.tls = tls
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = data_dir
        self.initial_cluster = initial_cluster
        self.log_path = log_path
        self.proc = None

    @property
    def endpoint(self):
        return "127.0.0.1:%d" % self.client_port

    def argv(self):
        client = "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.client_port)
        peer = "http://127.0.0.1:%d" % self.peer_port
        argv = [ETCD, "--name", self.name, "--data-dir", self.data_dir,
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.initial_cluster,
                "--initial-cluster-state", "new", "--initial-cluster-token", "familyd-test",
                "--logger", "zap", "--log-outputs", "stderr"]
        if self.tls:
            # Clients must present a certificate the CA signed.
            argv += ["--cert-file", self.tls.server_cert, "--key-file", self.tls.server_key,
                     "--trusted-ca-file", self.tls.ca, "--client-cert-auth"]
        if self.fast_elections:
            # A new leader within about a second of losing one; etcd's minimum lease TTL
            # (1.5 election timeouts, rounded up) drops from 2 s to 1 s with it.
            argv += ["--heartbeat-interval", "50", "--election-timeout", "500"]
        return argv

    def spawn(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()

    def healthy(self, timeout=2.0):
        r = subprocess.run([ETCDCTL, "--endpoints", self.endpoint, "--command-timeout",
                            "%ds" % max(1, int(timeout))] + tls_flags(self.tls) +
                           ["endpoint", "health"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=dict(os.environ, ETCDCTL_API="3"))
        return r.returncode == 0

    def wait_healthy(self, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError("etcd %s exited with %s; log: %s"
                                   % (self.name, self.proc.returncode, self.log_tail()))
            if self.healthy():
                return
            time.sleep(0.2)
        raise RuntimeError("etcd %s did not serve within %ss; log: %s"
                           % (self.name, timeout, self.log_tail()))

    def start(self, wait=True):
        self.spawn()
        if wait:
            self.wait_healthy()

    def stop(self, sig=signal.SIGTERM):
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""


class EtcdCluster:
    """n etcd members on loopback, one temporary folder; a context manager. etcd's own
    timing (heartbeat 100 ms, election 1 s) unless fast_elections."""

    def __init__(self, n=1, fast_elections=False, tls=False):
        require_etcd()
        self.tmpdir = tempfile.mkdtemp(prefix="fd-etcd-")
        self.tls = Tls(self.tmpdir) if tls else None
        ports = free_ports(2 * n)
        names = ["etcd%d" % i for i in range(n)]
        initial = ",".join("%s=http://127.0.0.1:%d" % (names[i], ports[2 * i + 1])
                           for i in range(n))
        self.members = [EtcdMember(names[i], ports[2 * i], ports[2 * i + 1],
                                   os.path.join(self.tmpdir, names[i]), initial,
                                   os.path.join(self.tmpdir, names[i] + ".log"), fast_elections,
                                   self.tls)
                        for i in range(n)]

    @property
    def endpoints(self):
        return ",".join(m.endpoint for m in self.members)

    @property
    def endpoint(self):
        return self.members[0].endpoint

    def through(self, members):
        """This cluster addressed through members only (writes while the others are down);
        not to be closed."""
        view = EtcdCluster.__new__(EtcdCluster)
        view.tmpdir, view.tls, view.members = self.tmpdir, self.tls, list(members)
        return view

    def start(self):
        # Members of a new cluster wait for each other: start all, then wait for each.
        for m in self.members:
            m.spawn()
        for m in self.members:
            m.wait_healthy()

    def stop(self):
        for m in self.members:
            m.stop()

    def close(self):
        self.stop()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def etcdctl(self, *args, check=True, input=None):
        r = subprocess.run([ETCDCTL, "--endpoints", self.endpoints] + tls_flags(self.tls) + list(args),
                           input=input, capture_output=True,
                           env=dict(os.environ, ETCDCTL_API="3"), timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError("etcdctl %s: %s" % (" ".join(args), r.stderr.decode(errors="replace")))
        return r.stdout

    def put(self, key, value):
        """Puts value (str or bytes; bytes go in through stdin, so any byte survives)."""
        if isinstance(value, bytes):
            return self.etcdctl("put", key, input=value)
        return self.etcdctl("put", key, value)

    def delete(self, key):
        return self.etcdctl("del", key)

    def get(self, key):
        """The value of key (bytes), or None."""
        out = self.etcdctl("get", key, "--print-value-only")
        return out[:-1] if out else None

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()


def EtcdServer():
    """One member: EtcdCluster(1)."""
    return EtcdCluster(1)
