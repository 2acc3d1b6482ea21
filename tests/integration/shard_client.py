"""A client for familyd's shard socket (proto/familyd/v1/shard.proto: framing, tokens, limits).

Each message is a 4-byte little-endian length and that many bytes of a serialized protobuf
message: the client sends familyd.v1.ShardFdRequest{repeated string tokens; bool writable}, the
daemon answers familyd.v1.ShardFdReply{code, message, sizes, device_kinds, devices}, with one
descriptor per token riding as SCM_RIGHTS on the first bytes of a successful reply.

    with ShardClient(build.shard_socket, protos) as sc:
        reply, fds = sc.request([token], writable=False)

No familyd code is imported: the framing and the descriptor passing are done here by hand, as a
trainer would.
"""

import array
import mmap
import os
import socket
import struct

HEADER = 4
MAX_FRAME = 65536
MAX_TOKENS = 253


class ShardClient:
    def __init__(self, path, protos, timeout=10.0):
        self.path = path
        self.protos = protos
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def send_frame(self, payload):
        self.sock.sendall(struct.pack("<I", len(payload)) + payload)

    def recv_frame(self):
        """One reply frame: (payload bytes, [received descriptors]). Descriptors are the caller's."""
        fds = []
        buf = b""
        cmsg_space = socket.CMSG_SPACE(MAX_TOKENS * array.array("i").itemsize)
        # The first chunk carries the descriptors: recvmsg with a control buffer.
        while len(buf) < HEADER or len(buf) < HEADER + struct.unpack("<I", buf[:HEADER])[0]:
            want = MAX_FRAME + HEADER - len(buf) if len(buf) < HEADER else \
                HEADER + struct.unpack("<I", buf[:HEADER])[0] - len(buf)
            data, anc, flags, _ = self.sock.recvmsg(max(want, 1), cmsg_space)
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(cdata[:len(cdata) - (len(cdata) % a.itemsize)])
                    fds.extend(a)
            if flags & getattr(socket, "MSG_CTRUNC", 8):
                for fd in fds:
                    os.close(fd)
                raise AssertionError("control data truncated (MSG_CTRUNC)")
            if not data:
                for fd in fds:
                    os.close(fd)
                raise EOFError("shard socket closed after %d bytes" % len(buf))
            buf += data
        (n,) = struct.unpack("<I", buf[:HEADER])
        if n > MAX_FRAME:
            for fd in fds:
                os.close(fd)
            raise AssertionError("reply frame of %d bytes exceeds %d" % (n, MAX_FRAME))
        return buf[HEADER:HEADER + n], fds

    def request(self, tokens, writable=False):
        """(ShardFdReply, [fds]) for tokens; every fd returned is the caller's to close."""
        req = self.protos.cls("familyd.v1.ShardFdRequest")()
        req.tokens.extend(tokens)
        req.writable = writable
        self.send_frame(req.SerializeToString())
        payload, fds = self.recv_frame()
        reply = self.protos.cls("familyd.v1.ShardFdReply").FromString(payload)
        return reply, fds


    def deposit(self, names, fds, tokens=(), split=False):
        """(ShardFdReply, []) for a checkpoint deposit: names and the descriptors (the caller's
        still) ride in one frame, SCM_RIGHTS on its first bytes; with split, on the body's
        first bytes, the header sent alone first."""
        req = self.protos.cls("familyd.v1.ShardFdRequest")()
        req.checkpoint_files.extend(names)
        req.tokens.extend(tokens)
        payload = req.SerializeToString()
        frame = struct.pack("<I", len(payload)) + payload
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] \
            if fds else []
        if split:
            self.sock.sendall(frame[:HEADER])
            frame = frame[HEADER:]
        sent = self.sock.sendmsg([frame], anc)
        if sent < len(frame):
            self.sock.sendall(frame[sent:])
        payload, got = self.recv_frame()
        return self.protos.cls("familyd.v1.ShardFdReply").FromString(payload), got


def checkpoint_files(path):
    """The files a client deposits for PATH (a file; or a directory's *.index.json and every
    *.safetensors in it, sorted): [(base name, full path)]."""
    if os.path.isfile(path):
        return [(os.path.basename(path), path)]
    names = sorted(n for n in os.listdir(path)
                   if n.endswith(".index.json") or n.endswith(".safetensors"))
    return [(n, os.path.join(path, n)) for n in names]


def deposit(sock_path, protos, path):
    """Opens PATH's files here, with this process's rights, and deposits them: the token."""
    files = checkpoint_files(path)
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for _, p in files]
    try:
        with ShardClient(sock_path, protos) as sc:
            reply, _ = sc.deposit([n for n, _ in files], fds)
    finally:
        for fd in fds:
            os.close(fd)
    if reply.code != 0:
        raise RuntimeError("deposit refused (%d): %s" % (reply.code, reply.message))
    return reply.checkpoint_token


def fetch(path, protos, tokens, writable=False):
    """One connection, one request: (reply, fds)."""
    with ShardClient(path, protos) as sc:
        return sc.request(tokens, writable=writable)


def map_readonly(fd, size):
    """A read-only shared mapping of size bytes of fd."""
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


def map_writable(fd, size):
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
