#!/usr/bin/python3
"""Users own their builds (docs/security.md): who calls, what needs an admin, and the audit lines.

The real daemon runs as root with `--admin-group users`; its clients are real processes of
other uids (setpriv): uid 65534 and 65533 in no group, uid 65532 with `users` among its
supplementary groups only (SO_PEERCRED alone would not show it), and root. Each client is this
file run again with `--client` (one connection, calls read as JSON lines on stdin), so a
process is a connection and keeps it until told to exit. Clients run from a world-readable copy
of this file, the harness, the descriptor set, the Python package and familyctl (other_uid.py):
the clone may sit where other uids cannot read (root's home is 0700).

- Who calls: the credentials are the connection's own, taken at accept; a descriptor number
  that a closed connection of one uid had, reused by another uid's connection, carries the new
  uid (the daemon's /proc/PID/fd shows the reuse).
- Admins: Reload, ForgetNode and ReleaseBuild with force are refused to other uids with
  PERMISSION_DENIED NOT_ADMIN and the sentence of docs/semantics.md; root and a member of
  --admin-group are served.
- Audit: every state-changing call is logged with CALLER_PID= and CALLER_UID= (stderr at
  --log-level debug shows the fields).
"""

import json
import os
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402
import shard_client as SC  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
GE = "grouped_experts"
CFG = {"num_experts": {"intValue": 8}, "hidden_size": {"intValue": 64},
       "moe_intermediate_size": {"intValue": 64}, "initializer_range": {"doubleValue": 0.02}}
UID_A = 65534
UID_B = 65533
UID_ADMIN = 65532  # a member of `users` by its supplementary groups only
ADMIN_GROUP = "users"
NOT_ADMIN = ("{what} needs an admin (root, or a member of --admin-group); uid {uid} is "
             "neither")

P = None
D = None
COPY = None  # what the clients run, readable by every uid
PYTHON = None


def setUpModule():
    global P, D, COPY, PYTHON
    PYTHON = other_uid.other_uid_python()
    ctl = H.familyctl_bin()
    extra = [os.path.abspath(__file__)]
    has_ctl = ctl and os.path.exists(ctl)
    COPY = other_uid.harness_copy(*extra, package=True, familyctl=ctl if has_ctl else None,
                                  prefix="fd-own-")
    P = H.Protos()
    D = H.Daemon(registry=REGISTRY, host_devices=4, protos=P,
                 extra_args=["--admin-group", ADMIN_GROUP, "--log-level", "debug",
                             "--build-grace-ms", "0"])
    os.chmod(D.tmpdir, 0o755)
    D.start()
    os.chmod(D.socket, 0o666)
    os.chmod(D.shard_socket, 0o666)


def tearDownModule():
    try:
        if D is not None:
            D.stop_checked()
    finally:
        if COPY is not None:
            COPY.cleanup()


def client_main(socket_path):
    """--client SOCKET: one connection; {"rpc", "request"} lines in, answers out."""
    protos = H.Protos()
    client = H.Client(socket_path, protos)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            return 0
        if cmd.get("op") == "pybuild":
            # The Python package's Client.build(share=...), as a trainer calls it.
            sys.path.insert(0, os.path.join(H.SOURCE_ROOT, "client", "python"))
            import familyd
            with familyd.Client(socket_path, timeout=30) as fc:
                b = fc.build(GE, config={"num_experts": 8, "hidden_size": 64,
                                         "moe_intermediate_size": 64,
                                         "initializer_range": 0.02},
                             mesh_id=cmd["mesh_id"], seed=cmd["seed"], share=cmd["share"],
                             map_shards=False)
                sys.stdout.write(json.dumps({
                    "build_id": b.message.build_id, "shard_socket": b.message.shard_socket,
                    "tokens": [x.token for x in b.message.shards if x.token]}) + "\n")
                sys.stdout.flush()
            continue
        if cmd.get("op") == "fetch":
            reply, fds = SC.fetch(cmd["shard_socket"], protos, cmd["tokens"])
            for fd in fds:
                os.close(fd)
            sys.stdout.write(json.dumps({"code": reply.code, "message": reply.message,
                                         "fds": len(fds)}) + "\n")
            sys.stdout.flush()
            continue
        res = client.call(cmd["rpc"], cmd.get("request", {}), timeout=60)
        _, infos = client.error_details(res)
        ans = {"pid": os.getpid(), "code": res.code, "message": res.message,
               "reason": infos[0].reason if infos else ""}
        if res.ok and cmd["rpc"].endswith("/Build"):
            ans["build_id"] = res.reply.build.build_id
        if res.ok and cmd["rpc"].endswith(("/Build", "/GetBuild", "/ListBuilds")):
            builds = res.reply.builds if cmd["rpc"].endswith("/ListBuilds") else (
                [res.reply.build] if cmd["rpc"].endswith("/Build") else [res.reply])
            ans["tokens"] = {b.build_id: [x.token for x in b.shards if x.token] for b in builds}
            ans["shard_socket"] = builds[0].shard_socket if builds else ""
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
    return 0


class Client(other_uid.LineClient):
    """A client process of uid (None: root), with `users` as a supplementary group if asked."""

    def __init__(self, uid=None, admin_group=False):
        argv = [PYTHON, COPY.path(os.path.basename(__file__)), "--client", D.socket]
        if uid is not None:
            groups = ["--groups", "100"] if admin_group else ["--clear-groups"]
            argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid)] + groups + argv
        super().__init__(argv, COPY)

    def fetch(self, shard_socket, tokens):
        return self.send({"op": "fetch", "shard_socket": shard_socket, "tokens": tokens})


def daemon_sockets():
    """The daemon's descriptors that are sockets: {fd number: inode text}."""
    out = {}
    base = "/proc/%d/fd" % D.proc.pid
    for name in os.listdir(base):
        try:
            link = os.readlink(os.path.join(base, name))
        except FileNotFoundError:
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


class OwnershipCase(unittest.TestCase):
    def client(self, uid=None, admin_group=False):
        c = Client(uid, admin_group)
        self.addCleanup(c.close)
        return c

    def assert_not_admin(self, ans, what, uid):
        self.assertEqual(ans["code"], "PERMISSION_DENIED", ans)
        self.assertEqual(ans["reason"], "NOT_ADMIN", ans)
        self.assertEqual(ans["message"], NOT_ADMIN.format(what=what, uid=uid))


class TestWhoCalls(OwnershipCase):
    def test_reused_descriptor_never_carries_old_credentials(self):
        # uid A connects and calls; its descriptor in the daemon is noted; A leaves. Then uid B
        # connects until it gets the same number: B's calls must be B's.
        reused = False
        for attempt in range(20):
            before = daemon_sockets()
            a = Client(UID_A)
            self.assert_not_admin(a.ask("familyd.v1.AdminService/Reload"), "Reload", UID_A)
            with_a = daemon_sockets()
            a_fds = sorted(set(with_a) - set(before))
            self.assertTrue(a_fds, "no new daemon socket for A's connection")
            a.close()
            deadline = time.monotonic() + 10
            while any(with_a[fd] == daemon_sockets().get(fd) for fd in a_fds):
                self.assertLess(time.monotonic(), deadline, "the daemon kept A's connection")
                time.sleep(0.02)
            b = Client(UID_B)
            self.addCleanup(b.close)
            self.assert_not_admin(b.ask("familyd.v1.AdminService/Reload"), "Reload", UID_B)
            if set(a_fds) & set(daemon_sockets()):
                reused = True
                break
            b.close()
        self.assertTrue(reused, "no descriptor number was reused in 20 tries")
        # And root, on a number B may have had, is root again.
        r = self.client()
        self.assertEqual(r.ask("familyd.v1.AdminService/Reload")["code"], "OK")


class TestAdmin(OwnershipCase):
    def test_reload_needs_an_admin(self):
        self.assert_not_admin(self.client(UID_A).ask("familyd.v1.AdminService/Reload"),
                              "Reload", UID_A)
        self.assertEqual(self.client().ask("familyd.v1.AdminService/Reload")["code"], "OK")
        # A member of --admin-group by a supplementary group only (SO_PEERGROUPS).
        ans = self.client(UID_ADMIN, admin_group=True).ask("familyd.v1.AdminService/Reload")
        self.assertEqual(ans["code"], "OK", ans)

    def test_forget_node_needs_an_admin(self):
        ans = self.client(UID_B).ask("familyd.v1.MeshService/ForgetNode", {"node": "gone"})
        self.assert_not_admin(ans, "ForgetNode", UID_B)
        # An admin gets past the check to the node's own answer.
        ans = self.client(UID_ADMIN, admin_group=True).ask("familyd.v1.MeshService/ForgetNode",
                                                           {"node": "gone"})
        self.assertEqual((ans["code"], ans["reason"]), ("NOT_FOUND", "NODE_NOT_FOUND"), ans)

    def test_forced_release_needs_an_admin(self):
        mesh = D.client.call("familyd.v1.MeshService/CreateMesh",
                             {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}]}})
        self.assertTrue(mesh.ok, mesh)
        a = self.client(UID_A)
        built = a.ask("familyd.v1.FamilyService/Build",
                      {"family": GE, "config": {"fields": CFG}, "meshId": mesh.reply.mesh_id,
                       "materialize": {"enabled": True, "seed": "11"}})
        self.assertEqual(built["code"], "OK", built)
        bid = built["build_id"]
        b = self.client(UID_B)
        ans = b.ask("familyd.v1.FamilyService/ReleaseBuild", {"buildId": bid, "force": True})
        self.assert_not_admin(ans, "ReleaseBuild with force", UID_B)
        # Without force, B holds no reference: refused as before.
        ans = b.ask("familyd.v1.FamilyService/ReleaseBuild", {"buildId": bid})
        self.assertEqual(ans["reason"], "NOT_HELD", ans)
        got = D.client.call("familyd.v1.FamilyService/GetBuild", build_id=bid)
        self.assertTrue(got.ok, got)
        ans = self.client(UID_ADMIN, admin_group=True).ask(
            "familyd.v1.FamilyService/ReleaseBuild", {"buildId": bid, "force": True})
        self.assertEqual(ans["code"], "OK", ans)

    def test_releasing_ones_own_reference_needs_no_admin(self):
        mesh = D.client.call("familyd.v1.MeshService/CreateMesh",
                             {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}]}})
        a = self.client(UID_A)
        built = a.ask("familyd.v1.FamilyService/Build",
                      {"family": GE, "config": {"fields": CFG}, "meshId": mesh.reply.mesh_id,
                       "materialize": {"enabled": True, "seed": "12"}})
        self.assertEqual(built["code"], "OK", built)
        ans = a.ask("familyd.v1.FamilyService/ReleaseBuild", {"buildId": built["build_id"]})
        self.assertEqual(ans["code"], "OK", ans)


def mesh_id():
    mesh = D.client.call("familyd.v1.MeshService/CreateMesh",
                         {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}]}})
    assert mesh.ok, mesh
    return mesh.reply.mesh_id


def build_request(seed, share=None):
    r = {"family": GE, "config": {"fields": CFG}, "meshId": mesh_id(),
         "materialize": {"enabled": True, "seed": str(seed)}}
    if share is not None:
        r["share"] = share
    return r


class TestBuildsOwned(OwnershipCase):
    DENIED = ("shard token 1 of 1 is of another user's build: only its owner's processes and "
              "admins may map it, unless it was built with share \"group\"")

    def test_tokens_only_for_owner_and_admins(self):
        a = self.client(UID_A)
        built = a.ask("familyd.v1.FamilyService/Build", build_request(21))
        self.assertEqual(built["code"], "OK", built)
        bid = built["build_id"]
        self.assertEqual(len(built["tokens"][bid]), 4)
        for c in (a, self.client(), self.client(UID_ADMIN, admin_group=True)):
            got = c.ask("familyd.v1.FamilyService/GetBuild", {"buildId": bid})
            self.assertEqual(got["tokens"][bid], built["tokens"][bid])
            listed = c.ask("familyd.v1.FamilyService/ListBuilds")
            self.assertEqual(listed["tokens"][bid], built["tokens"][bid])
        b = self.client(UID_B)
        got = b.ask("familyd.v1.FamilyService/GetBuild", {"buildId": bid})
        self.assertEqual(got["code"], "OK", got)
        self.assertEqual(got["tokens"][bid], [])
        self.assertEqual(b.ask("familyd.v1.FamilyService/ListBuilds")["tokens"][bid], [])

    def test_shard_socket_hands_out_only_to_owner_and_admins(self):
        a = self.client(UID_A)
        built = a.ask("familyd.v1.FamilyService/Build", build_request(22))
        tokens = built["tokens"][built["build_id"]]
        ans = self.client(UID_B).fetch(built["shard_socket"], tokens[:1])
        self.assertEqual((ans["code"], ans["fds"]), (7, 0), ans)  # PERMISSION_DENIED
        self.assertEqual(ans["message"], self.DENIED)
        for c in (a, self.client(), self.client(UID_ADMIN, admin_group=True)):
            ans = c.fetch(built["shard_socket"], tokens)
            self.assertEqual((ans["code"], ans["fds"]), (0, 4), ans)

    def test_share_group_hands_out_to_the_group(self):
        a = self.client(UID_A)
        built = a.ask("familyd.v1.FamilyService/Build", build_request(23, share="group"))
        self.assertEqual(built["code"], "OK", built)
        tokens = built["tokens"][built["build_id"]]
        ans = self.client(UID_B).fetch(built["shard_socket"], tokens)
        self.assertEqual((ans["code"], ans["fds"]), (0, 4), ans)
        # Another build than the owner-only one of the same request (the key counts it).
        own = a.ask("familyd.v1.FamilyService/Build", build_request(23, share="owner"))
        self.assertNotEqual(own["build_id"], built["build_id"])
        # Tokens stay the owner's to see.
        got = self.client(UID_B).ask("familyd.v1.FamilyService/GetBuild",
                                     {"buildId": built["build_id"]})
        self.assertEqual(got["tokens"][built["build_id"]], [])

    def test_python_client_share_group(self):
        a = self.client(UID_A)
        built = a.send({"op": "pybuild", "mesh_id": mesh_id(), "seed": 25, "share": "group"})
        self.assertEqual(len(built["tokens"]), 4, built)
        ans = self.client(UID_B).fetch(built["shard_socket"], built["tokens"])
        self.assertEqual((ans["code"], ans["fds"]), (0, 4), ans)
        built = a.send({"op": "pybuild", "mesh_id": mesh_id(), "seed": 26, "share": "owner"})
        ans = self.client(UID_B).fetch(built["shard_socket"], built["tokens"][:1])
        self.assertEqual((ans["code"], ans["message"]), (7, self.DENIED), ans)

    def test_familyctl_share_group(self):
        ctl = H.familyctl_bin()
        if not ctl or not os.path.exists(ctl):
            self.skipTest("familyctl not built")
        ctl = COPY.path(os.path.basename(ctl))
        base = ["setpriv", "--reuid", str(UID_A), "--regid", str(UID_A), "--clear-groups",
                ctl, "--socket", D.socket]
        kv = ["num_experts=8", "hidden_size=64", "moe_intermediate_size=64",
              "initializer_range=0.02"]
        mesh = mesh_id()
        docs = {}
        for share in ("group", "owner"):
            p = subprocess.run(base + ["--json", "build", GE] + kv +
                               ["--mesh", mesh, "--materialize", "--seed", "27", "--share", share],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=60, cwd=COPY.root)
            self.assertEqual(p.returncode, 0, p.stderr)
            docs[share] = json.loads(p.stdout)["build"]
        b = self.client(UID_B)
        for share, want in (("group", (0, 4)), ("owner", (7, 0))):
            doc = docs[share]
            tokens = [x["token"] for x in doc["shards"] if x.get("token")]
            self.assertEqual(len(tokens), 4, doc)
            ans = b.fetch(doc["shardSocket"], tokens)
            self.assertEqual((ans["code"], ans["fds"]), want, (share, ans))
            # familyctl pins what it builds: unpinned by its owner, not left behind.
            subprocess.run(base + ["unpin", doc["buildId"]], stdout=subprocess.DEVNULL,
                           timeout=60, check=True)
        p = subprocess.run(base + ["build", GE] + kv + ["--materialize", "--share", "world"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--share needs owner or group, not 'world'", p.stderr)

    def test_unknown_share_value(self):
        ans = self.client(UID_A).ask("familyd.v1.FamilyService/Build",
                                     build_request(24, share="world"))
        self.assertEqual((ans["code"], ans["reason"]), ("INVALID_ARGUMENT", "BAD_REQUEST"), ans)
        self.assertEqual(ans["message"], 'share must be "owner" or "group", not \'world\'')


class TestMeshes(OwnershipCase):
    def test_delete_another_users_mesh_needs_an_admin(self):
        a, b = self.client(UID_A), self.client(UID_B)
        admin = self.client(UID_ADMIN, admin_group=True)
        for name in ("tp", "cp"):
            made = a.ask("familyd.v1.MeshService/CreateMesh",
                         {"mesh": {"deviceMesh": [{"name": name, "size": 4}]}})
            self.assertEqual(made["code"], "OK", made)
            mid = D.client.call("familyd.v1.MeshService/CreateMesh",
                                {"mesh": {"deviceMesh": [{"name": name, "size": 4}]}}
                                ).reply.mesh_id
            ans = b.ask("familyd.v1.MeshService/DeleteMesh", {"meshId": mid})
            self.assert_not_admin(ans, "DeleteMesh of another user's mesh", UID_B)
            deleter = a if name == "tp" else admin
            ans = deleter.ask("familyd.v1.MeshService/DeleteMesh", {"meshId": mid})
            self.assertEqual(ans["code"], "OK", ans)


class TestAdminGroupOption(unittest.TestCase):
    def test_unknown_group_refuses_to_start(self):
        d = H.Daemon(registry=REGISTRY, host_devices=1,
                     extra_args=["--admin-group", "no-such-group-familyd"])
        self.addCleanup(d.cleanup)
        status, err, _ = H.run_to_exit(d.argv(), 30)
        self.assertNotEqual(status, 0)
        self.assertIn("Unknown group 'no-such-group-familyd' (--admin-group), refusing to "
                      "start", err)
        self.assertFalse(os.path.exists(d.socket))


class TestAudit(OwnershipCase):
    def test_state_changing_calls_name_pid_and_uid(self):
        a = self.client(UID_A)
        refused = a.ask("familyd.v1.AdminService/Reload")
        mesh = a.ask("familyd.v1.MeshService/CreateMesh",
                     {"mesh": {"deviceMesh": [{"name": "dp", "size": 4}]}})
        self.assertEqual(mesh["code"], "OK", mesh)
        # A read is not audited.
        a.ask("familyd.v1.MeshService/ListMeshes")
        deadline = time.monotonic() + 5
        pid = refused["pid"]
        want = [
            "Reload called by pid %d (uid %d): NOT_ADMIN. [CALLER_PID=%d CALLER_UID=%d "
            "RPC_METHOD=Reload]" % (pid, UID_A, pid, UID_A),
            "CreateMesh called by pid %d (uid %d): OK. [CALLER_PID=%d CALLER_UID=%d "
            "RPC_METHOD=CreateMesh]" % (pid, UID_A, pid, UID_A),
        ]
        while not all(w in D.stderr() for w in want):
            self.assertLess(time.monotonic(), deadline, D.stderr()[-3000:])
            time.sleep(0.05)
        self.assertNotIn("ListMeshes called by pid %d" % pid, D.stderr())
        self.assertTrue(re.search(r"CALLER_PID=%d CALLER_UID=%d" % (pid, UID_A), D.stderr()))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        sys.exit(client_main(sys.argv[2]))
    unittest.main()
