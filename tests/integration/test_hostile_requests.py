#!/usr/bin/python3
"""familyd against hostile request bytes: deep nesting, a flood of tiny values, garbage.

protobuf-c's unpack recurses once per nested message and allocates one struct per message; the
daemon checks the wire bytes first (daemon/codec/codec-wire.c: at most 32 levels of messages and
65536 of them) and answers INVALID_ARGUMENT. The bytes are built by hand: Python's protobuf
refuses to serialize (or parse) messages this deep. One daemon (conformance registry) serves the
module; tearDownModule stops it with SIGTERM and asserts exit status 0.
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
GE = "grouped_experts"
RESOLVE = "/familyd.v1.FamilyService/Resolve"
PROMPT = 5.0   # seconds: a refusal that takes longer counts as a failure

# What the refusals say (daemon/rpc/call.c); checked by their stable words.
DEEPER = "deeper than"
MORE = "more than"

D = None
P = None


def setUpModule():
    global D, P
    P = H.Protos()
    D = H.Daemon(registry=REGISTRY, host_devices=8, protos=P)
    D.start()


def tearDownModule():
    try:
        D.stop()
    finally:
        D.cleanup()


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(tag, payload):
    """A length-delimited field: tag byte, length, payload."""
    return bytes([tag]) + varint(len(payload)) + payload


def deep_value(levels, inner=b"\x08\x01"):
    """Value{bool_value: true} wrapped levels times in Value{list_value: ValueList{values: [v]}}.

    Its innermost Value lies at message depth 2 + 2 * levels of a ResolveRequest (the arguments
    entry is 1, the argument's Value 2). Built bottom-up with a list of pieces, no recursion.
    """
    # Lengths of every level, innermost first, then one join: O(total size).
    heads = []
    size = len(inner)
    for _ in range(levels):
        list_head = b"\x0a" + varint(size)           # ValueList.values
        size += len(list_head)
        value_head = b"\x2a" + varint(size)          # Value.list_value
        size += len(value_head)
        heads.append(value_head + list_head)
    heads.reverse()
    return b"".join(heads) + inner


def resolve_request(value, family=GE, key=b"activation"):
    entry = field(0x0a, key) + field(0x12, value)    # ArgumentsEntry{key, value}
    return field(0x0a, family.encode()) + field(0x12, entry)


class Base(unittest.TestCase):
    def send(self, payload):
        res = D.client.raw_call(RESOLVE, payload, timeout=PROMPT + 5)
        self.assertTrue(D.alive(), "familyd died on a %d-byte request:\n%s"
                        % (len(payload), D.output()[-4000:]))
        return res

    def assertRefused(self, res, words):
        self.assertEqual(res.code, "INVALID_ARGUMENT", "%r" % res)
        self.assertIn(words, res.message)
        self.assertLess(res.elapsed, PROMPT, "%r" % res)
        st, infos = D.client.error_details(res)
        self.assertIsNotNone(st, "no grpc-status-details-bin trailer on %r" % res)
        self.assertEqual(st.message, res.message)
        self.assertEqual([i.domain for i in infos], ["familyd"])

    def assertServing(self):
        health = D.client.health("")
        self.assertEqual(health.code, "OK", "%r" % health)
        self.assertEqual(health.reply.status, 1)   # SERVING
        req = P.cls("familyd.v1.ResolveRequest")(family=GE)
        req.arguments["activation"].CopyFrom(P.value("gelu"))
        req.context.ep_size = 4
        res = D.client.call("familyd.v1.FamilyService/Resolve", req)
        self.assertEqual(res.code, "OK", "%r" % res)
        self.assertEqual(res.reply.resolved.variant, "grouped_ep")


class TestDeepNesting(Base):
    def test_6000_levels(self):
        req = resolve_request(deep_value(6000))
        self.assertLess(len(req), 64 * 1024)
        res = self.send(req)
        self.assertRefused(res, DEEPER)
        self.assertIn("request", res.message)
        self.assertServing()

    def test_100000_levels(self):
        req = resolve_request(deep_value(100000))
        self.assertLess(len(req), 4 * 1024 * 1024)   # under the transport's cap
        res = self.send(req)
        self.assertRefused(res, DEEPER)
        self.assertServing()

    def test_boundary(self):
        # 15 levels: innermost Value at depth 32, within the wire limit; the value decoder may
        # still refuse it by its own (smaller) limit, but not as a wire-limit refusal.
        res = self.send(resolve_request(deep_value(15)))
        self.assertNotIn("messages " + DEEPER, res.message, "%r" % res)
        # 16 levels: depth 34.
        res = self.send(resolve_request(deep_value(16)))
        self.assertRefused(res, DEEPER)
        self.assertServing()

    def test_repeated(self):
        req = resolve_request(deep_value(6000))
        for _ in range(20):
            self.assertRefused(self.send(req), DEEPER)
        self.assertServing()

    def test_deep_behind_unknown_fields_and_field_zero(self):
        # Unknown fields and a non-minimal field 0 (which protobuf-c accepts) before the argument:
        # the scan must not stop at them.
        prefix = (b"\xa0\x06\x01"            # field 100, varint
                  + b"\x9a\x06\x02ab"        # field 99, length-delimited
                  + b"\x80\x00\x05")         # field 0 (two-byte tag), varint
        res = self.send(prefix + resolve_request(deep_value(6000)))
        self.assertRefused(res, DEEPER)
        self.assertServing()


class TestManyMessages(Base):
    def test_500k_values(self):
        # Value{int_value: 20000} is 6 bytes in the list: 3,000,000 bytes of values.
        tiny = b"\x0a\x04\x10\xa0\x9c\x01"
        values = tiny * 500000
        arg = field(0x2a, values)                    # Value{list_value: ValueList{values}}
        req = resolve_request(arg, key=b"xs")
        self.assertGreater(len(req), 3000000)
        self.assertLess(len(req), 4 * 1024 * 1024)
        t0 = time.monotonic()
        res = self.send(req)
        self.assertRefused(res, MORE)
        self.assertIn("request", res.message)
        self.assertLess(time.monotonic() - t0, PROMPT)
        self.assertServing()

    def test_many_map_entries(self):
        # 140,000 empty arguments entries: 140,000 messages at depth 1, over the wire limit.
        req = field(0x0a, GE.encode()) + b"\x12\x00" * 140000
        res = self.send(req)
        self.assertRefused(res, MORE)
        self.assertServing()


class TestGarbage(Base):
    def test_undecodable(self):
        garbage = [
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",      # overlong varint tag
            b"\x0a\xff\xff\xff\x0f" + b"x" * 8,                    # length beyond the buffer
            b"\x0f",                                                # field 1, wire type 7
            b"\x13\x14",                                            # a group
            b"\x1a\x03\x0a\x01",                                    # truncated nested message
            b"\x12\x02\x0b\x00",                                    # bad wire type inside an entry
            # 10 levels (within the limit) whose innermost Value ends in a truncated varint.
            resolve_request(deep_value(10, inner=b"\x10\xff")),
            bytes(range(256)) * 16,
        ]
        for g in garbage:
            res = self.send(g)
            self.assertEqual(res.code, "INVALID_ARGUMENT", "%r: %r" % (g[:16], res))
            self.assertLess(res.elapsed, PROMPT)
        self.assertServing()

    def test_garbage_after_deep(self):
        # Deep first, garbage later: refused either way, the daemon runs on.
        res = self.send(resolve_request(deep_value(6000)) + b"\x0f\xff\xff")
        self.assertEqual(res.code, "INVALID_ARGUMENT", "%r" % res)
        self.assertServing()


if __name__ == "__main__":
    unittest.main(verbosity=2)
