#!/usr/bin/python3
"""The API reference reaches clients: the comments of proto/familyd/v1/*.proto travel in the
descriptor set the daemon's server reflection serves (and in familyd.binpb), so `grpcurl
describe` and every reflection client show them.

- Reflection (v1 and v1alpha, a raw stream call with message classes from familyd.binpb)
  answers familyd/v1/family.proto with its source info: the leading comments of FamilyService
  and FamilyService.Resolve are the text of the .proto source, read from it here.
- Every service, method, message, field, oneof, enum and enum value of the project's own protos
  (package familyd.v1, google/rpc/status.proto, grpc/health and grpc/reflection) has a
  non-empty leading comment, in what reflection serves and in familyd.binpb; a failure names each one that lacks it.
- What reflection serves equals familyd.binpb, and the set stays small.
- Every file the protos name (docs/*.md, other protos) is in the repository.
"""

import glob
import os
import re
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from google.protobuf import descriptor_pb2  # noqa: E402

PROTO_ROOT = os.path.join(H.SOURCE_ROOT, "proto")
# The project's own protos, by their names in the descriptor set.
OWN_FILES = sorted(["google/rpc/status.proto", "grpc/health/v1/health.proto",
                    "grpc/reflection/v1/reflection.proto",
                    "grpc/reflection/v1alpha/reflection.proto"] +
                   [os.path.relpath(p, PROTO_ROOT)
                    for p in glob.glob(os.path.join(PROTO_ROOT, "familyd", "v1", "*.proto"))])
REFLECTION_VERSIONS = ("v1", "v1alpha")

# FileDescriptorProto and nested descriptor field numbers, as SourceCodeInfo paths use them.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 4, 5, 6
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM, MESSAGE_ONEOF = 2, 3, 4, 8
ENUM_VALUE = 2
SERVICE_METHOD = 2

D = None
P = None
REGISTRY = None


def setUpModule():
    global D, P, REGISTRY
    P = H.Protos()
    REGISTRY = tempfile.mkdtemp(prefix="fd-apiref-")   # an empty registry is a valid one
    D = H.Daemon(registry=REGISTRY, host_devices=1, protos=P)
    D.start()


def tearDownModule():
    try:
        if D is not None:
            try:
                D.stop()
            finally:
                D.cleanup()
    finally:
        if REGISTRY:
            shutil.rmtree(REGISTRY, ignore_errors=True)


def descriptor_set():
    with open(H.descriptor_set_path(), "rb") as f:
        return {fd.name: fd for fd in descriptor_pb2.FileDescriptorSet.FromString(f.read()).file}


def reflect(version, **request):
    """One ServerReflectionInfo exchange: the FileDescriptorProtos answered, by name."""
    pkg = "grpc.reflection.%s" % version
    req_cls = P.cls(pkg + ".ServerReflectionRequest")
    resp_cls = P.cls(pkg + ".ServerReflectionResponse")
    fn = D.client.channel.stream_stream("/%s.ServerReflection/ServerReflectionInfo" % pkg,
                                        request_serializer=req_cls.SerializeToString,
                                        response_deserializer=resp_cls.FromString)
    replies = list(fn(iter([req_cls(host="localhost", **request)]), timeout=H.CALL_TIMEOUT))
    assert len(replies) == 1, "expected one reply, got %d" % len(replies)
    reply = replies[0]
    kind = reply.WhichOneof("message_response")
    assert kind == "file_descriptor_response", \
        "%s: %s answered %s: %s" % (version, request, kind, reply.error_response)
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in reply.file_descriptor_response.file_descriptor_proto]
    return {fd.name: fd for fd in files}, [fd.name for fd in files]


def source_comment(path, keyword, name):
    """The leading comment of `keyword name` in a .proto file, as protoc records it: the `//`
    lines right above the declaration, each without its `//`, each ending in a newline."""
    with open(os.path.join(PROTO_ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    decl = re.compile(r"^\s*%s\s+%s\b" % (re.escape(keyword), re.escape(name)))
    for i, line in enumerate(lines):
        if decl.match(line):
            block = []
            j = i - 1
            while j >= 0 and lines[j].lstrip().startswith("//"):
                block.insert(0, lines[j].lstrip()[2:] + "\n")
                j -= 1
            return "".join(block)
    raise AssertionError("%s: no `%s %s`" % (path, keyword, name))


def leading_comments(fd):
    return {tuple(loc.path): loc.leading_comments for loc in fd.source_code_info.location}


def missing_comments(fd):
    """Every element of fd whose leading comment is missing or blank, named."""
    comments = leading_comments(fd)
    missing = []

    def need(path, what):
        if not comments.get(tuple(path), "").strip():
            missing.append("%s: %s" % (fd.name, what))

    def enum(path, e, full):
        need(path, "enum " + full)
        for j, v in enumerate(e.value):
            need(path + [ENUM_VALUE, j], "enum value %s.%s" % (full, v.name))

    def message(path, m, full):
        if m.options.map_entry:    # map<K, V>: the entry message is made up by protoc
            return
        need(path, "message " + full)
        for j, f in enumerate(m.field):
            need(path + [MESSAGE_FIELD, j], "field %s.%s" % (full, f.name))
        synthetic = {f.oneof_index for f in m.field
                     if f.HasField("oneof_index") and f.proto3_optional}
        for j, o in enumerate(m.oneof_decl):
            if j not in synthetic:   # proto3 `optional` makes a oneof of its own
                need(path + [MESSAGE_ONEOF, j], "oneof %s.%s" % (full, o.name))
        for j, n in enumerate(m.nested_type):
            message(path + [MESSAGE_NESTED, j], n, "%s.%s" % (full, n.name))
        for j, e in enumerate(m.enum_type):
            enum(path + [MESSAGE_ENUM, j], e, "%s.%s" % (full, e.name))

    for i, s in enumerate(fd.service):
        full = "%s.%s" % (fd.package, s.name)
        need([FILE_SERVICE, i], "service " + full)
        for j, m in enumerate(s.method):
            need([FILE_SERVICE, i, SERVICE_METHOD, j], "rpc %s.%s" % (full, m.name))
    for i, m in enumerate(fd.message_type):
        message([FILE_MESSAGE, i], m, "%s.%s" % (fd.package, m.name))
    for i, e in enumerate(fd.enum_type):
        enum([FILE_ENUM, i], e, "%s.%s" % (fd.package, e.name))
    return missing


class TestReflectionCarriesComments(unittest.TestCase):
    """grpcurl describe familyd.v1.FamilyService shows what the .proto says."""

    def test_service_and_method_comments(self):
        want_service = source_comment("familyd/v1/family.proto", "service", "FamilyService")
        want_resolve = source_comment("familyd/v1/family.proto", "rpc", "Resolve")
        self.assertTrue(want_service.strip(), "family.proto: FamilyService has no comment")
        self.assertTrue(want_resolve.strip(), "family.proto: Resolve has no comment")
        for version in REFLECTION_VERSIONS:
            with self.subTest(version=version):
                files, order = reflect(version, file_containing_symbol="familyd.v1.FamilyService")
                self.assertEqual(order[0], "familyd/v1/family.proto")
                fd = files["familyd/v1/family.proto"]
                self.assertTrue(fd.HasField("source_code_info"),
                                "reflection serves family.proto without source info")
                i = [s.name for s in fd.service].index("FamilyService")
                j = [m.name for m in fd.service[i].method].index("Resolve")
                comments = leading_comments(fd)
                self.assertEqual(comments.get((FILE_SERVICE, i)), want_service)
                self.assertEqual(comments.get((FILE_SERVICE, i, SERVICE_METHOD, j)),
                                 want_resolve)

    def test_reflection_serves_the_descriptor_set(self):
        """The embedded set and familyd.binpb are one set: same descriptors, same comments."""
        on_disk = descriptor_set()
        for name in OWN_FILES:
            with self.subTest(file=name):
                files, _ = reflect("v1", file_by_filename=name)
                self.assertIn(name, on_disk, "familyd.binpb lacks %s" % name)
                self.assertEqual(files[name], on_disk[name],
                                 "%s: reflection and familyd.binpb differ" % name)

    def test_set_size(self):
        """Comments cost bytes in the daemon (the set is embedded) and in every reflection
        answer: about 90 KiB in all today; a set past this bound is a mistake."""
        size = os.path.getsize(H.descriptor_set_path())
        self.assertLess(size, 256 * 1024, "%s: %d bytes" % (H.descriptor_set_path(), size))


class TestEveryElementIsDocumented(unittest.TestCase):
    def check(self, files, where):
        missing = []
        for name in OWN_FILES:
            self.assertIn(name, files, "%s lacks %s" % (where, name))
            missing += missing_comments(files[name])
        self.assertEqual(missing, [], "%s: %d elements without a leading comment:\n  %s"
                         % (where, len(missing), "\n  ".join(missing)))

    def test_own_files_known(self):
        """The check covers every proto of familyd.v1 (a vacuous pass is a failure)."""
        self.assertGreaterEqual(len(OWN_FILES), 7, OWN_FILES)
        for f in ("familyd/v1/family.proto", "familyd/v1/mesh.proto", "familyd/v1/admin.proto",
                  "familyd/v1/values.proto", "familyd/v1/shard.proto", "familyd/v1/peer.proto"):
            self.assertIn(f, OWN_FILES)

    def test_reflection(self):
        files = {}
        for name in OWN_FILES:
            got, _ = reflect("v1", file_by_filename=name)
            files[name] = got[name]
        self.check(files, "server reflection")

    def test_descriptor_set_file(self):
        self.check(descriptor_set(), H.descriptor_set_path())


class TestProtosStandAlone(unittest.TestCase):
    """The reference points at the repository's own files only: every document or proto file
    the comments name exists (from the repository's root, or beside the proto)."""

    NAMED_FILE = re.compile(r"(?<![\w*])\w[\w./-]*\.(?:md|proto)\b")

    def test_named_files_exist(self):
        for name in OWN_FILES:
            with open(os.path.join(PROTO_ROOT, name), encoding="utf-8") as f:
                text = "\n".join(line.split("//", 1)[1] for line in f if "//" in line)
            here = os.path.dirname(os.path.join(PROTO_ROOT, name))
            for ref in sorted(set(self.NAMED_FILE.findall(text))):
                with self.subTest(file=name, names=ref):
                    self.assertTrue(any(os.path.isfile(os.path.join(d, ref))
                                        for d in (H.SOURCE_ROOT, PROTO_ROOT, here)),
                                    "%s names %s, which is not in the repository" % (name, ref))


if __name__ == "__main__":
    unittest.main(verbosity=2)
