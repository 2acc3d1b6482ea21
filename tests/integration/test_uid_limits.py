#!/usr/bin/python3
"""Who may pin, unpin and release, per-uid limits, and freed shards still held (docs/security.md).

The real daemon runs as root; its clients are real processes of two test users this file
creates (useradd) and removes (userdel), and root. Each client is this file run again with
`--client` (one connection, calls read as JSON lines on stdin), from a world-readable copy
(other_uid.py), so a process is a connection and keeps its references until told to exit.

- Pins (docs/semantics.md, "Who may do what"), kept with the uid that pinned across a restart
  (--state-dir): another uid can neither pin nor unpin a build
  (PERMISSION_DENIED PIN_NOT_ALLOWED / UNPIN_NOT_ALLOWED with the rule's sentence), so a build
  whose owner released its reference and that only its owner's pin holds stays, with the
  default grace and with --build-grace-ms 0; the owner's own unpin frees it (grace 0); an
  admin's unpin takes every pin. A layout (no references) is released only by its owner's
  uid or an admin.
- Per-uid limits: one uid at --max-builds-per-uid or --shm-budget-per-uid is refused with
  RESOURCE_EXHAUSTED naming its use and the option while another uid still builds;
  --max-pins-per-uid likewise; GetStatus, familyctl status and /metrics show the use; such a
  refusal frees that uid's own builds in their grace period, never another uid's.
- Freed shards still held: a read-only build force-released while a client keeps a shard
  mapped shows in GetStatus shm_released_bytes_held, familyctl status and /metrics until the
  client unmaps, then 0.
"""

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402
import shard_client as SC  # noqa: E402
import test_durability_util as U  # noqa: E402
import test_metrics_common as M  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
GE = "grouped_experts"
CFG = {"num_experts": {"intValue": 8}, "hidden_size": {"intValue": 64},
       "moe_intermediate_size": {"intValue": 64}, "initializer_range": {"doubleValue": 0.02}}
USERS = ("fd-uidtest-a", "fd-uidtest-b")
UID_A = UID_B = None
COPY = None
PYTHON = None
BUILD = "familyd.v1.FamilyService/Build"
GET = "familyd.v1.FamilyService/GetBuild"
PIN = "familyd.v1.FamilyService/PinBuild"
UNPIN = "familyd.v1.FamilyService/UnpinBuild"
RELEASE = "familyd.v1.FamilyService/ReleaseBuild"
STATUS = "familyd.v1.AdminService/GetStatus"
PIN_DENIED = ("PinBuild needs the build's owner (uid {owner}), a uid with a process holding "
              "the build, or an admin; uid {uid} is none of them")
UNPIN_DENIED = ("UnpinBuild takes only the caller's own uid's pin, or any pin for an admin; "
                "build '{id}' is pinned by 1 other uid and not by uid {uid}")


def setUpModule():
    global UID_A, UID_B, COPY, PYTHON
    uids = []
    for name in USERS:
        try:
            uids.append(pwd.getpwnam(name).pw_uid)  # left by an earlier run that was killed
            continue
        except KeyError:
            pass
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], check=True)
        uids.append(pwd.getpwnam(name).pw_uid)
    UID_A, UID_B = uids
    PYTHON = other_uid.other_uid_python()
    here = os.path.dirname(os.path.abspath(__file__))
    COPY = other_uid.harness_copy(os.path.abspath(__file__),
                                  os.path.join(here, "test_metrics_common.py"),
                                  os.path.join(here, "test_durability_util.py"),
                                  prefix="fd-uidlim-")


def tearDownModule():
    try:
        if COPY is not None:
            COPY.cleanup()
    finally:
        for name in USERS:
            subprocess.run(["userdel", name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)


def client_main(socket_path):
    """--client SOCKET: one connection; {"rpc", "request"} or {"op"} lines in, answers out."""
    protos = H.Protos()
    client = H.Client(socket_path, protos)
    maps = []
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            return 0
        if cmd.get("op") == "map":
            # Maps every shard read-only and keeps the mappings; the descriptors are closed.
            reply, fds = SC.fetch(cmd["shard_socket"], protos, cmd["tokens"])
            for fd, size in zip(fds, cmd["sizes"]):
                maps.append(SC.map_readonly(fd, size))
                os.close(fd)
            ans = {"code": reply.code, "mapped": len(maps)}
        elif cmd.get("op") == "unmap":
            for m in maps:
                m.close()
            maps = []
            ans = {"mapped": 0}
        else:
            res = client.call(cmd["rpc"], cmd.get("request", {}), timeout=60)
            _, infos = client.error_details(res)
            ans = {"code": res.code, "message": res.message,
                   "reason": infos[0].reason if infos else ""}
            if res.ok and cmd["rpc"] == BUILD:
                b = res.reply.build
                ans["build_id"] = b.build_id
                ans["shard_socket"] = b.shard_socket
                ans["tokens"] = [s.token for s in b.shards if s.token]
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
    return 0


class Client(other_uid.LineClient):
    """A client process of uid (None: root), in no supplementary group."""

    def __init__(self, d, uid=None):
        argv = [PYTHON, COPY.path(os.path.basename(__file__)), "--client", d.socket]
        if uid is not None:
            argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups"] + argv
        super().__init__(argv, COPY)


def start_daemon(*extra, metrics=False):
    extra = list(extra)
    port = H.free_port() if metrics else None
    if metrics:
        extra += ["--metrics-listen", "127.0.0.1:%d" % port]
    d = H.Daemon(registry=REGISTRY, host_devices=4, extra_args=extra)
    d.metrics_port = port
    os.chmod(d.tmpdir, 0o755)
    d.start()
    os.chmod(d.socket, 0o666)
    os.chmod(d.shard_socket, 0o666)
    return d


def mesh_id(d):
    mesh = d.client.call("familyd.v1.MeshService/CreateMesh",
                         {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}]}})
    assert mesh.ok, mesh
    return mesh.reply.mesh_id


def materialised(d, seed):
    return {"family": GE, "config": {"fields": CFG}, "meshId": mesh_id(d),
            "materialize": {"enabled": True, "seed": str(seed)}}


def layout(seed):
    # Builds that materialise nothing still take a slot (and count for their uid).
    return {"family": GE, "config": {"fields": CFG}, "materialize": {"seed": str(seed)}}


def status(d):
    res = d.client.call(STATUS)
    assert res.ok, res
    return res.reply


def uid_use(d, uid):
    for u in status(d).uid_use:
        if u.uid == uid:
            return (u.builds, u.pins, u.shm_bytes)
    return (0, 0, 0)


def familyctl_status(d):
    p = subprocess.run([H.familyctl_bin(), "--socket", d.socket, "status"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    assert p.returncode == 0, p.stdout
    return p.stdout


class Case(unittest.TestCase):
    def client(self, d, uid=None):
        c = Client(d, uid)
        self.addCleanup(c.close)
        return c

    def assert_refused(self, ans, code, reason, message=None):
        self.assertEqual((ans["code"], ans["reason"]), (code, reason), ans)
        if message is not None:
            self.assertEqual(ans["message"], message)


class PinRules:
    """Run with the default grace and with --build-grace-ms 0 (GRACE)."""
    GRACE = None

    @classmethod
    def setUpClass(cls):
        extra = [] if cls.GRACE is None else ["--build-grace-ms", str(cls.GRACE)]
        cls.d = start_daemon(*extra)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop_checked()

    def test_another_uid_cannot_pin_or_unpin_and_so_free(self):
        # The attack this guards against: the owner (uid A) pins, releases its own reference; uid B's pin
        # and unpin are refused and the build stays, held by A's pin alone.
        d = self.d
        a, b = self.client(d, UID_A), self.client(d, UID_B)
        built = a.ask(BUILD, materialised(d, 31))
        self.assertEqual(built["code"], "OK", built)
        bid = built["build_id"]
        self.assert_refused(b.ask(PIN, {"buildId": bid}), "PERMISSION_DENIED",
                            "PIN_NOT_ALLOWED", PIN_DENIED.format(owner=UID_A, uid=UID_B))
        self.assertEqual(a.ask(PIN, {"buildId": bid})["code"], "OK")
        self.assertEqual(a.ask(RELEASE, {"buildId": bid})["code"], "OK")
        self.assert_refused(b.ask(UNPIN, {"buildId": bid}), "PERMISSION_DENIED",
                            "UNPIN_NOT_ALLOWED", UNPIN_DENIED.format(id=bid, uid=UID_B))
        time.sleep(0.3)  # a grace of 0 would have freed it by now
        got = d.client.call(GET, build_id=bid)
        self.assertTrue(got.ok, got)
        self.assertTrue(got.reply.pinned, got)
        # The owner's own unpin: the build is idle (freed at once with a grace of 0).
        self.assertEqual(a.ask(UNPIN, {"buildId": bid})["code"], "OK")
        if self.GRACE == 0:
            deadline = time.monotonic() + 5
            while d.client.call(GET, build_id=bid).ok and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertFalse(d.client.call(GET, build_id=bid).ok)
        else:
            got = d.client.call(GET, build_id=bid)
            self.assertTrue(got.ok and not got.reply.pinned, got)
            d.client.call(RELEASE, build_id=bid, force=True)

    def test_root_build_unpinned_by_another_uid_is_refused(self):
        # As reported: uid B on root's build.
        d = self.d
        root, b = self.client(d), self.client(d, UID_B)
        built = root.ask(BUILD, materialised(d, 32))
        bid = built["build_id"]
        self.assertEqual(root.ask(PIN, {"buildId": bid})["code"], "OK")
        self.assertEqual(root.ask(RELEASE, {"buildId": bid})["code"], "OK")
        self.assert_refused(b.ask(PIN, {"buildId": bid}), "PERMISSION_DENIED",
                            "PIN_NOT_ALLOWED", PIN_DENIED.format(owner=0, uid=UID_B))
        self.assert_refused(b.ask(UNPIN, {"buildId": bid}), "PERMISSION_DENIED",
                            "UNPIN_NOT_ALLOWED", UNPIN_DENIED.format(id=bid, uid=UID_B))
        time.sleep(0.3)
        self.assertTrue(d.client.call(GET, build_id=bid).ok)
        d.client.call(RELEASE, build_id=bid, force=True)

    def test_admin_unpin_takes_every_pin(self):
        d = self.d
        a, b = self.client(d, UID_A), self.client(d, UID_B)
        built = a.ask(BUILD, materialised(d, 33))
        bid = built["build_id"]
        # B holds no reference to it and is not its owner: refused.
        self.assert_refused(b.ask(PIN, {"buildId": bid}), "PERMISSION_DENIED", "PIN_NOT_ALLOWED")
        self.assertEqual(a.ask(PIN, {"buildId": bid})["code"], "OK")
        # An admin's unpin takes A's pin.
        ans = d.client.call(UNPIN, build_id=bid)
        self.assertTrue(ans.ok, ans)
        self.assertFalse(ans.reply.pinned, ans)
        d.client.call(RELEASE, build_id=bid, force=True)

    def test_layout_released_only_by_its_owner_or_an_admin(self):
        d = self.d
        a, b = self.client(d, UID_A), self.client(d, UID_B)
        built = a.ask(BUILD, layout(34))
        self.assertEqual(built["code"], "OK", built)
        bid = built["build_id"]
        self.assert_refused(
            b.ask(RELEASE, {"buildId": bid}), "PERMISSION_DENIED", "RELEASE_NOT_ALLOWED",
            "ReleaseBuild of a build that no process holds frees it, which needs its owner "
            "(uid %d) or an admin; uid %d is neither" % (UID_A, UID_B))
        self.assertTrue(d.client.call(GET, build_id=bid).ok)
        self.assertEqual(a.ask(RELEASE, {"buildId": bid})["code"], "OK")
        self.assertFalse(d.client.call(GET, build_id=bid).ok)


class TestPinRulesDefaultGrace(PinRules, Case):
    GRACE = None


class TestPinRulesGraceZero(PinRules, Case):
    GRACE = 0


class TestPinsKeptAcrossARestart(Case):
    def test_a_pin_stays_its_uids_after_a_restart(self):
        state = U.tmpfs_dir("fd-uidlim-")
        self.assertIsNotNone(state, "no tmpfs to put a state dir on (/dev/shm, /run)")
        self.addCleanup(shutil.rmtree, state, True)
        tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, tmp, True)

        def start():
            d = H.Daemon(registry=REGISTRY, host_devices=4, tmpdir=tmp,
                         extra_args=["--state-dir", state])
            os.chmod(tmp, 0o755)
            d.start()
            os.chmod(d.socket, 0o666)
            os.chmod(d.shard_socket, 0o666)
            return d

        d = start()
        a = Client(d, UID_A)
        built = a.ask(BUILD, materialised(d, 95))
        self.assertEqual(built["code"], "OK", built)
        bid = built["build_id"]
        self.assertEqual(a.ask(PIN, {"buildId": bid})["code"], "OK")
        a.close()  # its reference goes; A's pin holds the build
        d.stop()
        d = start()
        self.addCleanup(d.stop)
        got = d.client.call(GET, build_id=bid)
        self.assertTrue(got.ok and got.reply.pinned, got)
        self.assertEqual(uid_use(d, UID_A), (1, 1, status(d).shm_bytes_in_use))
        self.assert_refused(self.client(d, UID_B).ask(UNPIN, {"buildId": bid}),
                            "PERMISSION_DENIED", "UNPIN_NOT_ALLOWED")
        self.assertEqual(self.client(d, UID_A).ask(UNPIN, {"buildId": bid})["code"], "OK")
        self.assertFalse(d.client.call(GET, build_id=bid).reply.pinned)


class TestPerUidLimits(Case):
    @classmethod
    def setUpClass(cls):
        # One materialised build's bytes, from a daemon of its own.
        probe = start_daemon()
        try:
            res = probe.client.call(BUILD, materialised(probe, 40))
            assert res.ok, res
            cls.one = status(probe).shm_bytes_in_use
        finally:
            probe.stop_checked()
        cls.d = start_daemon("--max-builds", "16", "--max-builds-per-uid", "3",
                             "--max-pins-per-uid", "1",
                             "--shm-budget-per-uid", str(cls.one + cls.one // 2),
                             metrics=True)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop_checked()

    def test_a_build_limit_of_one_uid_leaves_others_building(self):
        d = self.d
        a, b = self.client(d, UID_A), self.client(d, UID_B)
        mine = []
        for seed in (50, 51, 52):
            ans = a.ask(BUILD, layout(seed))
            self.assertEqual(ans["code"], "OK", ans)
            mine.append(ans["build_id"])
        self.assert_refused(
            a.ask(BUILD, layout(53)), "RESOURCE_EXHAUSTED", "UID_BUILD_LIMIT",
            "uid %d holds 3 of its 3 builds (--max-builds-per-uid); release one of them first"
            % UID_A)
        self.assertEqual(b.ask(BUILD, layout(54))["code"], "OK")
        self.assertEqual(uid_use(d, UID_A)[0], 3)
        self.assertEqual(uid_use(d, UID_B)[0], 1)
        st = status(d)
        self.assertEqual((st.max_builds_per_uid, st.max_pins_per_uid), (3, 1))
        text = familyctl_status(d)
        self.assertRegex(text, r"uid %d\s+3 builds, 0 pins, 0 bytes" % UID_A)
        self.assertRegex(text, r"per-uid limits\s+3 builds, 1 pins, %d bytes \(admins exempt\)"
                         % st.shm_budget_per_uid_bytes)
        samples = M.parse(M.scrape(d.metrics_port)[1])
        self.assertEqual(M.value(samples, "familyd_uid_use_max", resource="builds"), 3)
        self.assertGreaterEqual(M.value(samples, "familyd_uids_at_limit", resource="builds"), 1)
        self.assertEqual(M.value(samples, "familyd_uid_limit", resource="builds"), 3)
        # Its own release gives a slot back.
        self.assertEqual(a.ask(RELEASE, {"buildId": mine[0]})["code"], "OK")
        self.assertEqual(a.ask(BUILD, layout(55))["code"], "OK")
        for x in d.client.call("familyd.v1.FamilyService/ListBuilds").reply.builds:
            d.client.call(RELEASE, build_id=x.build_id, force=True)

    def test_a_byte_limit_of_one_uid_leaves_others_building(self):
        d = self.d
        a, b = self.client(d, UID_A), self.client(d, UID_B)
        first = a.ask(BUILD, materialised(d, 60))
        self.assertEqual(first["code"], "OK", first)
        ans = a.ask(BUILD, materialised(d, 61))
        self.assert_refused(ans, "RESOURCE_EXHAUSTED", "UID_SHM_BUDGET")
        limit = self.one + self.one // 2
        self.assertEqual(ans["message"],
                         "uid %d holds %d of its %d bytes of shards (--shm-budget-per-uid); the "
                         "build needs %d more" % (UID_A, self.one, limit, self.one))
        ok = b.ask(BUILD, materialised(d, 62))
        self.assertEqual(ok["code"], "OK", ok)
        self.assertEqual(uid_use(d, UID_A)[2], self.one)
        self.assertEqual(uid_use(d, UID_B)[2], self.one)
        samples = M.parse(M.scrape(d.metrics_port)[1])
        self.assertEqual(M.value(samples, "familyd_uid_use_max", resource="shm_bytes"), self.one)
        # Root (an admin) is not held to the per-uid limits.
        for seed in (63, 64):
            self.assertTrue(d.client.call(BUILD, materialised(d, seed)).ok)
        for x in d.client.call("familyd.v1.FamilyService/ListBuilds").reply.builds:
            d.client.call(RELEASE, build_id=x.build_id, force=True)

    def test_pin_limit(self):
        d = self.d
        a = self.client(d, UID_A)
        ids = [a.ask(BUILD, layout(seed))["build_id"] for seed in (70, 71)]
        self.assertEqual(a.ask(PIN, {"buildId": ids[0]})["code"], "OK")
        self.assertEqual(a.ask(PIN, {"buildId": ids[0]})["code"], "OK")  # once per uid
        self.assert_refused(
            a.ask(PIN, {"buildId": ids[1]}), "RESOURCE_EXHAUSTED", "UID_PIN_LIMIT",
            "uid %d holds 1 of its 1 pins (--max-pins-per-uid); unpin one first" % UID_A)
        self.assertEqual(uid_use(d, UID_A)[:2], (2, 1))
        for bid in ids:
            d.client.call(RELEASE, build_id=bid, force=True)
        self.assertEqual(uid_use(d, UID_A), (0, 0, 0))


class TestUidLimitEviction(Case):
    """A Build refused for its uid's limit frees that uid's own builds in their grace period,
    never another uid's."""

    @classmethod
    def setUpClass(cls):
        cls.d = start_daemon("--max-builds-per-uid", "2", "--build-grace-ms", "60000")

    @classmethod
    def tearDownClass(cls):
        cls.d.stop_checked()

    def test_own_builds_in_grace_give_way(self):
        d = self.d
        a, b = self.client(d, UID_A), self.client(d, UID_B)
        theirs = b.ask(BUILD, materialised(d, 93))["build_id"]
        self.assertEqual(b.ask(RELEASE, {"buildId": theirs})["code"], "OK")  # in grace
        first = a.ask(BUILD, materialised(d, 90))["build_id"]
        second = a.ask(BUILD, materialised(d, 91))["build_id"]
        # A holds both: refused, and B's build in grace does not give way for A.
        self.assert_refused(a.ask(BUILD, materialised(d, 92)), "RESOURCE_EXHAUSTED",
                            "UID_BUILD_LIMIT")
        self.assertTrue(d.client.call(GET, build_id=theirs).ok)
        # A's own build in grace gives way.
        self.assertEqual(a.ask(RELEASE, {"buildId": first})["code"], "OK")
        third = a.ask(BUILD, materialised(d, 92))
        self.assertEqual(third["code"], "OK", third)
        self.assertFalse(d.client.call(GET, build_id=first).ok)
        self.assertTrue(d.client.call(GET, build_id=theirs).ok)
        for bid in (second, third["build_id"], theirs):
            d.client.call(RELEASE, build_id=bid, force=True)


class TestReleasedShardsHeld(Case):
    @classmethod
    def setUpClass(cls):
        cls.d = start_daemon(metrics=True)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop_checked()

    def held(self):
        st = status(self.d)
        return st.shm_released_bytes_held, st.shm_released_segments_held

    def test_forced_release_while_a_client_maps(self):
        d = self.d
        a = self.client(d, UID_A)
        built = a.ask(BUILD, materialised(d, 80))
        self.assertEqual(built["code"], "OK", built)
        bid = built["build_id"]
        got = d.client.call(GET, build_id=bid)
        sizes = [s.size_bytes for s in got.reply.shards]
        total = status(d).shm_bytes_in_use
        self.assertGreater(total, 0)
        mapped = a.send({"op": "map", "shard_socket": built["shard_socket"],
                         "tokens": built["tokens"], "sizes": sizes})
        self.assertEqual(mapped["mapped"], len(sizes), mapped)
        self.assertEqual(self.held(), (0, 0))
        res = d.client.call(RELEASE, build_id=bid, force=True)
        self.assertTrue(res.ok, res)
        self.assertEqual(status(d).shm_bytes_in_use, 0)
        self.assertEqual(self.held(), (total, len(sizes)))
        self.assertRegex(familyctl_status(d), r"shm released, held\s+%d bytes in %d "
                         r"shards" % (total, len(sizes)))
        samples = M.parse(M.scrape(d.metrics_port)[1])
        self.assertEqual(M.value(samples, "familyd_shm_released_held_bytes"), total)
        a.send({"op": "unmap"})
        self.assertEqual(self.held(), (0, 0))
        samples = M.parse(M.scrape(d.metrics_port)[1])
        self.assertEqual(M.value(samples, "familyd_shm_released_held_bytes"), 0)

    def test_released_with_nobody_mapping_is_not_held(self):
        d = self.d
        res = d.client.call(BUILD, materialised(d, 81))
        self.assertTrue(res.ok, res)
        d.client.call(RELEASE, build_id=res.reply.build.build_id, force=True)
        self.assertEqual(self.held(), (0, 0))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--client":
        sys.exit(client_main(sys.argv[2]))
    unittest.main(verbosity=2)
