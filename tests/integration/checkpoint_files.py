"""Safetensors checkpoints that the checkpoint tests write with the safetensors library (its
numpy writer for F32, its torch writer for BF16: numpy has no bfloat16), never with familyd's
code, and the Llama/Mixtral-style tensors they hold.

    tensors = llama_tensors(CONFIG, layers=1, experts=True, seed=5)   # name -> float32 array
    write_checkpoint(DIR, tensors, "BF16", files=2)                    # + the index

The tensors are float32 numpy arrays; a BF16 checkpoint holds them rounded to the nearest
bfloat16 (ties to even), and bf16_bits()/bf16_values() give what it holds.
"""

import json
import os

import numpy as np

INDEX = "model.safetensors.index.json"


def bf16_bits(a):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (finite values)."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(a):
    """float32 array -> the float32 values of its bfloat16 rounding (exact)."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def llama_tensors(config, layers=1, experts=False, seed=0, tie=False):
    """{name: float32 array} of a Llama model (and, with experts, a Mixtral block_sparse_moe
    in layer 0 beside the dense MLP) named as transformers names them, [out, in] matrices.
    Values are random normal (std 0.2, norms around 1): every element differs."""
    rng = np.random.default_rng(seed)
    H = config["hidden_size"]
    V = config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    D = config.get("head_dim") or H // heads
    inter = config["intermediate_size"]

    def mat(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    def norm():
        return (1.0 + rng.standard_normal(H) * 0.1).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(V, H)}
    for i in range(layers):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = mat(heads * D, H)
        t[p + "self_attn.k_proj.weight"] = mat(kv * D, H)
        t[p + "self_attn.v_proj.weight"] = mat(kv * D, H)
        t[p + "self_attn.o_proj.weight"] = mat(H, heads * D)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(inter, H)
        t[p + "mlp.up_proj.weight"] = mat(inter, H)
        t[p + "mlp.down_proj.weight"] = mat(H, inter)
        if experts and i == 0:
            M = config["moe_intermediate_size"]
            for e in range(config["num_experts"]):
                q = p + "block_sparse_moe.experts.%d." % e
                t[q + "w1.weight"] = mat(M, H)
                t[q + "w2.weight"] = mat(H, M)
                t[q + "w3.weight"] = mat(M, H)
    t["model.norm.weight"] = norm()
    if not tie:
        t["lm_head.weight"] = mat(V, H)
    return t


def write_checkpoint(directory, tensors, dtype="F32", files=2, config=None):
    """Writes tensors (name -> float32 array) as `files` safetensors files (the names split in
    order, model-0000K-of-0000N.safetensors) plus model.safetensors.index.json when files > 1
    (one file: model.safetensors), each tensor stored as dtype "F32" or "BF16"; config.json
    too when config is given. Returns the file names."""
    from safetensors.numpy import save_file as save_numpy

    os.makedirs(directory, exist_ok=True)
    names = sorted(tensors)
    if files == 1:
        parts = [("model.safetensors", names)]
    else:
        per = -(-len(names) // files)
        parts = [("model-%05d-of-%05d.safetensors" % (k + 1, files), names[k * per:(k + 1) * per])
                 for k in range(files)]
    weight_map = {}
    total = 0
    for fname, part in parts:
        path = os.path.join(directory, fname)
        if dtype == "F32":
            save_numpy({n: np.ascontiguousarray(tensors[n]) for n in part}, path,
                       metadata={"format": "pt"})
            total += sum(tensors[n].nbytes for n in part)
        elif dtype == "BF16":
            import torch
            from safetensors.torch import save_file as save_torch

            out = {n: torch.from_numpy(bf16_bits(tensors[n]).view(np.int16)).view(torch.bfloat16)
                   for n in part}
            save_torch(out, path, metadata={"format": "pt"})
            total += sum(tensors[n].size * 2 for n in part)
        else:
            raise ValueError(dtype)
        weight_map.update({n: fname for n in part})
    if files > 1:
        with open(os.path.join(directory, INDEX), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if config is not None:
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    return [p[0] for p in parts] + ([INDEX] if files > 1 else [])
