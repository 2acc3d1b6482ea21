"""load_pretrained(): a Llama-style model from a directory of safetensors files, every module
built by familyd from the checkpoint's weights (BuildRequest.checkpoint), sharded over a mesh.

The checkpoint is the Hugging Face layout: config.json, model.safetensors (or shards with
model.safetensors.index.json), tensors named as transformers' LlamaForCausalLM names them.
Each module is familyd.torch.build_module of the example registry's family (deploy/registry)
with the checkpoint's prefix as both the registry's `{prefix}` and the module's fqn:

    model.embed_tokens                      embedding   model.embed_tokens.weight
    model.layers.N.input_layernorm          norm        ....input_layernorm.weight
    model.layers.N.self_attn                attention   ....self_attn.{q,k,v,o}_proj.weight
    model.layers.N.post_attention_layernorm norm        ....post_attention_layernorm.weight
    model.layers.N.mlp                      mlp         ....mlp.{gate,up,down}_proj.weight
    model.norm                              norm        model.norm.weight
    lm_head                                 embedding   lm_head.weight (model.embed_tokens.weight
                                                        when config.tie_word_embeddings)

The client deposits the checkpoint once (Client.checkpoint_token) and every module's Build
names that token; the daemon reads the files once per node straight into the shards of the
node's ranks. By default (trainable=False) every process of the node asks for the same builds,
which the daemon fills once and each process maps copy-on-write (frozen parameters: an
evaluation model, or an RLHF reference model). trainable=True makes each process a training
handout of its own rank (build_module's trainable).

Over a mesh with tp the attention heads, the MLP's intermediate dimension and the vocabulary
(embedding and head rows) are split as the registry lays them out, and forward() gathers the
head's logits over tp, so every rank returns the whole vocabulary's logits. dp replicas each
compute on the input they are given. Only dense Llama models are built here: a config with
rope_scaling, attention or MLP biases, or experts is refused with a sentence.
"""

import json
import os
from typing import Any, Dict, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from familyd.client import Client
from familyd.torch.build import build_module
from familyd.torch.distributed import JobMesh
from familyd.torch.modules._comm import copy_to_parallel

# The config fields the example registry's families read, with transformers' LlamaConfig
# defaults where it has one.
_DEFAULTS = {"rms_norm_eps": 1e-6, "initializer_range": 0.02, "rope_theta": 10000.0,
             "tie_word_embeddings": False}
_REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers",
             "intermediate_size")


class PretrainedError(ValueError):
    """A checkpoint directory or config load_pretrained cannot build (the message says why)."""


def read_config(model_dir: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """model_dir/config.json as a dict (PretrainedError when it is missing)."""
    path = os.path.join(os.fspath(model_dir), "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise PretrainedError("%s: no config.json: pass config= (the model's transformers "
                              "config as a dict)" % os.fspath(model_dir)) from None
    if not isinstance(config, dict):
        raise PretrainedError("%s is not a JSON object" % path)
    return config


def llama_config(config: Any) -> Dict[str, Any]:
    """The fields of a Llama config (a dict, or an object with attributes: a transformers
    config) that the modules and the registry read, defaults filled in; PretrainedError for a
    model this loader does not build."""
    if not isinstance(config, Mapping):
        config = config.to_dict() if hasattr(config, "to_dict") else vars(config)
    missing = [k for k in _REQUIRED if config.get(k) is None]
    if missing:
        raise PretrainedError("the model config lacks %s" % ", ".join(missing))
    for key, what in (("rope_scaling", "rope_scaling"), ("attention_bias", "attention biases"),
                      ("mlp_bias", "MLP biases"), ("num_local_experts", "experts"),
                      ("num_experts", "experts")):
        if config.get(key):
            raise PretrainedError("load_pretrained builds dense Llama models without %s; this "
                                  "config has %s=%r" % (what, key, config[key]))
    out = {k: config[k] for k in _REQUIRED}
    heads = int(out["num_attention_heads"])
    out["num_key_value_heads"] = int(config.get("num_key_value_heads") or heads)
    out["head_dim"] = int(config.get("head_dim") or int(out["hidden_size"]) // heads)
    for k, v in _DEFAULTS.items():
        out[k] = config.get(k, v) if config.get(k) is not None else v
    return out


class _GatherVocab(torch.autograd.Function):
    """All-gather of this rank's vocabulary columns of the logits over the tp group (pieces as
    the registry's shard(0) splits the vocabulary: torch.chunk's, the last ones short or
    empty); backward keeps this rank's columns of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, vocab: int, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        chunk = -(-vocab // size)
        start = min(vocab, rank * chunk)
        ctx.start, ctx.width = start, x.shape[-1]
        padded = torch.nn.functional.pad(x, (0, chunk - x.shape[-1])).contiguous()
        pieces = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(pieces, padded, group=group)
        return torch.cat(pieces, dim=-1)[..., :vocab]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad[..., ctx.start:ctx.start + ctx.width].contiguous(), None, None


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


class LlamaDecoderLayer(torch.nn.Module):
    """x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(x))."""

    def __init__(self, build: Any, prefix: str, rope_theta: float) -> None:
        super().__init__()
        self.input_layernorm = build("norm", prefix + ".input_layernorm")
        self.self_attn = build("attention", prefix + ".self_attn", rope_theta=rope_theta)
        self.post_attention_layernorm = build("norm", prefix + ".post_attention_layernorm")
        self.mlp = build("mlp", prefix + ".mlp")

    def forward(self, x: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), position_ids)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(torch.nn.Module):
    """embed_tokens, layers, norm, lm_head, each built by familyd (see the module docstring);
    forward(input_ids [B, S]) -> logits [B, S, vocab_size] on every rank. .config: the Llama
    fields used; .tp_group: the tp ProcessGroup (None without tp)."""

    def __init__(self, client: Client, checkpoint: Any, config: Mapping[str, Any],
                 mesh: Optional[JobMesh] = None, dtype: str = "float32",
                 trainable: bool = False, seed: int = 0) -> None:
        super().__init__()
        self.config = dict(config)
        sent = {k: v for k, v in self.config.items()
                if k not in ("rope_theta", "tie_word_embeddings", "num_hidden_layers")}

        def build(family: str, prefix: str, **arguments: Any) -> torch.nn.Module:
            return build_module(client, family, sent, mesh=mesh, fqn=prefix, seed=seed,
                                dtype=dtype, trainable=trainable, checkpoint=checkpoint,
                                checkpoint_prefix=prefix, **arguments)

        self.tp_group = mesh.groups.get("tp") if mesh is not None else None
        self.embed_tokens = build("embedding", "model.embed_tokens")
        theta = float(self.config["rope_theta"])
        self.layers = torch.nn.ModuleList(
            [LlamaDecoderLayer(build, "model.layers.%d" % i, theta)
             for i in range(int(self.config["num_hidden_layers"]))])
        self.norm = build("norm", "model.norm")
        # lm_head is an embedding-shaped [vocab, hidden] matrix: the embedding family, its rows
        # split over tp like the vocabulary's.
        head = "model.embed_tokens" if self.config["tie_word_embeddings"] else "lm_head"
        self.lm_head = build_module(client, "embedding", sent, mesh=mesh, fqn="lm_head",
                                    seed=seed, dtype=dtype, trainable=trainable,
                                    checkpoint=checkpoint, checkpoint_prefix=head)

    def forward(self, input_ids: torch.Tensor,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, position_ids)
        x = self.norm(x)
        head = _local(self.lm_head.weight)     # this rank's vocabulary rows
        if self.tp_group is None:
            return x @ head.t()
        logits = copy_to_parallel(x, self.tp_group) @ head.t()
        return _GatherVocab.apply(logits, int(self.config["vocab_size"]), self.tp_group)


def load_pretrained(client: Client, model_dir: Union[str, "os.PathLike[str]"],
                    mesh: Optional[JobMesh] = None, config: Any = None,
                    dtype: Optional[str] = None, trainable: bool = False,
                    seed: int = 0) -> LlamaForCausalLM:
    """A LlamaForCausalLM over this rank's shards, its weights read by the daemon from the
    safetensors files of model_dir (a directory with model.safetensors or shards and
    model.safetensors.index.json; or one .safetensors file, with config= given).

    config: the model config (a dict or a transformers config); default model_dir/config.json.
    mesh: a JobMesh (familyd.torch.job_mesh); None builds the whole model in this process.
    dtype: the parameters' dtype (float32, bfloat16, float16); default the config's
    torch_dtype when it is one of them, else float32 (a checkpoint's BF16/F16 tensors convert
    to float32 exactly; float32 ones to bfloat16 round to nearest even). trainable: False
    (default) a frozen model, one build per module shared by the node's processes, mapped
    copy-on-write; True a training handout per process (build_module). seed: only the builds'
    identity (the weights are the checkpoint's). The checkpoint is deposited once by this
    client. Raises PretrainedError for a config it does not build, OSError / CheckpointError
    for the files, FamilydError for a refused Build (a missing tensor, a shape or dtype that
    does not fit: the message names the tensor and the parameter)."""
    if config is None:
        if os.path.isdir(os.fspath(model_dir)):
            config = read_config(model_dir)
        else:
            raise PretrainedError("%s is a file: pass config=" % os.fspath(model_dir))
    fields = llama_config(config)
    if dtype is None:
        wanted = config.get("torch_dtype") if isinstance(config, Mapping) \
            else getattr(config, "torch_dtype", None)
        wanted = str(wanted).replace("torch.", "") if wanted is not None else ""
        dtype = wanted if wanted in ("float32", "bfloat16", "float16") else "float32"
    # One deposit for the whole model: build_module's Client.checkpoint_token keeps its token.
    return LlamaForCausalLM(client, os.fspath(model_dir), fields, mesh=mesh, dtype=dtype,
                            trainable=trainable, seed=seed)


__all__ = ["LlamaDecoderLayer", "LlamaForCausalLM", "PretrainedError", "llama_config",
           "load_pretrained", "read_config"]
