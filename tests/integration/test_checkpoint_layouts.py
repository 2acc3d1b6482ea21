#!/usr/bin/python3
"""Builds from a safetensors checkpoint: every local shard of every family of the example
registry (deploy/registry) is byte-equal to this test's own slicing of the checkpoint's tensors.

The checkpoint is written here by the safetensors library (checkpoint_files.py: its numpy writer
for F32, its torch writer for BF16), never by familyd's code: Llama/Mixtral-style names
(model.embed_tokens, model.layers.0.self_attn.q_proj, ..., block_sparse_moe.experts.E.w1/w2/w3,
model.norm, lm_head), split over two files with a model.safetensors.index.json. The Python
client deposits it (familyd.Client.checkpoint_token: one deposit per directory, its token
reused) and builds each member with checkpoint_prefix; the shards are fetched over the shard
socket by hand (shard_client.py) and mapped read-only.

Expected values are the test's numpy: each registry parameter's logical tensor from the
checkpoint's names (attention wq/wk/wv/wo = q/k/v/o_proj, grouped_experts gate_up_proj =
per expert [w1^T, w3^T] concatenated along dim 2 and stacked along dim 0, down_proj = w2^T
stacked), each rank's piece of it laid out as torch.chunk splits (computed here from the mesh,
not read from the reply), compared as bytes with the slice in the shard. Meshes: tp=2,
dp=2 x tp=2 (expert view edp_shard=2 x ep=2), ep=2, tp=4; checkpoints F32 and BF16, each built
in its own dtype, then BF16 into float32 (exact) and F32 into bfloat16 (round to nearest even)
on tp=2.

Fused parameters (docs/registry.md, "Concatenated sources are sharded before they are joined"):
a test-only family beside the example registry's holds a qkv_proj [q; k; v] concatenated along
dimension 0 and sharded over tp on it, and a Mixtral gate_up_proj sharded over tp on its
concatenated dimension 2. A rank's block is then each part's own share joined (tp rank r of g
holds [q_r; k_r; v_r]), which the test builds from the parts by the rule's words and slices as
any other parameter.

Daemon: deploy/registry plus that family, --host-devices 4, one node.
"""

import math
import os
import shutil
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
import checkpoint_files as CF  # noqa: E402

sys.path.insert(0, os.path.join(H.SOURCE_ROOT, "client", "python"))
import familyd  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CONFIG = {"vocab_size": 24, "hidden_size": 16, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 20,
          "num_experts": 4, "moe_intermediate_size": 8, "initializer_range": 0.02,
          "rms_norm_eps": 1e-6}
MESHES = {
    "tp=2": ([("tp", 2)], []),
    "dp=2,tp=2": ([("dp", 2), ("tp", 2)], [("edp_shard", 2), ("ep", 2)]),
    "ep=2": ([("ep", 2)], []),
    "tp=4": ([("tp", 4)], []),
}
# (family, checkpoint prefix): every family of the example registry, lm_head through the
# embedding family.
MEMBERS = [("embedding", "model.embed_tokens"), ("embedding", "lm_head"),
           ("norm", "model.layers.0.input_layernorm"), ("norm", "model.norm"),
           ("attention", "model.layers.0.self_attn"), ("mlp", "model.layers.0.mlp"),
           ("grouped_experts", "model.layers.0.block_sparse_moe")]
STORED = {"F32": "float32", "BF16": "bfloat16"}
# The fused family's concatenated dimension per parameter.
FUSED_DIMS = {"qkv_proj": 0, "gate_up_proj": 2}
# A test-only family: fused q/k/v and gate/up parameters sharded on their concatenated dimension.
FUSED = "fused_itest"
FUSED_YAML = """\
name: fused_itest
baseline: itest.checkpoint.Fused
default_variant: plain
variants:
  plain:
    constructor: itest.checkpoint.FusedPlain
    accepts: [config]
parameters:
  qkv_proj:
    shape: [(num_attention_heads + 2 * num_key_value_heads) * head_dim, hidden_size]
    placements: {tp: shard(0)}
    checkpoint:
      concat:
        dim: 0
        parts:
          - '{prefix}.self_attn.q_proj.weight'
          - '{prefix}.self_attn.k_proj.weight'
          - '{prefix}.self_attn.v_proj.weight'
  gate_up_proj:
    shape: [num_experts, hidden_size, 2 * moe_intermediate_size]
    placements: {tp: shard(2)}
    checkpoint:
      stack: {dim: 0, key: e}
      concat:
        dim: 2
        parts:
          - {tensor: '{prefix}.block_sparse_moe.experts.{e}.w1.weight', transpose: true}
          - {tensor: '{prefix}.block_sparse_moe.experts.{e}.w3.weight', transpose: true}
"""

P = None
D = None
TMP = None
TENSORS = None
CKPT = {}


def setUpModule():
    global P, D, TMP, TENSORS
    TMP = H.short_tmpdir("fd-ckpt-layouts-")
    TENSORS = CF.llama_tensors(CONFIG, layers=1, experts=True, seed=31)
    for dtype in STORED:
        CKPT[dtype] = os.path.join(TMP, dtype.lower())
        CF.write_checkpoint(CKPT[dtype], TENSORS, dtype, files=2)
    registry = os.path.join(TMP, "registry")
    shutil.copytree(REGISTRY, registry, ignore=shutil.ignore_patterns("*.md"))
    with open(os.path.join(registry, "fused_itest.yaml"), "w") as f:
        f.write(FUSED_YAML)
    P = H.Protos()
    D = H.Daemon(registry=registry, host_devices=4, node_name="itest-ckpt-layouts", protos=P)
    D.start()


def tearDownModule():
    try:
        if D is not None:
            D.stop_checked()
    finally:
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


def experts_gate_up(prefix):
    """Mixtral's w1^T and w3^T of every expert, each stacked along dim 0: [E, H, M] twice."""
    e = prefix + ".experts.%d.%s.weight"
    return [np.stack([TENSORS[e % (k, w)].T for k in range(CONFIG["num_experts"])], axis=0)
            for w in ("w1", "w3")]


def joined(parts, dim, groups):
    """Parts joined along dim, sharded before they are joined: dim is `groups` equal groups,
    group k being each part's k-th 1/groups in part order (groups=1: the plain join)."""
    pieces = []
    for k in range(groups):
        for part in parts:
            n = part.shape[dim] // groups
            assert n * groups == part.shape[dim]
            pieces.append(np.take(part, range(k * n, (k + 1) * n), axis=dim))
    return np.concatenate(pieces, axis=dim)


def logical(family, prefix, name, groups=1):
    """The registry parameter `name` of `family` at `prefix` as the checkpoint holds it
    (float32 values), by this test's own reading of the registry's name map; a fused one laid
    out for `groups` shards of its concatenated dimension."""
    t = TENSORS
    if family == FUSED:
        if name == "qkv_proj":
            return joined([t[prefix + ".self_attn.%s_proj.weight" % x] for x in "qkv"], 0,
                          groups)
        return joined(experts_gate_up(prefix + ".block_sparse_moe"), 2, groups)
    if family in ("embedding", "norm"):
        return t[prefix + ".weight"]
    if family == "attention":
        proj = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj"}[name]
        return t["%s.%s.weight" % (prefix, proj)]
    if family == "mlp":
        return t["%s.%s.weight" % (prefix, name)]
    experts = range(CONFIG["num_experts"])
    e = prefix + ".experts.%d.%s.weight"
    if name == "gate_up_proj":       # [E, H, 2M]: [w1^T, w3^T] along dim 2, stacked on dim 0
        return np.stack([np.concatenate([t[e % (k, "w1")].T, t[e % (k, "w3")].T], axis=1)
                         for k in experts], axis=0)
    return np.stack([t[e % (k, "w2")].T for k in experts], axis=0)    # down_proj [E, M, H]


def concat_groups(placements, dim, device, expert):
    """How many pieces the mesh shards dimension dim into: the product of the sizes of the
    mesh's axes placed shard(dim)."""
    sizes = dict(device + expert)
    return math.prod(sizes.get(axis, 1) for axis, d in placements if d == dim)


def as_stored(values, ckpt_dtype, build_dtype):
    """The bytes a parameter of build_dtype holds for checkpoint values stored as ckpt_dtype:
    BF16 -> float32 is exact; F32 -> bfloat16 rounds to nearest even."""
    if ckpt_dtype == "BF16":
        values = CF.bf16_values(values)
    if build_dtype == "bfloat16":
        return CF.bf16_bits(values)
    return np.ascontiguousarray(values, dtype=np.float32)


def chunk_piece(length, parts, index):
    """torch.chunk's piece `index` of `parts`: [start, stop)."""
    chunk = -(-length // parts)
    return min(length, index * chunk), min(length, (index + 1) * chunk)


def expected_pieces(shape, placements, device, expert):
    """{rank: (global_offset, local_shape)}: each rank's piece of a parameter laid out with
    placements [(axis, dim)] on the mesh (the expert view for an axis only it has), computed
    from the view's dimensions in row-major rank order."""
    names = [n for n, _ in device]
    view = device
    if any(a not in names and a in [n for n, _ in expert] for a, _ in placements):
        view = expert
    out = {}
    for rank in range(math.prod(s for _, s in view)):
        coords, rest = {}, rank
        for name, size in reversed(view):
            coords[name] = rest % size
            rest //= size
        start, stop = [0] * len(shape), list(shape)
        for name, size in view:
            for axis, dim in placements:
                if axis == name and size > 1:
                    s, e = chunk_piece(stop[dim] - start[dim], size, coords[name])
                    start[dim], stop[dim] = start[dim] + s, start[dim] + e
        out[rank] = (start, [e - s for s, e in zip(start, stop)])
    return out


class Layouts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = familyd.Client(D.socket, shard_socket=D.shard_socket)
        cls.meshes = {}
        for name, (device, expert) in MESHES.items():
            m = {"deviceMesh": [{"name": n, "size": s} for n, s in device],
                 "ranks": [str(r) for r in range(math.prod(s for _, s in device))]}
            if expert:
                m["expertMesh"] = [{"name": n, "size": s} for n, s in expert]
            res = D.client.call("familyd.v1.MeshService/CreateMesh", {"mesh": m})
            assert res.ok, res
            cls.meshes[name] = res.reply.mesh_id

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def build(self, family, prefix, mesh, ckpt_dtype, build_dtype):
        return self.client.build(family, CONFIG, mesh_id=self.meshes[mesh], dtype=build_dtype,
                                 checkpoint=CKPT[ckpt_dtype], checkpoint_prefix=prefix,
                                 map_shards=False)

    def check(self, family, prefix, mesh, ckpt_dtype, build_dtype):
        device, expert = MESHES[mesh]
        with self.build(family, prefix, mesh, ckpt_dtype, build_dtype) as b:
            msg = b.message
            layouts = {p.name: p for p in msg.info.layout.parameters}
            self.assertTrue(layouts, "no parameters")
            want = {}
            for name, p in layouts.items():
                self.assertEqual(p.dtype, build_dtype, name)
                rank = len(p.shape)
                placements = [(x.axis, x.dim % rank) for x in p.placements if x.kind == "shard"]
                groups = concat_groups(placements, FUSED_DIMS.get(name, -1), device, expert) \
                    if family == FUSED else 1
                values = as_stored(logical(family, prefix, name, groups), ckpt_dtype,
                                   build_dtype)
                self.assertEqual(list(p.shape), list(values.shape), name)
                want[name] = (values, expected_pieces(values.shape, placements, device, expert))
            holders = [s for s in msg.shards if s.token]
            self.assertEqual(sorted(s.rank for s in holders),
                             list(range(math.prod(s for _, s in device))),
                             "every rank of the mesh is materialised on this node")
            reply, fds = SC.fetch(msg.shard_socket, P, [s.token for s in holders])
            self.assertEqual(reply.code, 0, reply.message)
            for shard, fd, size in zip(holders, fds, reply.sizes):
                mm = SC.map_readonly(fd, size)
                os.close(fd)
                try:
                    for sl in shard.slices:
                        values, pieces = want[sl.parameter]
                        offset, shape = pieces[shard.rank]
                        where = "%s %s on %s, rank %d, %s" % (family, prefix, mesh, shard.rank,
                                                              sl.parameter)
                        self.assertEqual((list(sl.global_offset), list(sl.local_shape)),
                                         (offset, shape), where)
                        piece = values[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
                        expected = np.ascontiguousarray(piece).tobytes()
                        self.assertEqual(sl.byte_length, len(expected), where)
                        got = mm[sl.byte_offset:sl.byte_offset + sl.byte_length]
                        if got != expected:
                            a = np.frombuffer(got, dtype=piece.dtype)
                            first = int(np.argmax(a != piece.reshape(-1)))
                            self.fail("%s: bytes differ from the checkpoint's, first at element "
                                      "%d: %r, expected %r" % (where, first, a[first],
                                                               piece.reshape(-1)[first]))
                finally:
                    mm.close()

    def test_f32_checkpoint_every_family_and_mesh(self):
        for mesh in MESHES:
            for family, prefix in MEMBERS:
                with self.subTest(mesh=mesh, family=family, prefix=prefix):
                    self.check(family, prefix, mesh, "F32", "float32")

    def test_bf16_checkpoint_every_family_and_mesh(self):
        for mesh in MESHES:
            for family, prefix in MEMBERS:
                with self.subTest(mesh=mesh, family=family, prefix=prefix):
                    self.check(family, prefix, mesh, "BF16", "bfloat16")

    def test_bf16_checkpoint_into_float32(self):
        for family, prefix in MEMBERS:
            with self.subTest(family=family, prefix=prefix):
                self.check(family, prefix, "tp=2", "BF16", "float32")

    def test_f32_checkpoint_into_bfloat16(self):
        for family, prefix in MEMBERS:
            with self.subTest(family=family, prefix=prefix):
                self.check(family, prefix, "tp=2", "F32", "bfloat16")

    def test_fused_parameters_sharded_before_joined(self):
        for ckpt_dtype, build_dtype in STORED.items():
            for mesh in MESHES:
                with self.subTest(mesh=mesh, checkpoint=ckpt_dtype):
                    self.check(FUSED, "model.layers.0", mesh, ckpt_dtype, build_dtype)

    def test_fused_rule_is_not_a_slice_of_the_joined_tensor(self):
        # The oracle itself: on tp=2, rank 0's qkv block is q's first half, then k's, then v's.
        H_, D_ = CONFIG["hidden_size"], CONFIG["head_dim"]
        q = CONFIG["num_attention_heads"] * D_
        kv = CONFIG["num_key_value_heads"] * D_
        t = TENSORS
        block = logical(FUSED, "model.layers.0", "qkv_proj", 2)[:(q + 2 * kv) // 2]
        want = np.concatenate([t["model.layers.0.self_attn.q_proj.weight"][:q // 2],
                               t["model.layers.0.self_attn.k_proj.weight"][:kv // 2],
                               t["model.layers.0.self_attn.v_proj.weight"][:kv // 2]])
        self.assertTrue(np.array_equal(block, want))
        self.assertEqual(block.shape, ((q + 2 * kv) // 2, H_))

    def test_one_deposit_per_checkpoint(self):
        # build() and build_module() name the cached token: one deposit per directory (the
        # daemon allows a uid 16 at a time, and these tests make dozens of Builds).
        tokens = {self.client.checkpoint_token(CKPT[d]) for d in STORED}
        self.assertEqual(len(tokens), 2)
        self.assertEqual(self.client.checkpoint_token(CKPT["F32"]),
                         self.client.checkpoint_token(CKPT["F32"]))
        for t in tokens:
            self.assertRegex(t, r"^[0-9a-f]{32}$")


if __name__ == "__main__":
    unittest.main(verbosity=2)
