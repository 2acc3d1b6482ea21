#!/usr/bin/python3
"""A trainer-like process for the shared-builds tests: it holds builds as its own process.

    build_holder.py SOCKET [--go FILE]
Reads one JSON command per line on stdin and answers one JSON line on stdout:
    {"op": "build", "request": {...proto3 JSON BuildRequest...}}
        -> {"code", "message", "build_id", "shared", "tokens", "shard_socket", "pid"}
           (with "go" set, it first waits until that file exists: several processes then
           call at the same moment)
    {"op": "fetch"}   -> {"digest": sha256 of the bytes of every token of the last build}
    {"op": "release", "build_id": ID, "force": false} -> {"code", "message", "freed", "reason"}
    {"op": "call", "rpc": "pkg.Service/Method", "request": {...}} -> {"code", "message"}
    {"op": "seen", "build_id": ID} -> {"get_code", "get_tokens", "list_tokens"}: the tokens
        GetBuild and ListBuilds show this process for the build
    {"op": "shard", "shard_socket": PATH, "tokens": [...], "writable": false}
        -> {"code", "message", "n_fds"}: the shard socket's answer (descriptors closed)
    {"op": "write", "token": T, "hex": H} -> {"code", "message"}: maps T's shard MAP_SHARED
        read-write and writes H's bytes at its start; the mapping stays while the process lives
    {"op": "read", "token": T, "size": N} -> {"code", "message", "hex"}: the first N bytes of a
        fresh read-only mapping of T's shard
    {"op": "exit"}    -> exits 0
"""

import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402


def reason_of(client, res):
    _, infos = client.error_details(res)
    return infos[0].reason if infos else ""


def call(client, rpc, request, timeout=None):
    """A call, made again once when grpcio answers UNAVAILABLE for a connection the daemon
    closed while it was idle (--connection-idle-ms)."""
    res = client.call(rpc, request, timeout=timeout)
    if res.code == "UNAVAILABLE":
        res = client.call(rpc, request, timeout=timeout)
    return res


def main():
    socket_path = sys.argv[1]
    protos = H.Protos()
    client = H.Client(socket_path, protos)
    last = None
    held = []  # mappings "write" keeps
    out = sys.stdout
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        ans = {"pid": os.getpid()}
        if op == "build":
            go = cmd.get("go")
            while go and not os.path.exists(go):
                time.sleep(0.001)
            res = client.call("familyd.v1.FamilyService/Build", cmd["request"],
                              timeout=cmd.get("timeout", 60))
            ans.update(code=res.code, message=res.message, reason=reason_of(client, res))
            if res.ok:
                b = res.reply.build
                last = b
                ans.update(build_id=b.build_id, shared=res.reply.shared,
                           tokens=[s.token for s in b.shards if s.token],
                           shard_socket=b.shard_socket)
        elif op == "fetch":
            h = hashlib.sha256()
            for s in last.shards:
                if not s.token:
                    continue
                reply, fds = SC.fetch(last.shard_socket, protos, [s.token])
                try:
                    m = SC.map_readonly(fds[0], reply.sizes[0])
                    h.update(m[:])
                    m.close()
                finally:
                    for fd in fds:
                        os.close(fd)
            ans.update(digest=h.hexdigest())
        elif op == "release":
            res = call(client, "familyd.v1.FamilyService/ReleaseBuild",
                       {"buildId": cmd["build_id"], "force": cmd.get("force", False)})
            ans.update(code=res.code, message=res.message, reason=reason_of(client, res),
                       freed=bool(res.reply and res.reply.freed))
        elif op == "call":
            res = call(client, cmd["rpc"], cmd.get("request", {}))
            ans.update(code=res.code, message=res.message)
        elif op == "seen":
            got = call(client, "familyd.v1.FamilyService/GetBuild", {"buildId": cmd["build_id"]})
            listed = call(client, "familyd.v1.FamilyService/ListBuilds", {})
            ans.update(get_code=got.code,
                       get_tokens=[s.token for s in got.reply.shards if s.token]
                       if got.ok else [],
                       list_tokens=[s.token for b in listed.reply.builds
                                    if b.build_id == cmd["build_id"]
                                    for s in b.shards if s.token] if listed.ok else [])
        elif op in ("shard", "write", "read"):
            path = cmd.get("shard_socket") or last.shard_socket
            tokens = cmd.get("tokens") or [cmd["token"]]
            writable = cmd.get("writable", op == "write")
            reply, fds = SC.fetch(path, protos, tokens, writable=writable)
            try:
                ans.update(code=reply.code, message=reply.message, n_fds=len(fds))
                if op == "write" and fds:
                    m = SC.map_writable(fds[0], reply.sizes[0])
                    data = bytes.fromhex(cmd["hex"])
                    m[:len(data)] = data
                    held.append(m)
                elif op == "read" and fds:
                    m = SC.map_readonly(fds[0], reply.sizes[0])
                    ans.update(hex=m[:cmd["size"]].hex())
                    m.close()
            finally:
                for fd in fds:
                    os.close(fd)
        elif op == "exit":
            return 0
        out.write(json.dumps(ans) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
