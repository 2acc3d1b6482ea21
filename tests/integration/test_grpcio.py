#!/usr/bin/python3
"""familyd over Python grpcio: every service, error details, robustness against bad calls.

One daemon (conformance registry, --host-devices 8, --node-name itest-node) serves the module;
tearDownModule stops it with SIGTERM and asserts exit status 0.
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from google.protobuf import descriptor_pb2  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
NODE = "itest-node"
GE = "grouped_experts"
GE_BASELINE = "hyper_parallel.components.modules.grouped_experts.GroupedExperts"
PROMPT = 2.0   # seconds: an answer that takes longer counts as a hang

D = None
P = None


def setUpModule():
    global D, P
    P = H.Protos()
    D = H.Daemon(registry=REGISTRY, host_devices=8, node_name=NODE, protos=P)
    D.start()


def tearDownModule():
    try:
        D.stop()
    finally:
        D.cleanup()


def call(rpc, request=None, **kw):
    return D.client.call(rpc, request, **kw)


class Base(unittest.TestCase):
    def assertCode(self, res, code, message=None):
        self.assertEqual(res.code, code, "%r" % res)
        if message is not None:
            self.assertEqual(res.message, message)

    def assertOk(self, res):
        self.assertEqual(res.code, "OK", "%r" % res)
        return res.reply

    def assertErrorInfo(self, res, reason, metadata_mentions=None):
        """grpc-status-details-bin: google.rpc.Status mirroring the status + one ErrorInfo."""
        st, infos = D.client.error_details(res)
        self.assertIsNotNone(st, "no grpc-status-details-bin trailer on %r" % res)
        import grpc
        self.assertEqual(st.code, getattr(grpc.StatusCode, res.code).value[0])
        self.assertEqual(st.message, res.message)
        self.assertEqual(len(infos), 1, "expected one google.rpc.ErrorInfo in %s" % st)
        self.assertEqual(infos[0].domain, "familyd")
        self.assertEqual(infos[0].reason, reason, "%r" % res)
        if metadata_mentions is not None:
            vals = " ".join(list(infos[0].metadata.values()) + list(infos[0].metadata.keys()))
            self.assertIn(metadata_mentions, vals,
                          "ErrorInfo metadata %s does not name %r" % (dict(infos[0].metadata),
                                                                      metadata_mentions))
        return infos[0]

    def resolve(self, family, args=None, **context):
        req = P.cls("familyd.v1.ResolveRequest")(family=family)
        for k, v in (args or {}).items():
            req.arguments[k].CopyFrom(P.value(v))
        for k, v in context.items():
            setattr(req.context, k, v)
        return call("familyd.v1.FamilyService/Resolve", req)


class TestHealth(Base):
    def test_check_serving(self):
        r = self.assertOk(D.client.health(""))
        self.assertEqual(r.status, 1)   # SERVING

    def test_check_unknown_service_not_found(self):
        # The standard health protocol: an unknown service name is NOT_FOUND.
        res = D.client.health("no.such.Service")
        self.assertCode(res, "NOT_FOUND")

    def test_watch_first_message_serving(self):
        res = D.client.stream_first("grpc.health.v1.Health/Watch", {"service": ""})
        self.assertOk(res)
        self.assertEqual(res.reply.status, 1)
        self.assertLess(res.elapsed, PROMPT)
        # A cancelled watch leaves the daemon serving.
        self.assertOk(D.client.health(""))


class TestFamilies(Base):
    def test_list_families_order_and_content(self):
        r = self.assertOk(call("familyd.v1.FamilyService/ListFamilies"))
        self.assertEqual([f.name for f in r.families],
                         ["grouped_experts", "attention", "norm", "norm", "engram"])
        self.assertEqual([f.baseline.rsplit(".", 1)[-1] for f in r.families],
                         ["GroupedExperts", "GQAAttention", "RMSNorm", "OffsetRMSNorm", "Engram"])
        ge = r.families[0]
        self.assertEqual(ge.baseline, GE_BASELINE)
        self.assertEqual(ge.default_variant, "grouped")
        self.assertEqual(ge.parallel_axis, "ep")
        self.assertEqual(r.families[4].default_variant, "")
        self.assertEqual(r.families[2].parallel_axis, "")
        # source is file:line of the family's mapping (line 3 of families.yaml)
        self.assertRegex(ge.source, r"families\.yaml:3(:\d+)?$")
        self.assertRegex(r.families[1].source, r"families\.yaml:\d+(:\d+)?$")
        self.assertNotEqual(r.families[1].source, ge.source)

        sel = {s.name: s for s in ge.selectors}
        self.assertEqual(set(sel), {"use_mxfp8", "use_fused_mxfp8"})
        self.assertEqual(sel["use_mxfp8"].type, "bool")
        self.assertEqual(getattr(sel["use_mxfp8"], "default").WhichOneof("kind"), "bool_value")
        self.assertIs(P.py(getattr(sel["use_mxfp8"], "default")), False)
        args = {a.name: a for a in ge.arguments}
        self.assertEqual(set(args), {"activation"})
        self.assertEqual(args["activation"].type, "string")
        self.assertEqual(P.py(getattr(args["activation"], "default")), "silu")

        var = {v.name: v for v in ge.variants}
        self.assertEqual(set(var), {"grouped", "grouped_ep", "mxfp8"})
        self.assertEqual(var["grouped_ep"].constructor,
                         "hyper_parallel.components.modules.grouped_experts.EPGroupedExperts")
        self.assertEqual(list(var["mxfp8"].accepts), ["config", "module", "module_fqn", "context"])
        req = {k: [P.py(x) for x in v.values] for k, v in var["mxfp8"].requires.items()}
        self.assertEqual(req, {"tp": [1], "cp": [1], "pp": [1], "ep": [1, 2]})
        self.assertEqual(dict(var["grouped"].requires), {})

        self.assertEqual(len(ge.rules), 4)
        r0, r1, r2, r3 = ge.rules
        self.assertEqual(r0.WhichOneof("outcome"), "error")
        self.assertEqual(r0.error, "use_fused_mxfp8 requires use_mxfp8=True")
        self.assertEqual({k: P.py(v) for k, v in r0.when.items()},
                         {"use_fused_mxfp8": True, "use_mxfp8": False})
        self.assertEqual(r1.WhichOneof("outcome"), "unsupported")
        self.assertEqual(r2.WhichOneof("outcome"), "variant")
        self.assertEqual(r2.variant, "mxfp8")
        self.assertEqual({k: P.py(v) for k, v in r3.when.items()}, {"parallel": True})
        self.assertEqual(r3.variant, "grouped_ep")

        params = {p.name: p for p in ge.parameters}
        self.assertEqual(list(params), ["gate_up_proj", "down_proj"])
        gu = params["gate_up_proj"]
        self.assertEqual(list(gu.shape[:2]), ["num_experts", "hidden_size"])
        self.assertEqual(gu.shape[2].replace(" ", ""), "2*moe_intermediate_size")
        self.assertEqual([(p.axis, p.kind, p.dim) for p in gu.placements], [("ep", "shard", 0)])
        self.assertIn("normal", gu.init)

    def test_get_family_by_name_and_baseline(self):
        by_name = self.assertOk(call("familyd.v1.FamilyService/GetFamily", family=GE))
        by_base = self.assertOk(call("familyd.v1.FamilyService/GetFamily", family=GE_BASELINE))
        self.assertEqual(by_name.baseline, GE_BASELINE)
        self.assertEqual(by_name, by_base)
        listed = self.assertOk(call("familyd.v1.FamilyService/ListFamilies")).families[0]
        self.assertEqual(by_name, listed)
        off = self.assertOk(call("familyd.v1.FamilyService/GetFamily",
                                 family="hyper_parallel.components.modules.norm.OffsetRMSNorm"))
        self.assertEqual((off.name, off.default_variant), ("norm", "offset"))

    def test_get_family_errors(self):
        res = call("familyd.v1.FamilyService/GetFamily", family="nope")
        self.assertCode(res, "NOT_FOUND", "family name 'nope' must identify exactly one registration")
        self.assertErrorInfo(res, "UNKNOWN_FAMILY")
        res = call("familyd.v1.FamilyService/GetFamily", family="norm")
        self.assertCode(res, "INVALID_ARGUMENT",
                        "family name 'norm' must identify exactly one registration")
        self.assertErrorInfo(res, "AMBIGUOUS_FAMILY")
        res = call("familyd.v1.FamilyService/GetFamily", family="")
        self.assertCode(res, "NOT_FOUND")


class TestResolve(Base):
    def test_default(self):
        r = self.assertOk(self.resolve(GE)).resolved
        self.assertEqual((r.family, r.variant), (GE, "grouped"))
        self.assertEqual(r.constructor,
                         "hyper_parallel.components.modules.grouped_experts.GroupedExpertsLocal")
        self.assertEqual({k: P.py(v) for k, v in r.selectors.items()},
                         {"use_mxfp8": False, "use_fused_mxfp8": False})
        self.assertEqual(dict(r.axis_sizes), {"tp": 1, "cp": 1, "ep": 1, "pp": 1})
        self.assertEqual(dict(r.arguments), {})   # declared defaults are not filled in

    def test_ep4_selects_grouped_ep_and_keeps_arguments(self):
        r = self.assertOk(self.resolve(GE, {"activation": "gelu"}, ep_size=4)).resolved
        self.assertEqual(r.variant, "grouped_ep")
        self.assertEqual(r.axis_sizes["ep"], 4)
        self.assertEqual({k: P.py(v) for k, v in r.arguments.items()}, {"activation": "gelu"})

    def test_selector_consumed(self):
        r = self.assertOk(self.resolve(GE, {"use_mxfp8": True, "activation": "silu"})).resolved
        self.assertEqual(r.variant, "mxfp8")
        self.assertNotIn("use_mxfp8", r.arguments)
        self.assertIs(P.py(r.selectors["use_mxfp8"]), True)

    def test_int_accepted_as_float(self):
        r = self.assertOk(self.resolve("attention", {"rope_theta": 500000, "window": 128})).resolved
        self.assertEqual(r.variant, "eager")
        self.assertEqual(P.py(r.arguments["rope_theta"]), 500000)   # kept unchanged
        self.assertEqual(P.py(r.arguments["window"]), 128)

    def test_errors_with_details(self):
        table = [
            # (family, args, context, code, message, reason, metadata mention)
            ("nope", {}, {}, "NOT_FOUND",
             "family name 'nope' must identify exactly one registration", "UNKNOWN_FAMILY", None),
            ("norm", {}, {}, "INVALID_ARGUMENT",
             "family name 'norm' must identify exactly one registration", "AMBIGUOUS_FAMILY", None),
            ("engram", {}, {}, "INVALID_ARGUMENT",
             "FamilyRequest requires a family with a concrete default_variant",
             "NO_DEFAULT_VARIANT", None),
            (GE, {"zeta": 1, "alpha": True}, {}, "INVALID_ARGUMENT",
             "grouped_experts: unknown arguments: ['alpha', 'zeta']", "UNKNOWN_ARGUMENTS", None),
            (GE, {"config": 1}, {}, "INVALID_ARGUMENT",
             "grouped_experts: unknown arguments: ['config']", "UNKNOWN_ARGUMENTS", None),
            (GE, {"use_mxfp8": 1}, {}, "INVALID_ARGUMENT",
             "selector 'use_mxfp8' must be bool", "ARGUMENT_TYPE", "use_mxfp8"),
            ("attention", {"window": 1.5}, {}, "INVALID_ARGUMENT",
             "argument 'window' must be int", "ARGUMENT_TYPE", "window"),
            (GE, {"use_fused_mxfp8": True}, {}, "INVALID_ARGUMENT",
             "use_fused_mxfp8 requires use_mxfp8=True", "RULE_ERROR", None),
            (GE, {"use_fused_mxfp8": True, "use_mxfp8": True}, {}, "UNIMPLEMENTED",
             "use_fused_mxfp8=True is not supported; use non-fused MXFP8", "RULE_UNSUPPORTED", None),
            (GE, {}, {"cp_size": 0}, "INVALID_ARGUMENT",
             "cp_size must be a positive integer", "AXIS_SIZE", "cp"),
            (GE, {}, {"ep": True}, "INVALID_ARGUMENT",
             "ep_size is required when ep is active", "AXIS_REQUIRED", "ep"),
            (GE, {"use_mxfp8": True}, {"tp_size": 2}, "FAILED_PRECONDITION",
             "variant 'mxfp8' requires tp=1; job has tp=2", "REQUIREMENT", "tp"),
            (GE, {"use_mxfp8": True}, {"ep_size": 4}, "FAILED_PRECONDITION",
             "variant 'mxfp8' requires ep in [1, 2]; job has ep=4", "REQUIREMENT", "ep"),
            (GE, {}, {"mesh_id": "no-such-mesh"}, "NOT_FOUND",
             "mesh 'no-such-mesh' not found", "MESH_NOT_FOUND", None),
        ]
        failures = []
        for fam, args, ctx, code, msg, reason, meta in table:
            res = self.resolve(fam, args, **ctx)
            try:
                self.assertCode(res, code, msg)
                self.assertErrorInfo(res, reason, meta)
            except AssertionError as e:
                failures.append("Resolve %s %s %s: %s" % (fam, args, ctx, e))
        self.assertEqual(failures, [], "\n".join(failures))

    def test_value_without_kind_matches_nothing(self):
        req = P.cls("familyd.v1.ResolveRequest")(family=GE)
        req.arguments["use_mxfp8"].SetInParent()   # a Value with no kind set
        res = call("familyd.v1.FamilyService/Resolve", req)
        self.assertCode(res, "INVALID_ARGUMENT", "selector 'use_mxfp8' must be bool")

    def test_context_mesh_disagree_details(self):
        mesh = self.assertOk(call("familyd.v1.MeshService/CreateMesh",
                                  {"mesh": {"deviceMesh": [{"name": "dp", "size": 2},
                                                           {"name": "tp", "size": 4}]}}))
        res = self.resolve(GE, mesh_id=mesh.mesh_id, tp_size=2)
        self.assertCode(res, "INVALID_ARGUMENT", "context and mesh disagree on tp_size")
        self.assertErrorInfo(res, "CONTEXT_MESH_DISAGREE", "tp")


class TestMeshes(Base):
    DEF = {"mesh": {"deviceMesh": [{"name": "dp", "size": 2}, {"name": "cp", "size": 2},
                                   {"name": "tp", "size": 2}],
                    "expertMesh": [{"name": "edp_shard", "size": 2}, {"name": "ep", "size": 4}]}}

    def test_lifecycle(self):
        m1 = self.assertOk(call("familyd.v1.MeshService/CreateMesh", self.DEF))
        self.assertTrue(m1.mesh_id)
        self.assertEqual(list(m1.ranks), list(range(8)))
        self.assertEqual([(d.name, d.size) for d in m1.device_mesh], [("dp", 2), ("cp", 2), ("tp", 2)])
        self.assertEqual([(d.name, d.size) for d in m1.expert_mesh], [("edp_shard", 2), ("ep", 4)])
        # content-derived id: the same definition twice gives the same id; a client id is ignored
        m2 = self.assertOk(call("familyd.v1.MeshService/CreateMesh", self.DEF))
        self.assertEqual(m2.mesh_id, m1.mesh_id)
        with_id = {"mesh": dict(self.DEF["mesh"], meshId="client-chosen")}
        m3 = self.assertOk(call("familyd.v1.MeshService/CreateMesh", with_id))
        self.assertEqual(m3.mesh_id, m1.mesh_id)
        # a different definition gets a different id
        other = self.assertOk(call("familyd.v1.MeshService/CreateMesh",
                                   {"mesh": {"deviceMesh": [{"name": "dp", "size": 8}]}}))
        self.assertNotEqual(other.mesh_id, m1.mesh_id)

        got = self.assertOk(call("familyd.v1.MeshService/GetMesh", mesh_id=m1.mesh_id))
        self.assertEqual(got, m1)
        ids = [m.mesh_id for m in self.assertOk(call("familyd.v1.MeshService/ListMeshes")).meshes]
        self.assertIn(m1.mesh_id, ids)
        self.assertIn(other.mesh_id, ids)
        self.assertEqual(len(ids), len(set(ids)), "ListMeshes lists a mesh twice: %s" % ids)
        st = self.assertOk(call("familyd.v1.AdminService/GetStatus"))
        self.assertEqual(st.meshes, len(ids))

        # the mesh drives Resolve: ep from the expert view, cp and tp from the device view
        r = self.assertOk(self.resolve(GE, mesh_id=m1.mesh_id)).resolved
        self.assertEqual((r.variant, dict(r.axis_sizes)),
                         ("grouped_ep", {"tp": 2, "cp": 2, "ep": 4, "pp": 1}))

        self.assertOk(call("familyd.v1.MeshService/DeleteMesh", mesh_id=m1.mesh_id))
        res = call("familyd.v1.MeshService/GetMesh", mesh_id=m1.mesh_id)
        self.assertCode(res, "NOT_FOUND", "mesh '%s' not found" % m1.mesh_id)
        self.assertErrorInfo(res, "MESH_NOT_FOUND")
        self.assertCode(call("familyd.v1.MeshService/DeleteMesh", mesh_id=m1.mesh_id), "NOT_FOUND",
                        "mesh '%s' not found" % m1.mesh_id)
        ids = [m.mesh_id for m in self.assertOk(call("familyd.v1.MeshService/ListMeshes")).meshes]
        self.assertNotIn(m1.mesh_id, ids)
        self.assertCode(self.resolve(GE, mesh_id=m1.mesh_id), "NOT_FOUND")
        # recreating it gives the same id again
        m4 = self.assertOk(call("familyd.v1.MeshService/CreateMesh", self.DEF))
        self.assertEqual(m4.mesh_id, m1.mesh_id)

    def test_concurrent_identical_creates(self):
        # racing CreateMesh calls of one definition all get one id, and it is listed once
        definition = {"mesh": {"deviceMesh": [{"name": "pp", "size": 2}, {"name": "dp", "size": 4}],
                               "ppSize": 2}}
        ids, errors = [], []

        def worker():
            c = H.Client(D.socket, P)
            try:
                for _ in range(5):
                    res = c.call("familyd.v1.MeshService/CreateMesh", definition)
                    (ids.append(res.reply.mesh_id) if res.ok else errors.append(repr(res)))
            finally:
                c.close()
        ts = [threading.Thread(target=worker) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(set(ids)), 1, set(ids))
        listed = [m.mesh_id for m in self.assertOk(call("familyd.v1.MeshService/ListMeshes")).meshes]
        self.assertEqual(listed.count(ids[0]), 1)
        self.assertOk(call("familyd.v1.MeshService/DeleteMesh", mesh_id=ids[0]))

    def test_invalid_mesh_details(self):
        res = call("familyd.v1.MeshService/CreateMesh",
                   {"mesh": {"deviceMesh": [{"name": "dp", "size": 3}]}})
        self.assertCode(res, "INVALID_ARGUMENT", "device_mesh size 3 does not match 8 ranks")
        self.assertErrorInfo(res, "MESH_INVALID")
        res = call("familyd.v1.MeshService/CreateMesh", {"mesh": {}})
        self.assertCode(res, "INVALID_ARGUMENT", "device_mesh must have at least one dimension")
        res = call("familyd.v1.MeshService/CreateMesh",
                   {"mesh": {"deviceMesh": [{"name": "tp", "size": 2}], "ranks": [3, 3]}})
        self.assertCode(res, "INVALID_ARGUMENT", "rank 3 appears twice")


class TestTopologyAndStatus(Base):
    def test_topology(self):
        t = self.assertOk(call("familyd.v1.MeshService/GetTopology"))
        self.assertEqual(t.world_size, 8)
        self.assertEqual(len(t.nodes), 1)
        n = t.nodes[0]
        self.assertEqual(n.name, NODE)
        self.assertEqual(t.local_node, NODE)
        self.assertTrue(n.local)
        self.assertEqual(n.state, "up")
        self.assertEqual(n.first_rank, 0)
        self.assertEqual(len(n.devices), 8)
        self.assertEqual([d.local_index for d in n.devices], list(range(8)))
        self.assertEqual({d.kind for d in n.devices}, {"host"})

    def test_status(self):
        s1 = self.assertOk(call("familyd.v1.AdminService/GetStatus"))
        self.assertTrue(s1.version)
        want = os.environ.get("FAMILYD_VERSION")
        if want:
            self.assertEqual(s1.version, want)
        self.assertEqual(os.path.realpath(s1.registry_path), os.path.realpath(REGISTRY))
        self.assertGreaterEqual(s1.registry_generation, 1)
        self.assertEqual(s1.families, 5)
        self.assertEqual(s1.node, NODE)
        time.sleep(0.05)
        s2 = self.assertOk(call("familyd.v1.AdminService/GetStatus"))
        self.assertGreater(s2.uptime_ms, s1.uptime_ms)
        self.assertEqual(s2.registry_generation, s1.registry_generation)


class TestRobustness(Base):
    def test_heavy_methods_answer_empty_requests_promptly(self):
        # Build, Validate, the build calls and WatchTopology, given empty requests, answer promptly:
        # a reply or an error (UNIMPLEMENTED only with a message), never a hang.
        hang = ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "UNKNOWN", "INTERNAL")
        failures = []
        for rpc in ("familyd.v1.FamilyService/Build", "familyd.v1.FamilyService/Validate",
                    "familyd.v1.FamilyService/GetBuild", "familyd.v1.FamilyService/ListBuilds",
                    "familyd.v1.FamilyService/ReleaseBuild", "familyd.v1.MeshService/WatchTopology"):
            _, _, _, streaming = P.method(rpc)
            if streaming:
                res = D.client.stream_first(rpc, timeout=PROMPT + 3)
            else:
                res = call(rpc, timeout=PROMPT + 3)
            if res.code in hang or res.elapsed > PROMPT:
                failures.append("%s: %s %r after %.2f s" % (rpc, res.code, res.message, res.elapsed))
            elif res.code == "UNIMPLEMENTED" and not res.message:
                failures.append("%s: UNIMPLEMENTED without a message" % rpc)
            elif rpc.endswith("WatchTopology") and res.code == "OK":
                if res.reply.world_size != 8:
                    failures.append("WatchTopology: first message has world size %d"
                                    % res.reply.world_size)
        self.assertEqual(failures, [], "\n".join(failures))
        self.assertOk(D.client.health(""))

    def test_unknown_methods_unimplemented_promptly(self):
        for path in ("/familyd.v1.FamilyService/NoSuchMethod", "/no.such.Service/Method",
                     "/grpc.health.v1.Health/Nope"):
            res = D.client.raw_call(path, b"", timeout=PROMPT + 3)
            self.assertEqual(res.code, "UNIMPLEMENTED", "%s: %r" % (path, res))
            self.assertLess(res.elapsed, PROMPT, path)

    def test_undecodable_requests_invalid_argument(self):
        garbage = [
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",      # overlong varint tag
            b"\x0a\xff\xff\xff\x0f" + b"x" * 8,                    # length beyond the buffer
            b"\x0f",                                                # field 1, wire type 7
            b"\x1a\x03\x0a\x01",                                    # truncated nested message
        ]
        failures = []
        for path in ("/familyd.v1.FamilyService/Resolve", "/familyd.v1.FamilyService/GetFamily",
                     "/familyd.v1.MeshService/CreateMesh", "/familyd.v1.AdminService/Reload",
                     "/grpc.health.v1.Health/Check"):
            for g in garbage:
                res = D.client.raw_call(path, g, timeout=PROMPT + 3)
                if res.code != "INVALID_ARGUMENT":
                    failures.append("%s %r: %r" % (path, g, res))
        self.assertEqual(failures, [], "\n".join(failures))
        self.assertTrue(D.alive())
        r = self.assertOk(self.resolve(GE, ep_size=4)).resolved
        self.assertEqual(r.variant, "grouped_ep")

    def test_concurrent_clients(self):
        errors = []

        def worker(i):
            c = H.Client(D.socket, P)
            try:
                for _ in range(25):
                    res = c.call("familyd.v1.FamilyService/Resolve",
                                 {"family": GE, "context": {"epSize": 4 if i % 2 else 1}})
                    want = "grouped_ep" if i % 2 else "grouped"
                    if not res.ok or res.reply.resolved.variant != want:
                        errors.append(repr(res))
            finally:
                c.close()
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf):
    """(field number, wire type, value) of a protobuf message; bytes for length-delimited."""
    i = 0
    while i < len(buf):
        key = 0
        shift = 0
        while True:
            b = buf[i]
            i += 1
            key |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        num, wt = key >> 3, key & 7
        if wt == 0:
            v = 0
            shift = 0
            while True:
                b = buf[i]
                i += 1
                v |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
        elif wt == 2:
            ln = 0
            shift = 0
            while True:
                b = buf[i]
                i += 1
                ln |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            v = buf[i:i + ln]
            i += ln
        else:
            raise ValueError("unexpected wire type %d" % wt)
        yield num, wt, v


class TestReflection(Base):
    """grpc.reflection v1 and v1alpha, spoken by hand (their protos are not in familyd.binpb):
    the error types must be resolvable so that clients can decode grpc-status-details-bin."""

    def reflect(self, version, field, value):
        path = "/grpc.reflection.%s.ServerReflection/ServerReflectionInfo" % version
        fn = D.client.channel.stream_stream(path, request_serializer=None,
                                            response_deserializer=None)
        payload = value.encode()
        req = bytes([(field << 3) | 2]) + _varint(len(payload)) + payload
        replies = list(fn(iter([req]), timeout=PROMPT + 3))
        self.assertEqual(len(replies), 1)
        files, error = [], None
        for num, _, v in _fields(replies[0]):
            if num == 4:   # file_descriptor_response
                files += [descriptor_pb2.FileDescriptorProto.FromString(fv)
                          for n2, _, fv in _fields(v) if n2 == 1]
            elif num == 7:  # error_response
                error = v
        return files, error

    def test_symbols_resolvable(self):
        for version in ("v1", "v1alpha"):
            for symbol, file_name in (("google.rpc.ErrorInfo", "google/rpc/status.proto"),
                                      ("google.rpc.Status", "google/rpc/status.proto"),
                                      ("familyd.v1.FamilyService", "familyd/v1/family.proto"),
                                      ("familyd.v1.Mesh", "familyd/v1/mesh.proto")):
                with self.subTest(version=version, symbol=symbol):
                    files, error = self.reflect(version, 4, symbol)   # file_containing_symbol
                    self.assertIsNone(error, "%s: error response" % symbol)
                    self.assertIn(file_name, [f.name for f in files])
            files, error = self.reflect(version, 4, "no.such.Symbol")
            self.assertEqual(files, [])
            self.assertIsNotNone(error, "unknown symbol must give an error_response")


class TestShutdownWithOpenStream(Base):
    """A second daemon: SIGTERM with a Health/Watch stream open still exits 0, promptly."""

    def test_stop_with_watch_open(self):
        with H.Daemon(registry=REGISTRY, protos=P) as d2:
            watcher = H.Client(d2.socket, P)   # its own channel: stop() closes d2.client
            self.addCleanup(watcher.close)
            it = watcher.stream("grpc.health.v1.Health/Watch", {"service": ""}, timeout=60)
            first = next(it)
            self.assertEqual(first.status, 1)
            t0 = time.monotonic()
            d2.stop()   # asserts exit 0
            self.assertLess(time.monotonic() - t0, 15)
            # the stream ends (NOT_SERVING then end, or an error), it does not hang
            try:
                for msg in it:
                    self.assertIn(msg.status, (1, 2))
            except Exception:
                pass


if __name__ == "__main__":
    unittest.main(verbosity=2)
