"""Helpers shared by the durability tests (test_state_dir.py, test_durability_fdstore.py).

Not a test itself: builds, shard bytes and the daemon's view of them (ListBuilds, GetBuild,
ListMeshes, GetStatus) in a form two daemons' answers can be compared in.
"""

import os
import subprocess
import time

import familyd_harness as H
import shard_client as SC

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
GE = "grouped_experts"
GE_CONFIG = {"num_experts": 8, "hidden_size": 16, "moe_intermediate_size": 8,
             "initializer_range": 0.02}
STATUS_OK = 0
STATUS_FAILED_PRECONDITION = 9


def fs_type(path):
    """The file system type of path as stat -f names it ('tmpfs', 'ext2/ext3', ...)."""
    out = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def tmpfs_dir(prefix):
    """A fresh directory on a tmpfs (/dev/shm, else /run), or None."""
    import tempfile
    for base in ("/dev/shm", "/run"):
        if os.path.isdir(base) and os.access(base, os.W_OK) and fs_type(base) == "tmpfs":
            return tempfile.mkdtemp(prefix=prefix, dir=base)
    return None


def build_request(P, family=GE, config=None, mesh_id="", materialize=None, args=None,
                  writable=False):
    req = P.cls("familyd.v1.BuildRequest")(family=family, mesh_id=mesh_id, writable=writable)
    for k, v in (args or {}).items():
        req.arguments[k].CopyFrom(P.value(v))
    req.config.SetInParent()
    for k, v in (GE_CONFIG if config is None else config).items():
        req.config.fields[k].CopyFrom(P.value(v))
    if materialize is not None:
        req.materialize.enabled = True
        # Each build its own, as a restart must keep them apart (not shared: docs/sharing.md).
        req.private_build = True
        for k, v in materialize.items():
            if k == "ranks":
                req.materialize.ranks.extend(v)
            else:
                setattr(req.materialize, k, v)
    return req


def ok(tc, res):
    tc.assertEqual(res.code, "OK", "%r" % res)
    return res.reply


def create_mesh(tc, client, mesh):
    return ok(tc, client.call("familyd.v1.MeshService/CreateMesh", {"mesh": mesh})).mesh_id


def build(tc, d, **kw):
    return ok(tc, d.client.call("familyd.v1.FamilyService/Build", build_request(d.protos, **kw))).build


def fetch(d, build, writable=False):
    """(reply, {rank: fd}) for every rank of build with a token, in one request."""
    holders = [s for s in build.shards if s.token]
    reply, fds = SC.fetch(d.shard_socket, d.protos, [s.token for s in holders], writable)
    return reply, {s.rank: fd for s, fd in zip(holders, fds)}


def read_shards(tc, d, build):
    """{rank: bytes} of every materialised rank, read through fresh read-only mappings."""
    reply, fds = fetch(d, build)
    tc.assertEqual(reply.code, STATUS_OK, reply.message)
    out = {}
    sizes = {s.rank: s.size_bytes for s in build.shards if s.token}
    for rank, fd in fds.items():
        try:
            m = SC.map_readonly(fd, sizes[rank])
            out[rank] = bytes(m)
            m.close()
        finally:
            os.close(fd)
    return out


def view(tc, d):
    """What a restart must keep: every build (as GetBuild answers, in ListBuilds order), every
    mesh, and the counts and bytes GetStatus reports."""
    c = d.client
    builds = ok(tc, c.call("familyd.v1.FamilyService/ListBuilds")).builds
    got = [ok(tc, c.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id))
           for b in builds]
    tc.assertEqual([b.SerializeToString() for b in builds],
                   [g.SerializeToString() for g in got])
    meshes = ok(tc, c.call("familyd.v1.MeshService/ListMeshes")).meshes
    st = ok(tc, c.call("familyd.v1.AdminService/GetStatus"))
    # What holds a build (references, pin, privacy, creation time) is kept across a restart
    # (docs/sharing.md) with the build itself. A grace period starts again at the restart: that
    # a build is in one is kept, not when it ends. A layout-only build has no record of its
    # holders: its creation time is its re-adoption's.
    builds = [type(b).FromString(b.SerializeToString()) for b in builds]
    for b in builds:
        b.grace_deadline_unix_ms = 1 if b.grace_deadline_unix_ms else 0
        if not any(s.token for s in b.shards):
            b.ClearField("created_unix_ms")
    return {
        "builds": [b.SerializeToString(deterministic=True) for b in builds],
        "ids": [b.build_id for b in builds],
        "meshes": [m.SerializeToString(deterministic=True) for m in meshes],
        "status": (st.builds, st.meshes, st.shm_bytes_in_use),
    }


def wait_gone(proc, timeout=30):
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc.poll() is not None
