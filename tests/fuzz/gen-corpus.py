#!/usr/bin/python3
"""Regenerates the protobuf seeds of corpus/request and corpus/wire from the conformance cases.

Run with /usr/bin/python3 (Debian's python3-protobuf) from anywhere:
    tests/fuzz/gen-corpus.py [build/proto/familyd.binpb]
"""
import json, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
fds = descriptor_pb2.FileDescriptorSet.FromString(open(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, 'build', 'proto', 'familyd.binpb'), 'rb').read())
pool = descriptor_pool.DescriptorPool()
for fd in fds.file: pool.Add(fd)
def cls(n):
    return message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName(n))
RR = cls('familyd.v1.ResolveRequest'); BR = cls('familyd.v1.BuildRequest')
cases = json.load(open(os.path.join(ROOT, '..', 'shared', 'conformance', 'cases.json')))['cases']
res, bld = [], []
for c in cases:
    for s in c.get('steps', []):
        rpc = s.get('rpc', '')
        try:
            if rpc.endswith('/Resolve'):
                res.append(json_format.ParseDict(s['request'], RR()).SerializeToString(deterministic=True))
            elif rpc.endswith('/Build'):
                bld.append(json_format.ParseDict(s['request'], BR()).SerializeToString(deterministic=True))
        except Exception as e:
            print('skip', rpc, e, file=sys.stderr)
def uniq(xs):
    seen, out = set(), []
    for x in xs:
        if x not in seen: seen.add(x); out.append(x)
    return out
res, bld = uniq(res), uniq(bld)
# Hand-made: nested lists, a mesh id, all axes.
def nested(n):
    v = {'intValue': '7'}
    for _ in range(n): v = {'listValue': {'values': [v, {'stringValue': 'x'}]}}
    return v
extra = [
    {'family': 'attention', 'arguments': {'window': nested(3), 'rope_theta': {'doubleValue': 1e308}},
     'context': {'tpSize': 2, 'cpSize': 4, 'epSize': 1, 'ppSize': 1, 'tp': True, 'cp': True, 'meshId': 'm-unknown', 'sequenceParallel': True}},
    {'family': 'grouped_experts', 'arguments': {'use_mxfp8': {'boolValue': True}, 'use_fused_mxfp8': {'boolValue': True}},
     'context': {'epSize': 2, 'ep': True, 'lossParallel': True}},
    {'family': 'grouped_experts', 'arguments': {'activation': nested(14)}},
]
for e in extra:
    res.append(json_format.ParseDict(e, RR()).SerializeToString(deterministic=True))
builds = [
    {'family': 'norm', 'config': {'fields': {'hidden_size': {'intValue': '16'}}}, 'moduleFqn': 'model.norm',
     'context': {'tpSize': 2, 'tp': True}, 'materialize': {'enabled': True, 'dtype': 'float32', 'seed': '1', 'ranks': ['0', '1']}},
    {'family': 'grouped_experts', 'arguments': {'activation': nested(2)},
     'config': {'fields': {'num_experts': {'intValue': '4'}, 'hidden_size': {'intValue': '8'},
                           'moe_intermediate_size': {'intValue': '8'}, 'initializer_range': {'doubleValue': 0.02}}},
     'module': {'fqn': 'layers.0.moe'}, 'meshId': 'm1'},
    {'family': 'attention', 'config': {'fields': {'x': nested(6)}}},
]
for b in builds:
    bld.append(json_format.ParseDict(b, BR()).SerializeToString(deterministic=True))
def write(d, prefix, xs, cap):
    os.makedirs(d, exist_ok=True)
    # spread picks over the list
    step = max(1, len(xs) // cap)
    for i, x in enumerate(xs[::step][:cap]):
        open(os.path.join(d, '%s-%02d.bin' % (prefix, i)), 'wb').write(x)
write(os.path.join(HERE, 'corpus/request'), 'resolve', res[:-3], 14)
for i, x in enumerate(res[-3:]):
    open(os.path.join(HERE, 'corpus/request/resolve-extra-%d.bin' % i), 'wb').write(x)
write(os.path.join(HERE, 'corpus/wire'), 'resolve', res, 8)
write(os.path.join(HERE, 'corpus/wire'), 'build', bld, 8)
# Broken wire: truncated, bad wire type, huge length.
open(os.path.join(HERE, 'corpus/wire/broken-truncated.bin'), 'wb').write(res[-1][:len(res[-1])//2])
open(os.path.join(HERE, 'corpus/wire/broken-wiretype.bin'), 'wb').write(b'\x0b\x12\x05abc')
open(os.path.join(HERE, 'corpus/wire/broken-length.bin'), 'wb').write(b'\x12\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x0a\x01a')
