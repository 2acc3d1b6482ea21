"""A stand-in for systemd's service manager, for tests without systemd as PID 1.

It does the three things a service manager does for a Type=notify service that the daemon can
observe: it listens on NOTIFY_SOCKET and records every sd_notify() datagram, it keeps the
descriptors sent with FDSTORE=1 (its file-descriptor store), and it starts the daemon with the
socket-activation and watchdog environment (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID,
WATCHDOG_USEC, WATCHDOG_PID), handing inherited descriptors over from fd 3 on, listening
sockets first, then the stored descriptors, as systemd does on a restart.

    m = FakeManager(tmpdir)
    proc = m.spawn([familyd, ...], listen=[("api", api_sock), ("shard", shard_sock)],
                   watchdog_usec=400000)
    i = m.wait_for("READY", "1")
    j = m.wait_for("STOPPING", "1", after=i)
    m.close()

Interface (several tests import it: keep it stable):

  FakeManager(tmpdir, fdstore_max=4096, name="notify.sock")
  .notify_socket    the datagram socket's path (what NOTIFY_SOCKET says)
  .messages         one dict per datagram, in arrival order: its KEY=VALUE lines, plus
                    "_time" (time.monotonic() at receipt), "_pid" (the sender's pid, from
                    SCM_CREDENTIALS) and "_fds" (how many descriptors came with it)
  .fdstore          OrderedDict name -> fd of the stored descriptors, in the order stored
  .fdstore_ignored  descriptors dropped as systemd drops them: (name, reason) tuples
  wait_for(key, value=None, timeout=10, after=-1)
                    the index of the first message with index > after that has key (with that
                    value when value is not None); raises AssertionError on timeout
  mark()            the index of the latest message (-1: none), for after=
  count(key, value=None, after=-1)
  spawn(argv, env=None, listen=(), pass_fdstore=True, watchdog_usec=None, **popen_kwargs)
                    -> subprocess.Popen; env adds to (None removes from) a copy of os.environ
  close()

Fidelity to systemd 252, where a test could otherwise pass here and fail under systemd:
  - FDSTORE=1 without descriptors is ignored; a descriptor that refers to the same open file
    as one already stored is closed and ignored (systemd's same_fd check), whatever its name;
  - past fdstore_max (FileDescriptorStoreMax) a descriptor is closed and ignored;
  - FDNAME= defaults to "stored"; FDSTOREREMOVE=1 with FDNAME= closes and drops that name.
  - Deviation: systemd keeps two descriptors stored under one name; here the later one
    replaces the earlier (which is closed), recorded in .fdstore_ignored as "replaced". A
    daemon should store each descriptor under its own name anyway.
  - Not emulated: FDPOLL (systemd drops a stored descriptor on POLLHUP/POLLERR), sender
    checks of NotifyAccess= (but "_pid" lets a test check the sender itself).
"""

import array
import collections
import os
import resource
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

SCM_MAX_FD = 253
_DATAGRAM_MAX = 128 * 1024

# Runs in the child between fork and the daemon's exec: renumbers the inherited descriptors to
# 3, 4, ... in order, sets LISTEN_PID (and WATCHDOG_PID) to its own pid, which exec keeps.
# A Python helper rather than /bin/sh: dash's redirections take single-digit descriptors only,
# and a store may hold thousands; preexec_fn would run Python after fork() in a process with
# threads (our recorder), which is unsafe.
_EXEC_HELPER = r"""
import os, sys
n = int(sys.argv[1])
srcs = [int(x) for x in sys.argv[2:2 + n]]
argv = sys.argv[2 + n:]
for i, fd in enumerate(srcs):
    os.dup2(fd, 3 + i, inheritable=True)
for fd in set(srcs):
    if fd >= 3 + n:
        os.close(fd)
pid = str(os.getpid())
if "LISTEN_FDS" in os.environ:
    os.environ["LISTEN_PID"] = pid
if "WATCHDOG_USEC" in os.environ:
    os.environ["WATCHDOG_PID"] = pid
os.execv(argv[0], argv)
"""

_MANAGER_ENV = ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID", "WATCHDOG_USEC",
                "WATCHDOG_PID")


def _raise_nofile():
    """A store of thousands of descriptors needs more than the usual soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def _same_file(a, b):
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class FakeManager:
    def __init__(self, tmpdir, fdstore_max=4096, name="notify.sock"):
        _raise_nofile()
        self.notify_socket = os.path.join(tmpdir, name)
        if len(self.notify_socket.encode()) >= 108:
            raise ValueError("notify socket path too long for sun_path: %s" % self.notify_socket)
        self.fdstore_max = fdstore_max
        self.messages = []
        self.fdstore = collections.OrderedDict()
        self.fdstore_ignored = []
        self.proc = None
        self._cond = threading.Condition()
        self._closed = False

        try:
            os.unlink(self.notify_socket)
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self._sock.bind(self.notify_socket)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="fake-manager", daemon=True)
        self._thread.start()

    # -- receiving --------------------------------------------------------------------------

    def _run(self):
        creds_size = struct.calcsize("3i")
        anc_size = socket.CMSG_SPACE(SCM_MAX_FD * 4) + socket.CMSG_SPACE(creds_size)
        while True:
            r, _, _ = select.select([self._sock, self._wake_r], [], [])
            if self._wake_r in r:
                return
            try:
                data, anc, flags, _ = self._sock.recvmsg(_DATAGRAM_MAX, anc_size,
                                                         socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            now = time.monotonic()
            fds, pid = [], None
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(cdata[:len(cdata) - len(cdata) % a.itemsize])
                    fds.extend(a)
                elif level == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS:
                    pid, _, _ = struct.unpack("3i", cdata[:creds_size])
            self._handle(data, fds, pid, now, truncated=bool(flags & socket.MSG_CTRUNC))

    def _handle(self, data, fds, pid, now, truncated=False):
        msg = {}
        for line in data.decode("utf-8", "replace").split("\n"):
            if not line:
                continue
            key, sep, value = line.partition("=")
            msg[key] = value if sep else ""
        msg["_time"] = now
        msg["_pid"] = pid
        msg["_fds"] = len(fds)
        if truncated:
            msg["_truncated"] = "1"

        with self._cond:
            if msg.get("FDSTORE") == "1" and fds:
                name = msg.get("FDNAME") or "stored"
                for fd in fds:
                    self._store(name, fd)
            else:
                # systemd closes descriptors that come without FDSTORE=1.
                for fd in fds:
                    os.close(fd)
            if msg.get("FDSTOREREMOVE") == "1" and msg.get("FDNAME"):
                old = self.fdstore.pop(msg["FDNAME"], None)
                if old is not None:
                    os.close(old)
            self.messages.append(msg)
            self._cond.notify_all()

    def _store(self, name, fd):
        for stored in self.fdstore.values():
            if _same_file(stored, fd):
                os.close(fd)
                self.fdstore_ignored.append((name, "same file already stored"))
                return
        if name in self.fdstore:
            os.close(self.fdstore.pop(name))
            self.fdstore_ignored.append((name, "replaced"))
        elif len(self.fdstore) >= self.fdstore_max:
            os.close(fd)
            self.fdstore_ignored.append((name, "fdstore_max reached"))
            return
        self.fdstore[name] = fd

    # -- querying ---------------------------------------------------------------------------

    @staticmethod
    def _matches(msg, key, value):
        return key in msg and (value is None or msg[key] == value)

    def mark(self):
        with self._cond:
            return len(self.messages) - 1

    def count(self, key, value=None, after=-1):
        with self._cond:
            return sum(1 for m in self.messages[after + 1:] if self._matches(m, key, value))

    def find(self, key, value=None, after=-1):
        """The index of the first matching message after `after`, or None (no waiting)."""
        with self._cond:
            for i in range(after + 1, len(self.messages)):
                if self._matches(self.messages[i], key, value):
                    return i
        return None

    def wait_for(self, key, value=None, timeout=10, after=-1):
        deadline = time.monotonic() + timeout
        with self._cond:
            start = after + 1
            while True:
                for i in range(start, len(self.messages)):
                    if self._matches(self.messages[i], key, value):
                        return i
                start = max(start, len(self.messages))
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [{k: v for k, v in m.items() if not k.startswith("_")}
                            for m in self.messages[after + 1:]]
                    raise AssertionError("no %s%s from the daemon within %.1f s; messages after "
                                         "#%d: %r" % (key, "" if value is None else "=" + value,
                                                      timeout, after, seen))
                self._cond.wait(left)

    # -- starting the daemon ----------------------------------------------------------------

    def spawn(self, argv, env=None, listen=(), pass_fdstore=True, watchdog_usec=None,
              **popen_kwargs):
        """Start argv as systemd would start the service; returns the Popen.

        listen: (name, socket object or fd) pairs, passed first (fd 3, 4, ...); then, with
        pass_fdstore, every stored descriptor under its FDNAME. The caller keeps its own
        listening sockets open (systemd does too) and may pass them again on a restart."""
        entries = [(name, s if isinstance(s, int) else s.fileno()) for name, s in listen]
        if pass_fdstore:
            with self._cond:
                entries += list(self.fdstore.items())
        names = [n for n, _ in entries]
        for n in names:
            if not n or ":" in n:
                raise ValueError("bad descriptor name %r" % n)

        e = dict(os.environ)
        for k in _MANAGER_ENV:
            e.pop(k, None)
        e["NOTIFY_SOCKET"] = self.notify_socket
        if entries:
            e["LISTEN_FDS"] = str(len(entries))
            e["LISTEN_FDNAMES"] = ":".join(names)
        if watchdog_usec is not None:
            e["WATCHDOG_USEC"] = str(int(watchdog_usec))
        for k, v in (env or {}).items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v

        # Move the sources above the target range first, so that no dup2 in the helper
        # overwrites a source not yet copied.
        n = len(entries)
        high = []
        try:
            for _, fd in entries:
                high.append(_dup_above(fd, 3 + n + 16))
            helper = [sys.executable, "-S", "-E", "-c", _EXEC_HELPER, str(n)]
            helper += [str(fd) for fd in high] + [str(a) for a in argv]
            self.proc = subprocess.Popen(helper, env=e, pass_fds=high, **popen_kwargs)
        finally:
            for fd in high:
                os.close(fd)
        return self.proc

    def close(self):
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._cond:
            for fd in self.fdstore.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.fdstore.clear()
        try:
            os.unlink(self.notify_socket)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _dup_above(fd, minimum):
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, minimum)


def is_listening_unix_stream(fd):
    """True when fd is a listening AF_UNIX stream socket (for tests' own checks)."""
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return False
    s = socket.socket(fileno=os.dup(fd))
    try:
        return (s.family == socket.AF_UNIX and s.type == socket.SOCK_STREAM and
                s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1)
    finally:
        s.close()
