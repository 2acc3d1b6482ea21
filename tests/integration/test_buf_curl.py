#!/usr/bin/python3
"""buf curl against familyd with server reflection only: no proto files at hand.

buf is $BUF or <source root>/node_modules/.bin/buf (npm install --no-save @bufbuild/buf).
Missing buf skips the test on a developer machine and fails it when CI is set.
"""

import base64
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

BUF = H.buf_bin()
REGISTRY = os.path.join(H.CONFORMANCE, "registry")
URL = "http://localhost"
D = None


def setUpModule():
    global D
    D = H.Daemon(registry=REGISTRY, host_devices=8)
    D.start()


def tearDownModule():
    try:
        D.stop()
    finally:
        D.cleanup()


def buf_curl(*args, data=None, timeout=60):
    argv = [BUF, "curl", "--protocol", "grpc", "--unix-socket", D.socket, "--timeout", "30s"]
    if data is not None:
        argv += ["-d", data if isinstance(data, str) else json.dumps(data)]
    argv += list(args)
    env = dict(os.environ, BUF_CACHE_DIR=os.path.join(D.tmpdir, "buf-cache"),
               HOME=os.environ.get("HOME") or D.tmpdir)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


SERVICES = ["familyd.v1.FamilyService", "familyd.v1.MeshService", "familyd.v1.AdminService",
            "grpc.health.v1.Health"]


class TestBufCurl(unittest.TestCase):
    def check_services(self, *extra):
        rc, out, err = buf_curl("--list-services", *extra, URL)
        self.assertEqual(rc, 0, err)
        listed = set(out.split())
        for s in SERVICES:
            self.assertIn(s, listed, "list-services:\n" + out)
        return listed

    def test_list_services(self):
        self.check_services()

    def test_list_services_v1alpha(self):
        self.check_services("--reflect-protocol", "grpc-v1alpha")

    def test_list_methods(self):
        rc, out, err = buf_curl("--list-methods", URL)
        self.assertEqual(rc, 0, err)
        methods = set(out.split())
        for m in ("familyd.v1.FamilyService/Resolve", "familyd.v1.FamilyService/ListFamilies",
                  "familyd.v1.MeshService/CreateMesh", "familyd.v1.AdminService/Reload",
                  "grpc.health.v1.Health/Check"):
            self.assertIn(m, methods, "list-methods:\n" + out)

    def resolve_ok(self, *extra):
        rc, out, err = buf_curl(*extra, URL + "/familyd.v1.FamilyService/Resolve",
                                data={"family": "grouped_experts", "context": {"epSize": "4"},
                                      "arguments": {"activation": {"stringValue": "gelu"}}})
        self.assertEqual(rc, 0, err)
        r = json.loads(out)["resolved"]
        self.assertEqual(r["variant"], "grouped_ep")
        self.assertEqual(r["constructor"],
                         "hyper_parallel.components.modules.grouped_experts.EPGroupedExperts")
        self.assertEqual(int(r["axisSizes"]["ep"]), 4)
        self.assertEqual(r["arguments"], {"activation": {"stringValue": "gelu"}})
        return r

    def test_resolve(self):
        self.resolve_ok()

    def test_resolve_v1alpha(self):
        self.resolve_ok("--reflect-protocol", "grpc-v1alpha")

    def test_resolve_emit_defaults(self):
        r = self.resolve_ok("--emit-defaults")
        self.assertEqual({k: int(v) for k, v in r["axisSizes"].items()},
                         {"tp": 1, "cp": 1, "ep": 4, "pp": 1})
        self.assertEqual(r["selectors"]["use_mxfp8"], {"boolValue": False})

    def test_health_check(self):
        rc, out, err = buf_curl(URL + "/grpc.health.v1.Health/Check", data={})
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out).get("status"), "SERVING")

    def test_status_and_topology(self):
        rc, out, err = buf_curl(URL + "/familyd.v1.AdminService/GetStatus", data={})
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["families"], 5)
        rc, out, err = buf_curl(URL + "/familyd.v1.MeshService/GetTopology", data={})
        self.assertEqual(rc, 0, err)
        self.assertEqual(int(json.loads(out)["worldSize"]), 8)

    def test_error_exit_code_and_details(self):
        rc, out, err = buf_curl(URL + "/familyd.v1.FamilyService/Resolve", data={"family": "nope"})
        self.assertEqual(rc, 5 * 8, "exit status must be NOT_FOUND(5) * 8\n" + err)
        self.assertIn("family name 'nope' must identify exactly one registration", err)
        # buf prints the status as JSON on stderr; ErrorInfo is decoded through reflection
        start = err.find("{")
        self.assertGreaterEqual(start, 0, err)
        status = json.loads(err[start:])
        self.assertEqual(status["code"], "not_found")
        self.assertEqual(status["message"],
                         "family name 'nope' must identify exactly one registration")
        details = status.get("details") or []
        self.assertEqual(len(details), 1, err)
        self.assertEqual(details[0].get("type"), "google.rpc.ErrorInfo", err)
        # buf prints "debug" only for types linked into buf itself (connect-go decodes details
        # with the global registry, not reflection), so decode "value" here.
        info = H.Protos().cls("google.rpc.ErrorInfo").FromString(
            base64.b64decode(details[0]["value"].replace("-", "+").replace("_", "/")
                             + "=" * (-len(details[0]["value"]) % 4)))
        self.assertEqual((info.reason, info.domain), ("UNKNOWN_FAMILY", "familyd"))
        debug = details[0].get("debug")
        if debug is not None:
            self.assertEqual(debug.get("reason"), "UNKNOWN_FAMILY")

    def test_error_invalid_argument(self):
        rc, out, err = buf_curl(URL + "/familyd.v1.FamilyService/Resolve",
                                data={"family": "grouped_experts",
                                      "arguments": {"use_mxfp8": {"intValue": "1"}}})
        self.assertEqual(rc, 3 * 8, err)
        self.assertIn("selector 'use_mxfp8' must be bool", err)

    def test_mesh_roundtrip(self):
        rc, out, err = buf_curl(URL + "/familyd.v1.MeshService/CreateMesh",
                                data={"mesh": {"deviceMesh": [{"name": "dp", "size": "2"},
                                                              {"name": "tp", "size": "4"}]}})
        self.assertEqual(rc, 0, err)
        mesh_id = json.loads(out)["meshId"]
        rc, out, err = buf_curl(URL + "/familyd.v1.MeshService/GetMesh", data={"meshId": mesh_id})
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["meshId"], mesh_id)

    def test_descriptor_set_schema_without_reflection(self):
        # build/proto/familyd.binpb is usable as --schema too
        rc, out, err = buf_curl("--schema", H.descriptor_set_path(), "--reflect=false",
                                URL + "/familyd.v1.FamilyService/Resolve",
                                data={"family": "grouped_experts"})
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["resolved"]["variant"], "grouped")


if __name__ == "__main__":
    unittest.main(verbosity=2)
