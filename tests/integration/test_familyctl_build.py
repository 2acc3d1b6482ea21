#!/usr/bin/python3
"""familyctl build, builds, build-info, release, shard against the real daemon.

Checks: build with KEY=VALUE and with --config FILE.json (and --module), the builds table,
build-info --json, shard's per-slice FNV-1a 64 checksums and first values against the bytes
this test maps itself (its own shard socket client), release then build-info (exit 1,
NOT_FOUND), usage errors (exit 2; JSON files with a duplicate key or a syntax error named with
line and column), -o/--noheadings over the builds table and build-info's two tables, and
--help of each verb.
"""

import array
import json
import mmap
import shutil
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CTL = H.familyctl_bin()
D = None
TMP = None

CONFIG = {"hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 4,
          "initializer_range": 0.02}
KV = ["%s=%s" % (k, v) for k, v in CONFIG.items()]


def setUpModule():
    global D, TMP
    if not CTL or not os.path.exists(CTL):
        raise unittest.SkipTest("familyctl not built")
    TMP = tempfile.mkdtemp(prefix="fd-ctlb-")
    D = H.Daemon(registry=REGISTRY, host_devices=8, node_name="ctlb-node")
    D.start()


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)
    if D is None:
        return
    try:
        D.stop()
    finally:
        D.cleanup()


def ctl(*args, timeout=60):
    argv = [CTL, "--socket", D.socket] + list(args)
    env = dict(os.environ)
    env.pop("FAMILYD_SOCKET", None)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def fetch_fd(path, token, writable=False):
    """This test's own shard socket client: (fd, size) of one token."""
    P = D.protos
    payload = P.cls("familyd.v1.ShardFdRequest")(tokens=[token], writable=writable).SerializeToString()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    fds = []
    try:
        s.connect(path)
        s.sendall(struct.pack("<I", len(payload)) + payload)
        buf = b""
        need = 4
        length = None
        while True:
            data, anc, _, _ = s.recvmsg(65536, socket.CMSG_SPACE(4 * 253))
            for lvl, typ, cd in anc:
                if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(cd[:len(cd) - len(cd) % 4])
                    fds += list(a)
            if not data:
                raise AssertionError("shard socket closed early")
            buf += data
            if length is None and len(buf) >= 4:
                length = struct.unpack("<I", buf[:4])[0]
                need = 4 + length
            if length is not None and len(buf) >= need:
                break
        reply = P.cls("familyd.v1.ShardFdReply").FromString(buf[4:need])
        assert reply.code == 0, reply
        assert len(fds) == 1, fds
        return fds.pop(), reply.sizes[0]
    finally:
        for fd in fds:
            os.close(fd)
        s.close()


def build_id_of(out):
    for line in out.splitlines():
        if line.startswith("build id"):
            return line.split()[-1]
    raise AssertionError("no build id in:\n" + out)


class TestFamilyctlBuild(unittest.TestCase):
    def ok(self, *args):
        rc, out, err = ctl(*args)
        self.assertEqual(rc, 0, "familyctl %s: rc=%d\nstdout:\n%s\nstderr:\n%s"
                         % (" ".join(args), rc, out, err))
        return out

    def test_build_key_value(self):
        out = self.ok("build", "grouped_experts", *KV)
        bid = build_id_of(out)
        self.assertRegex(out, r"family\s+grouped_experts")
        self.assertRegex(out, r"origin\s+direct")
        self.assertIn("gate_up_proj", out)
        self.assertIn("[4,64,64]", out)
        self.assertIn("[4,32,64]", out)
        self.assertRegex(out, r"materialized\s+0 of 1 ranks")
        # Values keep their types: ints as ints, the float as a float.
        doc = json.loads(self.ok("--json", "build-info", bid))
        fields = doc["info"]["configSnapshot"]["fields"]
        self.assertEqual(fields["hidden_size"], {"intValue": "64"})
        self.assertEqual(fields["initializer_range"], {"doubleValue": 0.02})

    def test_build_config_file(self):
        path = os.path.join(TMP, "config.json")
        with open(path, "w") as f:
            json.dump(dict(CONFIG, note="x\u00e9"), f)
        doc = json.loads(self.ok("--json", "build", "grouped_experts", "--config", path,
                                 "num_experts=8", "--materialize", "--dtype", "bf16",
                                 "--seed", "5"))
        b = doc["build"]
        fields = b["info"]["configSnapshot"]["fields"]
        self.assertEqual(fields["num_experts"], {"intValue": "8"})   # KEY=VALUE wins
        self.assertEqual(fields["note"], {"stringValue": "x\u00e9"})
        params = {p["name"]: p for p in b["info"]["layout"]["parameters"]}
        self.assertEqual(params["gate_up_proj"]["shape"], ["8", "64", "64"])
        self.assertEqual(params["gate_up_proj"]["dtype"], "bfloat16")
        self.assertEqual(len(b["shards"]), 1)
        self.assertTrue(b["shards"][0].get("token"))
        self.assertEqual(int(b["shards"][0]["sizeBytes"]), 2 * (8 * 64 * 64 + 8 * 32 * 64))

    def test_build_module(self):
        path = os.path.join(TMP, "module.json")
        with open(path, "w") as f:
            json.dump({"fqn": "layers.0.moe", "parameters": [
                {"name": "gate_up_proj", "shape": [4, 16, 8], "dtype": "float32"},
                {"name": "down_proj", "shape": [4, 4, 16], "dtype": "float32"}]}, f)
        out = self.ok("build", "grouped_experts", "--module", path)
        self.assertRegex(out, r"origin\s+replacement")
        self.assertIn("[4,16,8]", out)

    def test_builds_table(self):
        b1 = build_id_of(self.ok("build", "grouped_experts", *KV))
        b2 = build_id_of(self.ok("build", "grouped_experts", *KV, "--materialize", "--private"))
        out = self.ok("builds")
        lines = out.splitlines()
        self.assertEqual(lines[0].split(), ["BUILD_ID", "FAMILY", "VARIANT", "ORIGIN", "MESH",
                                            "RANKS", "MATERIALIZED", "BYTES", "PINNED", "REFS",
                                            "GRACE"])
        rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
        self.assertEqual(rows[b1][1:], ["grouped_experts", "grouped", "direct", "-", "1", "0", "0",
                                        "no", "0", "-"])
        self.assertEqual(rows[b2][1:7], ["grouped_experts", "grouped", "direct", "-", "1", "1"])
        self.assertEqual(int(rows[b2][7]), 4 * (4 * 64 * 64 + 4 * 32 * 64))
        # familyctl build pins what it materialises; familyctl itself has exited.
        self.assertEqual(rows[b2][8:], ["yes", "0", "-"])
        doc = json.loads(self.ok("--json", "builds"))
        self.assertIn(b2, [b["buildId"] for b in doc["builds"]])

    def test_build_info_json(self):
        bid = build_id_of(self.ok("build", "grouped_experts", *KV, "--materialize"))
        doc = json.loads(self.ok("build-info", bid, "--json"))
        self.assertEqual(doc["buildId"], bid)
        self.assertEqual(doc["info"]["resolved"]["family"], "grouped_experts")
        self.assertEqual(doc["shardSocket"], D.shard_socket)
        self.assertEqual([s.get("rank", "0") for s in doc["shards"]], ["0"])
        human = self.ok("build-info", bid)
        self.assertEqual(build_id_of(human), bid)

    def check_shard(self, bid, rank, dtype):
        info = json.loads(self.ok("--json", "build-info", bid))
        shard = [s for s in info["shards"] if int(s.get("rank", "0")) == rank][0]
        fd, size = fetch_fd(info["shardSocket"], shard["token"])
        try:
            mem = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            table = self.ok("shard", bid, str(rank))
            js = json.loads(self.ok("--json", "shard", bid, str(rank)))
            self.assertRegex(table, r"size\s+%d bytes" % size)
            self.assertEqual(js["sizeBytes"], size)
            self.assertEqual(js["rank"], rank)
            rows = {ln.split()[0]: ln.split() for ln in table.splitlines()
                    if ln.split() and ln.split()[0] in ("gate_up_proj", "down_proj")}
            self.assertEqual(set(rows), {"gate_up_proj", "down_proj"})
            self.assertEqual(len(js["slices"]), len(shard["slices"]))
            for sl, jsl in zip(shard["slices"], js["slices"]):
                off, ln = int(sl.get("byteOffset", "0")), int(sl["byteLength"])
                data = mem[off:off + ln]
                want = "%016x" % fnv1a64(data)
                self.assertEqual(jsl["fnv1a64"], want, sl["parameter"])
                row = rows[sl["parameter"]]
                self.assertEqual(row[1], "[%s]" % ",".join(sl["localShape"]))
                self.assertEqual(row[2], "[%s]" % ",".join(sl.get("globalOffset", [])) or "[]")
                self.assertEqual(int(row[3]), off)
                self.assertEqual(int(row[4]), ln)
                self.assertEqual(row[5], want)
                self.assertEqual(jsl["dtype"], dtype)
                if dtype == "float32":
                    first = struct.unpack_from("<4f", data)
                else:
                    first = [struct.unpack("<f", struct.pack("<I", v << 16))[0]
                             for v in struct.unpack_from("<4H", data)]
                for a, b in zip(jsl["first"], first):
                    self.assertAlmostEqual(a, b, places=6)
                self.assertEqual([float(x) for x in row[6].split(",")],
                                 [float("%.6g" % v) for v in first])
        finally:
            mem.close()

    def test_shard_slices_and_checksums(self):
        bid = build_id_of(self.ok("build", "grouped_experts", *KV, "--materialize"))
        self.check_shard(bid, 0, "float32")

    def test_shard_on_mesh_bf16(self):
        mesh = json.loads(self.ok("--json", "mesh", "create", "ep=2", "--ranks", "0,1"))["meshId"]
        out = self.ok("build", "grouped_experts", *KV, "--mesh", mesh, "--materialize",
                      "--dtype", "bfloat16", "--ranks", "1", "--seed", "9", "--writable")
        bid = build_id_of(out)
        self.assertRegex(out, r"mesh\s+%s" % mesh)
        self.check_shard(bid, 1, "bfloat16")
        t = self.ok("shard", bid, "1")
        self.assertIn("[2,0,0]", t)    # rank 1 holds experts 2..3
        rc, _, err = ctl("shard", bid, "0")
        self.assertEqual(rc, 1, err)
        self.assertIn("not materialised", err)
        rc, _, err = ctl("shard", bid, "7")
        self.assertEqual(rc, 1, err)
        self.assertIn("not a rank", err)
        out = self.ok("shard", bid, "1", "--writable")
        self.assertRegex(out, r"writable\s+yes")
        self.assertRegex(out, r"mode\s+shared")

    def test_release_then_build_info(self):
        bid = build_id_of(self.ok("build", "grouped_experts", *KV, "--materialize", "--private"))
        # familyctl holds no reference of its own: without --force the daemon says so.
        rc, out, err = ctl("release", bid)
        self.assertEqual(rc, 1, (out, err))
        self.assertIn("FAILED_PRECONDITION", err)
        self.assertIn("is not held by the calling process", err)
        self.assertIn("familyctl release %s --force" % bid, err)
        self.assertRegex(self.ok("release", bid, "--force"), r"freed\s+yes")
        rc, out, err = ctl("build-info", bid)
        self.assertEqual(rc, 1, (out, err))
        self.assertIn("NOT_FOUND", err)
        self.assertIn("BUILD_NOT_FOUND", err)
        rc, out, err = ctl("release", bid)
        self.assertEqual(rc, 1, (out, err))
        rc, out, err = ctl("shard", bid, "0")
        self.assertEqual(rc, 1, (out, err))
        self.assertNotIn(bid, self.ok("builds"))

    def test_pin_unpin_transient(self):
        bid = build_id_of(self.ok("build", "grouped_experts", *KV, "--materialize", "--private",
                                  "--transient"))
        # Not pinned, and familyctl's reference went with it: the grace period runs.
        info = self.ok("build-info", bid)
        self.assertRegex(info, r"pinned\s+no")
        deadline = time.monotonic() + 10
        while "freed at" not in info and time.monotonic() < deadline:
            time.sleep(0.1)
            info = self.ok("build-info", bid)
        self.assertRegex(info, r"references\s+none")
        self.assertIn("unless a process takes it again", info)
        out = self.ok("pin", bid)
        self.assertRegex(out, r"pinned\s+yes")
        self.assertNotIn("freed at", out)
        doc = json.loads(self.ok("--json", "build-info", bid))
        self.assertTrue(doc["pinned"])
        self.assertNotIn("graceDeadlineUnixMs", doc)
        out = self.ok("unpin", bid)
        self.assertRegex(out, r"pinned\s+no")
        self.assertIn("freed at", out)
        row = [ln.split() for ln in self.ok("builds").splitlines() if ln.startswith(bid)][0]
        self.assertEqual(row[8:10], ["no", "0"])
        self.assertRegex(row[10], r"^\d+s$")
        self.assertRegex(self.ok("release", bid, "--force"), r"freed\s+yes")
        rc, _, err = ctl("pin", bid)
        self.assertEqual(rc, 1, err)
        self.assertIn("BUILD_NOT_FOUND", err)
        rc, _, err = ctl("build", "grouped_experts", *KV, "--transient")
        self.assertEqual(rc, 2, err)
        self.assertIn("--transient needs --materialize", err)

    def test_daemon_errors_exit_1(self):
        rc, _, err = ctl("build", "grouped_experts", "hidden_size=64")
        self.assertEqual(rc, 1, err)
        self.assertIn("INVALID_ARGUMENT", err)
        rc, _, err = ctl("build", "nope", *KV)
        self.assertEqual(rc, 1, err)
        self.assertIn("NOT_FOUND", err)

    def test_bad_usage(self):
        bad_json = os.path.join(TMP, "bad.json")
        with open(bad_json, "w") as f:
            f.write('{"hidden_size": 64,}')
        null_json = os.path.join(TMP, "null.json")
        with open(null_json, "w") as f:
            f.write('{"hidden_size": null}')
        cases = [
            ("build",),
            ("build", "grouped_experts", "notkv"),
            ("build", "grouped_experts", "=1"),
            ("build", "grouped_experts", "--dtype", "bf16"),
            ("build", "grouped_experts", "--materialize", "--seed", "x"),
            ("build", "grouped_experts", "--materialize", "--seed", "-1"),
            ("build", "grouped_experts", "--materialize", "--ranks", "a"),
            ("build", "grouped_experts", "--config", os.path.join(TMP, "missing.json")),
            ("build", "grouped_experts", "--config", bad_json),
            ("build", "grouped_experts", "--config", null_json),
            ("build", "grouped_experts", "--arg", "novalue"),
            ("build", "grouped_experts", "--bogus"),
            ("builds", "extra"),
            ("build-info",),
            ("build-info", "a", "b"),
            ("release",),
            ("shard", "id"),
            ("shard", "id", "zero"),
            ("shard", "id", "0", "1"),
        ]
        for args in cases:
            rc, out, err = ctl(*args)
            self.assertEqual(rc, 2, "%s: rc=%d %s %s" % (args, rc, out, err))
            self.assertIn("--help", err, args)
            self.assertEqual(out, "", args)

    def test_json_files_refused_with_line_and_column(self):
        dup = os.path.join(TMP, "dup.json")
        with open(dup, "w") as f:
            f.write('{"hidden_size": 64,\n "num_experts": 4,\n "hidden_size": 32}\n')
        bad = os.path.join(TMP, "syntax.json")
        with open(bad, "w") as f:
            f.write('{"hidden_size": 64,}')
        mod = os.path.join(TMP, "dupmod.json")
        with open(mod, "w") as f:
            f.write('{"fqn": "a",\n "parameters": [{"name": "w", "name": "v"}]}')
        cases = [
            (["--config", dup], "familyctl: --config %s:3:14: duplicate object key 'hidden_size'\n" % dup),
            (["--config", bad], "familyctl: --config %s:1:20: not JSON: string or '}' expected near '}'\n" % bad),
            (["--module", mod], "familyctl: --module %s:2:36: duplicate object key 'name'\n" % mod),
        ]
        for args, text in cases:
            rc, out, err = ctl("build", "grouped_experts", *args)
            self.assertEqual(rc, 2, "%s: %s" % (args, err))
            self.assertEqual(out, "")
            self.assertTrue(err.startswith(text), err)

    def test_table_options(self):
        bid = build_id_of(self.ok("build", "grouped_experts", *KV, "--materialize"))
        out = self.ok("builds", "-o", "bytes,build_id", "--noheadings")
        rows = [ln.split() for ln in out.splitlines()]
        self.assertIn([str(4 * (4 * 64 * 64 + 4 * 32 * 64)), bid], rows, out)
        self.assertTrue(all(len(r) == 2 for r in rows), out)
        # build-info: each of its tables shows the named columns that are its own
        out = self.ok("build-info", bid, "-o", "materialized,PARAMETER,rank")
        blocks = out.split("\n\n")
        self.assertEqual(len(blocks), 3, out)
        self.assertEqual(build_id_of(blocks[0]), bid)
        self.assertEqual([ln.split() for ln in blocks[1].splitlines()],
                         [["PARAMETER"], ["gate_up_proj"], ["down_proj"]], out)
        self.assertEqual([ln.split() for ln in blocks[2].splitlines()],
                         [["MATERIALIZED", "RANK"], ["yes", "0"]], out)
        # a table none of whose columns is named is left out, with its blank line
        out = self.ok("build-info", bid, "-o", "node")
        self.assertEqual(out.split("\n\n")[1:], ["NODE\nctlb-node\n"], out)
        rc, out, err = ctl("build-info", bid, "-o", "rank,bogus")
        self.assertEqual(rc, 2, err)
        self.assertIn("unknown column 'bogus' (columns: PARAMETER, SHAPE, DTYPE, PLACEMENTS, VIEW, "
                      "RANK, NODE, DEVICE, BYTES, SLICES, MATERIALIZED)", err)
        out = self.ok("shard", bid, "0", "-o", "parameter,length", "--noheadings")
        self.assertEqual([ln.split()[0] for ln in out.split("\n\n")[1].splitlines()],
                         ["gate_up_proj", "down_proj"], out)

    def test_help(self):
        for verb in ("build", "builds", "build-info", "release", "shard"):
            out = self.ok(verb, "--help")
            self.assertTrue(out.startswith("Usage: familyctl %s" % verb), out)
        top = self.ok("--help")
        for verb in ("build FAMILY", "builds", "build-info ID", "release ID", "shard ID RANK"):
            self.assertIn(verb, top)


# 64 experts, 1024 wide, 512 intermediate: 384 MiB of float32, a fill of a second or more.
BIG_KV = ["hidden_size=1024", "moe_intermediate_size=512", "num_experts=64",
          "initializer_range=0.02"]


def ctl_on_terminal(*args, timeout=300):
    """familyctl with stderr on a pseudo-terminal: (status, stdout, what the terminal got)."""
    return H.run_on_terminal([CTL, "--socket", D.socket] + list(args), timeout=timeout)


class TestProgressBar(unittest.TestCase):
    def release(self, out):
        for line in out.splitlines():
            if line.startswith("build id "):
                ctl("release", line.split()[-1], "--force")

    def test_bar_on_a_terminal(self):
        rc, out, term = ctl_on_terminal("build", "grouped_experts", *BIG_KV, "--materialize",
                                        "--seed", "11", "--private")
        self.addCleanup(self.release, out)
        self.assertEqual(rc, 0, term)
        self.assertIn("filling [", term)
        self.assertRegex(term, r"\d+%  [\d.]+ \w*B of 384\.0 MiB  [\d.]+ \w*B/s")
        # The bar's line is cleared before the answer; the answer itself is unchanged.
        self.assertTrue(term.endswith("\r\x1b[K"), repr(term[-80:]))
        self.assertIn("materialized", out)
        self.assertNotIn("filling", out)

    def test_no_bar_without_a_terminal_or_with_json(self):
        rc, out, err = ctl("build", "grouped_experts", *BIG_KV, "--materialize", "--seed", "12",
                           "--private", timeout=300)
        self.addCleanup(self.release, out)
        self.assertEqual((rc, err), (0, ""))
        rc, out, term = ctl_on_terminal("--json", "build", "grouped_experts", *BIG_KV,
                                        "--materialize", "--seed", "13", "--private")
        self.assertEqual((rc, term), (0, ""))
        doc = json.loads(out)
        ctl("release", doc["build"]["buildId"], "--force")


if __name__ == "__main__":
    unittest.main(verbosity=2)
