#!/usr/bin/python3
"""moe_forward.py: build grouped_experts with familyd and run a small MoE block on its shards.

The daemon materialises the experts' weights in shared memory; this script maps them with no
copy (familyd.Client.build), assembles this node's experts in global order, routes a batch of
random tokens to them (top-k of a random router) and runs each expert:
x @ gate_up -> silu(gate) * up -> @ down. torch when importable (--numpy forces numpy).

    bash deploy/dev/run.sh            # in one terminal: the daemon on run/familyd.sock
    FAMILYD_DESCRIPTORS=build-run/proto/familyd.binpb PYTHONPATH=client/python \\
        .venv/bin/python3 client/python/examples/moe_forward.py --socket run/familyd.sock --ep 4

Prints the shapes, a checksum of the output, and exits 0.
"""

import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import familyd  # noqa: E402


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def bf16_to_f32(bits):
    """numpy uint16 bfloat16 bits -> float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def assemble(build, rank_tensors):
    """This node's experts, in global expert order: (first expert, gate_up, down) in float32."""
    pieces = []
    for rank in sorted(rank_tensors):
        rt = rank_tensors[rank]
        offsets = {s.parameter: tuple(s.global_offset) for s in build.ranks[rank].slices}
        gu, dn = rt["gate_up_proj"], rt["down_proj"]
        if gu.shape[0] == 0:
            continue
        pieces.append((offsets["gate_up_proj"][0], gu, dn))
    pieces.sort(key=lambda p: p[0])
    # Ranks that replicate experts (e.g. an expert-data-parallel axis) hold the same ones:
    # keep each expert once.
    seen, uniq = set(), []
    for first, gu, dn in pieces:
        if first not in seen:
            seen.add(first)
            uniq.append((first, gu, dn))
    return uniq


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("FAMILYD_SOCKET") or "run/familyd.sock")
    ap.add_argument("--ep", type=int, default=0,
                    help="create a mesh ep=N over ranks 0..N-1 (0: no mesh, one rank)")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--moe-intermediate-size", type=int, default=32)
    ap.add_argument("--num-experts", type=int, default=8)
    ap.add_argument("--numpy", action="store_true", help="compute with numpy even if torch is there")
    args = ap.parse_args()

    torch = None
    if not args.numpy:
        try:
            import torch
        except ImportError:
            torch = None

    config = {
        "hidden_size": args.hidden_size,
        "moe_intermediate_size": args.moe_intermediate_size,
        "num_experts": args.num_experts,
        "initializer_range": 0.02,
    }
    H, I = args.hidden_size, args.moe_intermediate_size

    with familyd.Client(args.socket) as client:
        mesh_id = None
        if args.ep > 0:
            mesh = client.create_mesh({"ep": args.ep}, ranks=range(args.ep))
            mesh_id = mesh.mesh_id
            print("mesh           %s (ep=%d)" % (mesh_id, args.ep))
        # mode="private": copy-on-write mappings, which torch may use (and a trainer may
        # train on) without ever touching the bytes the node's other trainers share.
        with client.build("grouped_experts", config=config, mesh_id=mesh_id, dtype=args.dtype,
                          seed=args.seed, mode="private") as b:
            print("build          %s (%s, %s)" % (b.id, b.message.info.resolved.variant,
                                                  b.dtype_of("gate_up_proj")))
            for rank in sorted(b.ranks):
                rt = b.ranks[rank]
                print("rank %-9d %s" % (rank, "  ".join(
                    "%s%s %s" % (k, list(v.shape), v.dtype) for k, v in rt.items())))

            dtype = b.dtype_of("gate_up_proj")
            if torch is not None:
                local = {r: b.ranks[r].torch() for r in b.ranks}
            else:
                local = dict(b.ranks)
            experts = assemble(b, local)
            n_local = sum(gu.shape[0] for _, gu, _ in experts)
            print("local experts  %d of %d, on %s" % (n_local, args.num_experts,
                                                      "torch" if torch is not None else "numpy"))

            rng = np.random.default_rng(args.seed)
            x = rng.standard_normal((args.tokens, H)).astype(np.float32)
            router = rng.standard_normal((H, n_local)).astype(np.float32) * 0.1
            k = min(args.top_k, n_local)

            if torch is not None:
                xt = torch.from_numpy(x)
                logits = xt @ torch.from_numpy(router)
                probs = torch.softmax(logits, dim=-1)
                w, idx = torch.topk(probs, k, dim=-1)
                gate_up = torch.cat([gu for _, gu, _ in experts]).float()
                down = torch.cat([dn for _, _, dn in experts]).float()
                y = torch.zeros_like(xt)
                for e in range(n_local):
                    tok, slot = torch.nonzero(idx == e, as_tuple=True)
                    if tok.numel() == 0:
                        continue
                    h = xt[tok] @ gate_up[e]                         # [t, 2I]
                    g, u = h[:, :I], h[:, I:]
                    a = torch.nn.functional.silu(g) * u              # [t, I]
                    y.index_add_(0, tok, (a @ down[e]) * w[tok, slot, None])
                y = y.numpy()
                print("gate_up        %s   down %s" % (list(gate_up.shape), list(down.shape)))
            else:
                logits = x @ router
                probs = np.exp(logits - logits.max(-1, keepdims=True))
                probs /= probs.sum(-1, keepdims=True)
                idx = np.argsort(-probs, axis=-1)[:, :k]
                w = np.take_along_axis(probs, idx, -1)
                conv = bf16_to_f32 if dtype == "bfloat16" else (lambda a: a.astype(np.float32))
                gate_up = np.concatenate([conv(gu) for _, gu, _ in experts])
                down = np.concatenate([conv(dn) for _, _, dn in experts])
                y = np.zeros_like(x)
                for e in range(n_local):
                    tok, slot = np.nonzero(idx == e)
                    if tok.size == 0:
                        continue
                    h = x[tok] @ gate_up[e]
                    g, u = h[:, :I], h[:, I:]
                    a = g / (1.0 + np.exp(-g)) * u
                    np.add.at(y, tok, (a @ down[e]) * w[tok, slot, None])
                print("gate_up        %s   down %s" % (list(gate_up.shape), list(down.shape)))

            y = np.ascontiguousarray(y, dtype=np.float32)
            print("x              %s" % list(x.shape))
            print("y              %s  sum=%.6g  |y|=%.6g  fnv1a64=%016x" % (
                list(y.shape), float(y.sum()), float(np.linalg.norm(y)), fnv1a64(y.tobytes())))
            if not np.isfinite(y).all():
                print("moe_forward: non-finite output", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
