"""Shared helpers for familyd's integration tests: start the real daemon, talk to it over gRPC.

Run with the tests' Python (.venv/bin/python3, made by deploy/dev/python-env.sh: grpcio, protobuf).
Paths come from the environment, set by tests/integration/meson.build:

  FAMILYD_BIN          the familyd binary
  FAMILYCTL            the familyctl binary (optional)
  FAMILYD_DESCRIPTORS  build/proto/familyd.binpb (FileDescriptorSet with source comments: familyd,
                       its imports, health and reflection; what the reflection service serves)
  FAMILYD_SOURCE_ROOT  the project's source root
  FAMILYD_CONFORMANCE  the conformance fixtures, default <source root>/tests/conformance
  BUF                  buf binary, default <source root>/node_modules/.bin/buf

No protoc is needed: message classes are built at run time from the descriptor set, and calls
go through channel.unary_unary(path, serializer, deserializer) on 'unix:PATH'.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import grpc
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.stderr.write("familyd_harness: %s (run with the tests' Python, .venv/bin/python3: "
                     "bash deploy/dev/python-env.sh)\n" % e)
    # Skip (77) on a developer machine without the modules; fail under CI.
    sys.exit(1 if os.environ.get("CI") else 77)

SKIP = 77

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.normpath(os.path.join(HERE, "..", ".."))
CONFORMANCE = os.environ.get("FAMILYD_CONFORMANCE") or os.path.join(SOURCE_ROOT, "tests", "conformance")

# Generous under ASan on a 2-core machine; a healthy daemon needs well under a second.
START_TIMEOUT = float(os.environ.get("FAMILYD_START_TIMEOUT", "30"))
STOP_TIMEOUT = float(os.environ.get("FAMILYD_STOP_TIMEOUT", "30"))
CALL_TIMEOUT = float(os.environ.get("FAMILYD_CALL_TIMEOUT", "10"))


def _default_build_file(*parts):
    for b in ("build-itest", "build"):
        p = os.path.join(SOURCE_ROOT, b, *parts)
        if os.path.exists(p):
            return p
    return os.path.join(SOURCE_ROOT, "build", *parts)


def familyd_bin():
    return os.environ.get("FAMILYD_BIN") or _default_build_file("daemon", "familyd")


def familyctl_bin():
    p = os.environ.get("FAMILYCTL")
    if p:
        return p
    p = _default_build_file("client", "familyctl")
    return p if os.path.exists(p) else None


def descriptor_set_path():
    return os.environ.get("FAMILYD_DESCRIPTORS") or _default_build_file("proto", "familyd.binpb")


def buf_bin():
    """The buf binary, or exit: skip on a developer machine, fail when CI is set."""
    p = os.environ.get("BUF") or os.path.join(SOURCE_ROOT, "node_modules", ".bin", "buf")
    if os.path.isfile(p) and os.access(p, os.X_OK):
        return p
    msg = ("buf not found at %s (cd %s && npm install --no-save --no-audit --no-fund "
           "@bufbuild/buf, or set BUF)" % (p, SOURCE_ROOT))
    if os.environ.get("CI"):
        sys.stderr.write("FAIL: %s\n" % msg)
        sys.exit(1)
    sys.stderr.write("SKIP: %s\n" % msg)
    sys.exit(SKIP)


def short_tmpdir(prefix="fd-itest-"):
    """A temporary directory whose socket paths fit sun_path (108 bytes)."""
    d = tempfile.mkdtemp(prefix=prefix)
    if len(d) > 60:
        shutil.rmtree(d, ignore_errors=True)
        d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    return d


# ---------------------------------------------------------------------------------------------
# Protos from the descriptor set

class Protos:
    """Message classes and method signatures built from build/proto/familyd.binpb."""

    def __init__(self, path=None):
        path = path or descriptor_set_path()
        with open(path, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            self.pool.Add(fd)
        self._classes = {}

    def cls(self, full_name):
        c = self._classes.get(full_name)
        if c is None:
            desc = self.pool.FindMessageTypeByName(full_name)
            # protobuf >= 4.22 (the venv); Debian's 3.21 for clients run as other uids
            get = getattr(message_factory, "GetMessageClass", None)
            c = get(desc) if get else message_factory.MessageFactory(self.pool).GetPrototype(desc)
            self._classes[full_name] = c
        return c

    def msg(self, full_name, **fields):
        m = self.cls(full_name)()
        for k, v in fields.items():
            setattr(m, k, v)
        return m

    def from_json(self, full_name, obj):
        """A message from a proto3 JSON object (dict) or string."""
        m = self.cls(full_name)()
        if isinstance(obj, str):
            json_format.Parse(obj, m)
        else:
            json_format.ParseDict(obj, m)
        return m

    def method(self, rpc):
        """rpc 'pkg.Service/Method' -> (path, request class, response class, server_streaming)."""
        rpc = rpc.lstrip("/")
        service, name = rpc.split("/", 1)
        sd = self.pool.FindServiceByName(service)
        md = sd.methods_by_name[name]
        return ("/%s/%s" % (service, name), self.cls(md.input_type.full_name),
                self.cls(md.output_type.full_name), md.server_streaming)

    def value(self, v):
        """A familyd.v1.Value from a Python value."""
        V = self.cls("familyd.v1.Value")
        out = V()
        if isinstance(v, bool):
            out.bool_value = v
        elif isinstance(v, int):
            out.int_value = v
        elif isinstance(v, float):
            out.double_value = v
        elif isinstance(v, str):
            out.string_value = v
        elif isinstance(v, (list, tuple)):
            out.list_value.SetInParent()
            for x in v:
                out.list_value.values.append(self.value(x))
        else:
            raise TypeError(v)
        return out

    @staticmethod
    def py(value):
        """A Python value from a familyd.v1.Value (None when no kind is set)."""
        k = value.WhichOneof("kind")
        if k is None:
            return None
        if k == "list_value":
            return [Protos.py(x) for x in value.list_value.values]
        return getattr(value, k)


def to_json(msg):
    """proto3 JSON (lowerCamelCase names, defaults omitted, 64-bit integers as strings)."""
    return json_format.MessageToDict(msg)


# ---------------------------------------------------------------------------------------------
# Calls

class CallResult:
    """The outcome of one call: code name, status message, reply (or None), trailing metadata."""

    def __init__(self, code, message, reply, trailers, elapsed):
        self.code = code
        self.message = message
        self.reply = reply
        self.trailers = trailers or ()
        self.elapsed = elapsed

    @property
    def ok(self):
        return self.code == "OK"

    def trailer(self, key):
        for k, v in self.trailers:
            if k == key:
                return v
        return None

    def __repr__(self):
        return "CallResult(%s, %r)" % (self.code, self.message)


class Client:
    def __init__(self, socket_path, protos):
        self.socket_path = socket_path
        self.protos = protos
        self.channel = grpc.insecure_channel("unix:" + socket_path)

    def close(self):
        self.channel.close()

    def call(self, rpc, request=None, timeout=None, **fields):
        """Call a unary method. request: a message, a dict (proto3 JSON) or None (fields)."""
        path, req_cls, resp_cls, streaming = self.protos.method(rpc)
        if streaming:
            raise ValueError("%s is server-streaming: use stream_first" % rpc)
        if request is None:
            request = req_cls(**fields)
        elif isinstance(request, dict):
            request = json_format.ParseDict(request, req_cls())
        return self.raw_call(path, request.SerializeToString(), resp_cls.FromString, timeout)

    def raw_call(self, path, payload, deserializer=None, timeout=None):
        """Send payload bytes as they are (identity serializer)."""
        fn = self.channel.unary_unary(path, request_serializer=None,
                                      response_deserializer=deserializer)
        t0 = time.monotonic()
        try:
            reply, call = fn.with_call(payload, timeout=timeout or CALL_TIMEOUT)
            return CallResult("OK", call.details() or "", reply, call.trailing_metadata(),
                              time.monotonic() - t0)
        except grpc.RpcError as e:
            return CallResult(e.code().name, e.details() or "", None, e.trailing_metadata(),
                              time.monotonic() - t0)

    def stream(self, rpc, request=None, timeout=None):
        """Start a server-streaming call; returns the grpc call object (an iterator)."""
        path, req_cls, resp_cls, streaming = self.protos.method(rpc)
        if request is None:
            request = req_cls()
        elif isinstance(request, dict):
            request = json_format.ParseDict(request, req_cls())
        fn = self.channel.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=resp_cls.FromString)
        return fn(request, timeout=timeout)

    def stream_first(self, rpc, request=None, timeout=None):
        """The first message of a server-streaming call as a CallResult; the call is cancelled."""
        t0 = time.monotonic()
        it = self.stream(rpc, request, timeout=timeout or CALL_TIMEOUT)
        try:
            first = next(it)
            res = CallResult("OK", "", first, (), time.monotonic() - t0)
        except StopIteration:
            res = CallResult(it.code().name, it.details() or "", None, it.trailing_metadata(),
                             time.monotonic() - t0)
        except grpc.RpcError as e:
            res = CallResult(e.code().name, e.details() or "", None, e.trailing_metadata(),
                             time.monotonic() - t0)
        it.cancel()
        return res

    def health(self, service="", timeout=None):
        return self.call("grpc.health.v1.Health/Check", {"service": service}, timeout=timeout)

    def error_details(self, res):
        """Decode grpc-status-details-bin: (google.rpc.Status, [google.rpc.ErrorInfo])."""
        raw = res.trailer("grpc-status-details-bin")
        if raw is None:
            return None, []
        st = self.protos.cls("google.rpc.Status").FromString(raw)
        infos = []
        for any_ in st.details:
            if any_.type_url.endswith("/google.rpc.ErrorInfo"):
                infos.append(self.protos.cls("google.rpc.ErrorInfo").FromString(any_.value))
        return st, infos


# ---------------------------------------------------------------------------------------------
# The daemon

class DaemonError(AssertionError):
    pass


class Daemon:
    """One real familyd in a temporary directory with its own sockets and state dir.

    with Daemon(registry=DIR) as d:
        d.client.call(...)
    Leaving the block stops it with SIGTERM and asserts exit status 0.
    """

    def __init__(self, registry, host_devices=8, node_name=None, extra_args=(), tmpdir=None,
                 socket_path=None, protos=None, state_dir=False):
        # state_dir=True passes --state-dir TMPDIR/state: builds then persist (on a tmpfs) and
        # shards are handed out read-only, so it is for the durability tests only.
        self.registry = registry
        self.host_devices = host_devices
        self.node_name = node_name
        self.extra_args = list(extra_args)
        self.own_tmp = tmpdir is None
        self.tmpdir = tmpdir or short_tmpdir()
        self.socket = socket_path or os.path.join(self.tmpdir, "familyd.sock")
        self.shard_socket = os.path.join(self.tmpdir, "shard-%d.sock" % id(self))
        self.state_dir = os.path.join(self.tmpdir, "state") if state_dir else None
        self.protos = protos or Protos()
        self.proc = None
        self.client = None
        self.stdout_path = os.path.join(self.tmpdir, "familyd-%d.out" % id(self))
        self.stderr_path = os.path.join(self.tmpdir, "familyd-%d.err" % id(self))

    def argv(self):
        a = [familyd_bin(), "--socket", self.socket, "--shard-socket", self.shard_socket,
             "--registry", self.registry]
        if self.host_devices is not None:
            a += ["--host-devices", str(self.host_devices)]
        if self.state_dir:
            os.makedirs(self.state_dir, exist_ok=True)
            a += ["--state-dir", self.state_dir]
        if self.node_name:
            a += ["--node-name", self.node_name]
        return a + self.extra_args

    def spawn(self):
        """Start the process without waiting for readiness."""
        out = open(self.stdout_path, "wb")
        err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        out.close()
        err.close()
        return self.proc

    def stderr(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def output(self):
        try:
            with open(self.stdout_path, "rb") as f:
                out = f.read().decode("utf-8", "replace")
        except OSError:
            out = ""
        return out + self.stderr()

    def _fail(self, what):
        tail = "\n".join(self.output().splitlines()[-40:])
        raise DaemonError("%s\n  argv: %s\n  output (tail):\n%s" % (what, " ".join(self.argv()), tail))

    def start(self, timeout=START_TIMEOUT):
        if not os.path.exists(familyd_bin()):
            raise DaemonError("familyd binary not found: %s" % familyd_bin())
        self.spawn()
        self.client = Client(self.socket, self.protos)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                self._fail("familyd exited with status %d before it was ready" % rc)
            if socket_accepts(self.socket):
                # A fresh channel per probe: a channel that failed to connect backs off.
                probe = Client(self.socket, self.protos)
                try:
                    last = probe.health(timeout=2.0)
                finally:
                    probe.close()
                if last.ok and last.reply.status == 1:   # SERVING
                    return self
            time.sleep(0.05)
        self.kill()
        self._fail("familyd not SERVING within %.0f s (last health answer: %r)" % (timeout, last))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=STOP_TIMEOUT, expect_status=0):
        """SIGTERM; assert the daemon exits with expect_status within timeout."""
        if self.client:
            self.client.close()
            self.client = None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                self._fail("familyd did not exit within %.0f s of SIGTERM" % timeout)
        rc = self.proc.returncode
        if expect_status is not None and rc != expect_status:
            self._fail("familyd exited with status %d after SIGTERM, expected %d"
                       % (rc, expect_status))
        return rc

    def stop_checked(self):
        """stop(), then assert the daemon's stderr holds no sanitizer report; cleanup() always."""
        try:
            self.stop()
            err = self.stderr()
            if "runtime error:" in err or "Sanitizer" in err:
                raise AssertionError("sanitizer report:\n" + err[-4000:])
        finally:
            self.cleanup()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self):
        self.kill()
        if self.own_tmp:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

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
            else:
                self.kill()
        finally:
            self.cleanup()
        return False


def run_on_terminal(argv, timeout=300):
    """argv with stderr on a pseudo-terminal (and no FAMILYD_SOCKET in its environment):
    (exit status, stdout, what the terminal got), as familyctl's progress bar draws it."""
    import pty
    import select
    master, slave = pty.openpty()
    env = dict(os.environ)
    env.pop("FAMILYD_SOCKET", None)
    p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=slave,
                         stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if p.poll() is not None:
                break
            continue
        try:
            data = os.read(master, 65536)
        except OSError:   # EIO: the terminal's last writer is gone
            break
        if not data:
            break
        seen += data
    os.close(master)
    out = p.communicate(timeout=60)[0]
    return p.returncode, out.decode(), seen.decode("utf-8", "replace")


def rss(pid):
    """A process's resident memory in bytes (/proc/PID/status VmRSS)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


def free_port():
    """A free TCP port on 127.0.0.1 (for torch.distributed's MASTER_PORT and the like)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_to_exit(argv, timeout):
    """Run a process to completion: (status, stdout+stderr text, seconds)."""
    t0 = time.monotonic()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), time.monotonic() - t0


def socket_accepts(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


FILE_LINE_COL = re.compile(r"(?P<file>[^\s:]+):(?P<line>\d+):(?P<col>\d+):")
