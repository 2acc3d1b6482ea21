#!/usr/bin/python3
"""Regenerates the seed corpora of tests/fuzz/corpus/ (all but registry/, YAML files, and peer/).

Run with /usr/bin/python3 (Debian's python3-protobuf), after a build has made the descriptor set:
    tests/fuzz/gen-corpus.py [BUILD/proto/familyd.binpb]

  request/       one byte naming the method (0 Resolve, 1 CreateMesh, 2 Build, 3 Validate,
                 4 GetFamily: the table of fuzz-request.c), then the request: the conformance
                 cases' Resolve and CreateMesh requests, Builds and Validates made here against
                 the state fuzz-request.c sets up (its meshes and builds, ids below)
  wire/          ResolveRequest and BuildRequest bytes, and broken wire
  expr/          every shape expression of deploy/registry and the conformance registry, and
                 edge cases; a NUL, then field values
  config/        familyd config files: every key, comments, and broken lines
  safetensors/   safetensors files (a length, a JSON header, data) as the format's writer lays
                 them out, every dtype, padding, metadata, and broken ones; indexes
  shard-socket/  byte streams for the shard socket: frames of ShardFdRequests naming the
                 placeholders of fuzz-shard-socket.c (32 x 'a'/'b' live, 'c' released), and bad
                 framing (4 GiB length, oversize, garbage, partial)
"""
import json, os, re, struct, sys
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFORMANCE = os.path.join(ROOT, 'tests', 'conformance')
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

default_binpb = os.path.join(ROOT, 'build', 'proto', 'familyd.binpb')
fds = descriptor_pb2.FileDescriptorSet.FromString(open(sys.argv[1] if len(sys.argv) > 1 else default_binpb, 'rb').read())
pool = descriptor_pool.DescriptorPool()
for fd in fds.file:
    pool.Add(fd)


def cls(n):
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(n))


def msg(name, d):
    return json_format.ParseDict(d, cls(name)()).SerializeToString(deterministic=True)


RR, CM, BR, VR, GF = ('familyd.v1.ResolveRequest', 'familyd.v1.CreateMeshRequest',
                      'familyd.v1.BuildRequest', 'familyd.v1.ValidateRequest',
                      'familyd.v1.GetFamilyRequest')
# What fuzz-request.c's setup makes (FUZZ_SETUP=1 prints them): mesh dp=2,tp=4; mesh dp=8 with
# the expert view edp_shard=2,ep=4; grouped_experts on the second, attention on the first.
MESH_TP, MESH_EP = 'mesh-def74d73aacb4d50', 'mesh-ea663655915f894d'
BUILD_GE, BUILD_ATT = 'bld-f022f022-1', 'bld-f022f022-2'


def uniq(xs):
    seen, out = set(), []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def write_dir(d, files):
    """files: {name: bytes}; the folder holds exactly these afterwards."""
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f not in files:
            os.unlink(os.path.join(d, f))
    for name, data in files.items():
        with open(os.path.join(d, name), 'wb') as f:
            f.write(data)


cases = json.load(open(os.path.join(CONFORMANCE, 'cases.json')))['cases']
res, meshes = [], []
for c in cases:
    for s in c.get('steps', []):
        rpc = s.get('rpc', '')
        if rpc.endswith('/Resolve'):
            res.append(msg(RR, s['request']))
        elif rpc.endswith('/CreateMesh'):
            meshes.append(msg(CM, s['request']))
res, meshes = uniq(res), uniq(meshes)


def nested(n):
    v = {'intValue': '7'}
    for _ in range(n):
        v = {'listValue': {'values': [v, {'stringValue': 'x'}]}}
    return v


res_extra = [msg(RR, e) for e in [
    {'family': 'attention', 'arguments': {'window': nested(3), 'rope_theta': {'doubleValue': 1e308}},
     'context': {'tpSize': 2, 'cpSize': 4, 'epSize': 1, 'ppSize': 1, 'tp': True, 'cp': True,
                 'meshId': 'm-unknown', 'sequenceParallel': True}},
    {'family': 'grouped_experts', 'arguments': {'use_mxfp8': {'boolValue': True}, 'use_fused_mxfp8': {'boolValue': True}},
     'context': {'epSize': 2, 'ep': True, 'lossParallel': True}},
    {'family': 'grouped_experts', 'arguments': {'activation': nested(14)}},
    {'family': 'grouped_experts', 'context': {'meshId': MESH_EP, 'ep': True}},
    {'family': 'attention', 'context': {'meshId': MESH_TP, 'tpSize': 2}},
]]

GE_CFG = {'fields': {'num_experts': {'intValue': '8'}, 'hidden_size': {'intValue': '16'},
                     'moe_intermediate_size': {'intValue': '8'},
                     'initializer_range': {'doubleValue': 0.02}}}
ATT_CFG = {'fields': {'num_attention_heads': {'intValue': '4'}, 'num_key_value_heads': {'intValue': '2'},
                      'head_dim': {'intValue': '8'}, 'hidden_size': {'intValue': '32'},
                      'initializer_range': {'doubleValue': 0.02}}}
builds = [msg(BR, b) for b in [
    {'family': 'hyper_parallel.components.modules.norm.RMSNorm', 'config': {'fields': {'hidden_size': {'intValue': '16'}}}, 'moduleFqn': 'model.norm',
     'context': {'tpSize': 2, 'tp': True}, 'materialize': {'enabled': True, 'dtype': 'float32', 'seed': '1', 'ranks': ['0', '1']}},
    {'family': 'hyper_parallel.components.modules.norm.OffsetRMSNorm',
     'config': {'fields': {'hidden_size': {'intValue': '64'}}},
     'materialize': {'enabled': True, 'dtype': 'bf16', 'seed': '18446744073709551615'}},
    {'family': 'grouped_experts', 'arguments': {'activation': nested(2)}, 'config': GE_CFG,
     'module': {'fqn': 'layers.0.moe'}, 'meshId': 'm1'},
    {'family': 'grouped_experts', 'config': GE_CFG, 'meshId': MESH_EP, 'moduleFqn': 'layers.0.mlp.experts',
     'materialize': {'enabled': True, 'dtype': 'float16', 'seed': '7'}},
    {'family': 'grouped_experts', 'config': GE_CFG, 'meshId': MESH_EP,
     'materialize': {'enabled': True, 'ranks': ['3', '9']}},
    {'family': 'grouped_experts', 'module': {'fqn': 'layers.1.moe', 'parameters': [
        {'name': 'gate_up_proj', 'shape': ['8', '16', '16'], 'dtype': 'float32'},
        {'name': 'down_proj', 'shape': ['8', '8', '16']}]},
     'config': {'fields': {'initializer_range': {'doubleValue': 0.02}}},
     'context': {'epSize': 4, 'ep': True}},
    {'family': 'grouped_experts', 'module': {'fqn': 'x', 'parameters': [
        {'name': 'gate_up_proj', 'shape': ['8', '16', '15']}]}},
    {'family': 'attention', 'config': ATT_CFG, 'meshId': MESH_TP,
     'materialize': {'enabled': True, 'dtype': 'bfloat16', 'seed': '3'}},
    {'family': 'attention', 'config': ATT_CFG, 'context': {'tpSize': 4, 'tp': True, 'cpSize': 2, 'cp': True}},
    {'family': 'attention', 'config': {'fields': {'x': nested(6)}}},
    {'family': 'attention', 'config': ATT_CFG, 'materialize': {'enabled': True, 'dtype': 'int4'}},
    {'family': 'grouped_experts', 'config': {'fields': {'num_experts': {'intValue': '9223372036854775807'},
                                                        'hidden_size': {'intValue': '2'},
                                                        'moe_intermediate_size': {'intValue': '-1'}}},
     'materialize': {'enabled': True}},
    {'family': 'engram', 'config': {'fields': {}}},
]]
LAYOUT_GE = {'meshId': MESH_EP, 'parameters': [
    {'name': 'gate_up_proj', 'shape': ['8', '16', '16'], 'placements': [{'axis': 'ep', 'kind': 'shard', 'dim': '0'}]},
    {'name': 'down_proj', 'shape': ['8', '8', '16'], 'placements': [{'axis': 'ep', 'kind': 'shard', 'dim': '-3'},
                                                                  {'axis': 'dp', 'kind': 'replicate'}]}]}
validates = [msg(VR, v) for v in [
    {'boundaries': [{'fqns': ['layers.0.moe', 'model.layers.0.moe'], 'buildId': BUILD_GE, 'appliedLayout': LAYOUT_GE},
                    {'fqns': ['layers.1.moe'], 'buildId': BUILD_GE}],
     'context': {'meshId': MESH_EP}},
    {'boundaries': [{'fqns': ['attn'], 'buildId': BUILD_ATT}, {'fqns': ['u'], 'buildId': 'bld-gone'}],
     'context': {'meshId': MESH_TP, 'tpSize': 2}},
    {'boundaries': [{'fqns': ['a'], 'buildId': BUILD_GE,
                     'appliedLayout': {'meshId': MESH_TP, 'parameters': [{'name': 'gate_up_proj', 'shape': ['8', '16', '32'],
                                                                          'placements': [{'axis': 'ep', 'kind': 'shard', 'dim': '2'}]}]}},
                    {'fqns': ['b'], 'buildId': BUILD_GE, 'appliedLayout': LAYOUT_GE}],
     'context': {'epSize': 2, 'cpSize': 2}},
    {'boundaries': [{'fqns': [], 'buildId': ''}], 'context': {'meshId': 'mesh-0000000000000000'}},
    {'boundaries': [{'fqns': ['x'], 'buildId': BUILD_ATT, 'appliedLayout': {'parameters': [{'name': 'nope', 'shape': ['1']}]}}],
     'context': {'tpSize': 4}},
    {'boundaries': [{'fqns': ['moe'], 'buildId': BUILD_GE}, {'fqns': ['attn'], 'buildId': BUILD_ATT}],
     'context': {'meshId': MESH_EP},
     'sharedParameters': [
         {'uses': [{'fqn': 'moe.gate_up_proj', 'buildId': BUILD_GE, 'parameter': 'gate_up_proj'},
                   {'fqn': 'moe.down_proj', 'buildId': BUILD_GE, 'parameter': 'down_proj'},
                   {'fqn': 'attn.q_proj', 'buildId': BUILD_ATT, 'parameter': 'q_proj'},
                   {'fqn': 'gone', 'buildId': 'bld-gone', 'parameter': 'w'},
                   {'fqn': 'nope', 'buildId': BUILD_GE, 'parameter': 'nope'}]},
         {'uses': [{'fqn': 'x', 'buildId': 'bld-gone', 'parameter': 'w'},
                   {'fqn': 'y', 'buildId': BUILD_GE, 'parameter': 'gate_up_proj'}]}]},
    {'boundaries': [], 'sharedParameters': [
        {'uses': [{'fqn': 'a', 'buildId': BUILD_GE, 'parameter': 'gate_up_proj'}]},
        {'uses': [{'fqn': '', 'buildId': '', 'parameter': ''}, {'fqn': 'b'}]}]},
]]
getfamily = [msg(GF, {'family': f}) for f in
             ['grouped_experts', 'norm', 'hyper_parallel.components.modules.norm.RMSNorm', 'engram', '', 'nope']]

request = {}
for i, x in enumerate(res):
    request['resolve-%02d.bin' % i] = b'\x00' + x
for i, x in enumerate(res_extra):
    request['resolve-extra-%d.bin' % i] = b'\x00' + x
for i, x in enumerate(meshes):
    request['mesh-%02d.bin' % i] = b'\x01' + x
for i, x in enumerate(builds):
    request['build-%02d.bin' % i] = b'\x02' + x
for i, x in enumerate(validates):
    request['validate-%02d.bin' % i] = b'\x03' + x
for i, x in enumerate(getfamily):
    request['family-%02d.bin' % i] = b'\x04' + x
write_dir(os.path.join(HERE, 'corpus', 'request'), request)

# wire: a spread of Resolve and Build requests, and broken wire.
allres = res + res_extra
wire = {}
for i, x in enumerate(allres[::max(1, len(allres) // 8)][:8]):
    wire['resolve-%02d.bin' % i] = x
for i, x in enumerate(builds[:8]):
    wire['build-%02d.bin' % i] = x
wire['broken-truncated.bin'] = allres[-1][:len(allres[-1]) // 2]
wire['broken-wiretype.bin'] = b'\x0b\x12\x05abc'
wire['broken-length.bin'] = b'\x12\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x0a\x01a'
write_dir(os.path.join(HERE, 'corpus', 'wire'), wire)

# expr: every shape expression of both registries, then edge cases.
exprs = []
for d in (os.path.join(ROOT, 'deploy', 'registry'), os.path.join(CONFORMANCE, 'registry')):
    for f in sorted(os.listdir(d)):
        if f.endswith(('.yaml', '.yml')):
            for m in re.finditer(r'shape:\s*\[(.*)\]', open(os.path.join(d, f)).read()):
                exprs += [e.strip() for e in m.group(1).split(',')]
exprs = uniq(exprs) + [
    'a - (b - c)', '-(-x) * 3', '((a))', '- - - hidden', 'x / 0', 'x / 3', '9223372036854775807',
    '9223372036854775808', '0 - 9223372036854775807 - 1', 'a*b*c*d*e*f*g*h', '(' * 70 + 'x' + ')' * 70,
    '12abc', 'a +', '\tnum_experts\t*\t2', 'a $ b', '']
values = struct.pack('<4q', 8, 4096, -1, 2 ** 62)
write_dir(os.path.join(HERE, 'corpus', 'expr'),
          {'expr-%02d.txt' % i: e.encode() + b'\x00' + values for i, e in enumerate(exprs)})

# config: the daemon's config file.
config_full = b"""# familyd.conf: every key
socket = /run/familyd/familyd.sock
shard-socket = /run/familyd/shard.sock
registry = /etc/familyd/registry
state-dir = /var/lib/familyd
host-devices = 8
node-name = node-0
node-rank = 3
listen = 10.0.0.1:7070
peers = 10.0.0.2:7070,10.0.0.3:7070
shm-budget = 1073741824
max-builds = 1024
heartbeat-ms = 1000
suspect-ms = 3000
down-ms = 10000
forget-after-ms = 600000
fdstore-max = 4096
threads = 2
max-connections = 256
max-connections-per-process = 64
connection-idle-ms = 120000
max-watches = 1024
max-shards = 4096
log-level = debug
"""
write_dir(os.path.join(HERE, 'corpus', 'config'), {
    'full.conf': config_full,
    'empty.conf': b'',
    'comments.conf': b'  # only comments\n\n\t# and blanks\n   \n',
    'spaces.conf': b'  registry=/tmp/r  \n\tthreads =4\t\nlog-level = warning\n',
    'unknown-key.conf': b'registry = /r\nbogus = 1\n',
    'no-equals.conf': b'registry /r\n',
    'bad-number.conf': b'threads = 0x10\n',
    'range.conf': b'heartbeat-ms = 5000\nsuspect-ms = 100\n',
    'overflow.conf': b'shm-budget = 99999999999999999999999\n',
    'long-name.conf': b'node-name = ' + b'n' * 300 + b'\n',
    'config-key.conf': b'config = /etc/other.conf\n',
    'nul.conf': b'registry = /a\x00b\nthreads = 2\n',
    'no-newline.conf': b'max-builds = 7',
})

# shard-socket: byte streams.
SR = cls('familyd.v1.ShardFdRequest')
A, B, C = 'a' * 32, 'b' * 32, 'c' * 32


def frame(tokens=(), writable=False, raw=None):
    body = raw if raw is not None else SR(tokens=list(tokens), writable=writable).SerializeToString()
    return struct.pack('<I', len(body)) + body


write_dir(os.path.join(HERE, 'corpus', 'shard-socket'), {
    'one.bin': frame([A]),
    'two-writable.bin': frame([A, B], writable=True),
    'same-twice.bin': frame([B, B]),
    'empty-request.bin': frame([]),
    'released.bin': frame([A, C]),
    'unknown.bin': frame(['0123456789abcdef0123456789abcdef']),
    'pipelined.bin': frame([A]) + frame([B], writable=True) + frame([]) + frame([C]) + frame([A, B]),
    'too-many.bin': frame([A] * 254),
    'most.bin': frame([A, B] * 126 + [A]),
    'garbage-frame.bin': frame(raw=b'\xff\xff\xff') + frame([A]),
    'length-4gib.bin': b'\xff\xff\xff\xff' + frame([A]),
    'length-over.bin': struct.pack('<I', 65537) + b'x' * 16,
    'partial-header.bin': frame([A]) + b'\x10\x00',
    'partial-body.bin': frame([B]) + struct.pack('<I', 40) + frame([A])[4:20],
    'zero-length-then-ok.bin': b'\x00\x00\x00\x00' + frame([A], writable=True),
})
# safetensors: whole files (8-byte length, header, data) and model.safetensors.index.json texts.
def st_file(tensors, metadata=None, pad=True, length=None, extra=b''):
    """tensors: [(name, dtype, shape, nbytes)], laid out in order, as the format's writer does."""
    header, at = {}, 0
    if metadata is not None:
        header['__metadata__'] = metadata
    for name, dtype, shape, nbytes in tensors:
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [at, at + nbytes]}
        at += nbytes
    body = json.dumps(header, separators=(',', ':')).encode()
    if pad:
        body += b' ' * (-len(body) % 8)
    return struct.pack('<Q', len(body) if length is None else length) + body + \
        bytes(range(256)) * (at // 256) + bytes(at % 256) + extra


ST_DTYPES = [('BOOL', 1), ('U8', 1), ('I8', 1), ('F8_E5M2', 1), ('F8_E4M3', 1), ('F8_E8M0', 1),
             ('I16', 2), ('U16', 2), ('F16', 2), ('BF16', 2), ('I32', 4), ('U32', 4),
             ('F32', 4), ('C64', 8), ('F64', 8), ('I64', 8), ('U64', 8)]
safetensors = {
    'llama-layer.st': st_file([
        ('model.layers.0.self_attn.q_proj.weight', 'BF16', [8, 8], 128),
        ('model.layers.0.mlp.gate_proj.weight', 'BF16', [16, 8], 256),
        ('model.layers.0.input_layernorm.weight', 'F32', [8], 32)], metadata={'format': 'pt'}),
    'every-dtype.st': st_file([('t_' + d, d, [3], 3 * n) for d, n in ST_DTYPES] +
                              [('t_F4', 'F4', [4], 2), ('t_F6', 'F6_E2M3', [4], 3)]),
    'scalar-empty.st': st_file([('s', 'F64', [], 8), ('e', 'F32', [0, 4], 0)], pad=False),
    'empty.st': st_file([]),
    'overlap.st': (lambda b: struct.pack('<Q', len(b)) + b + bytes(8))(json.dumps(
        {'a': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]},
         'b': {'dtype': 'F32', 'shape': [1], 'data_offsets': [4, 8]}}).encode()),
    'past-end.st': st_file([('a', 'U8', [4], 4)], length=1 << 20),
    'trailing.st': st_file([('a', 'U8', [4], 4)], extra=b'xy'),
    'index.json': json.dumps({'metadata': {'total_size': 416}, 'weight_map': {
        'model.layers.0.self_attn.q_proj.weight': 'model-00001-of-00002.safetensors',
        'model.layers.0.mlp.gate_proj.weight': 'model-00002-of-00002.safetensors'}}).encode(),
    'index-one-file.json': json.dumps({'weight_map': {'a': 'x.safetensors'}}).encode(),
    'index-outside.json': json.dumps({'weight_map': {'a': '../x.safetensors'}}).encode(),
}
write_dir(os.path.join(HERE, 'corpus', 'safetensors'), safetensors)

print('corpus: %d request, %d wire, %d expr, %d safetensors seeds' % (len(request), len(wire), len(exprs), len(safetensors)))
