#!/usr/bin/python3
"""train_moe.py: a small MoE transformer, every module built by familyd, trained with AdamW.

The model: a vocab-parallel embedding, --layers blocks of (RMSNorm, tensor-parallel attention,
RMSNorm, a router and expert-parallel grouped experts), a final RMSNorm and a vocab-parallel
head. Each of those modules is familyd.torch.build_module on ONE mesh: the device view
dp x tp and the expert view edp_shard x ep (dp=2,tp=2 and edp_shard=2,ep=2 at 4 ranks). The
daemon builds each module once per node and fills it with the registry's init, seeded per
module (derive_seed(--seed, fqn)); every process binds its own rank's shard, copy-on-write.
The router is a plain torch Linear, initialised from the same per-fqn seed on every rank.

Parallelism, and who does what:
  tp  inside the modules (attention heads, vocabulary rows), plus the head's logits gathered
      over tp here;
  ep  inside the grouped experts (tokens sent to their experts' ranks). The ranks of one tp
      group hold the same tokens, so before the experts each takes its own slice of them and
      the outputs are gathered back (every token goes to the experts once);
  dp  this script: each dp rank trains on its part of the global batch, and the gradients are
      averaged over dp (over edp_shard for the experts' parameters, laid out on the expert
      view) before AdamW steps.

--sequence-parallel makes the mesh say sequence_parallel: outside attention each tp rank
holds its piece of the sequence (the embedding reduce-scatters, attention all-gathers and
reduce-scatters, the norms are the registry's sequence-parallel member); the experts then
take the rank's own tokens as they are, and the head gathers the sequence. --loss-parallel
makes it say loss_parallel: the head's logits stay split over the vocabulary and the loss is
familyd.torch.vocab_parallel_cross_entropy. Either prints the same losses.

Run it under torchrun, 4 processes on one node:

    torchrun --standalone --nproc-per-node 4 client/python/examples/train_moe.py \\
        --socket run/familyd.sock --steps 3

or whole, in one plain process (no torch.distributed: the same model unsharded, the whole
global batch). familyd's fill is the same on every layout, so it prints the same losses:

    python3 client/python/examples/train_moe.py --unsharded --socket run/familyd.sock --steps 3

It prints one line per step with the dp-mean loss and the gradient norm (both layout-invariant),
then the Validate result of the live model.
"""

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

try:
    import familyd
except ImportError:   # run from a checkout without installing the package: client/python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import familyd
import familyd.torch as FT  # noqa: E402

CONFIG = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "moe_intermediate_size": 16,
          "initializer_range": 0.02, "rms_norm_eps": 1e-6}
TOP_K = 2
ROPE_THETA = 10000.0


# --- the collectives this script adds (tp's and ep's own are inside the modules) ------------

class _CopyToGroup(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the group (each rank holds a part)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Gather(torch.autograd.Function):
    """All-gather along `dim` (equal pieces); backward keeps this rank's piece of the gradient
    (every rank computes the same loss from the gathered tensor)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(size, dim=ctx.dim)[rank].contiguous(), None, None


class _Split(torch.autograd.Function):
    """This rank's piece along `dim` (the inverse of _Gather); backward gathers the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        return x.chunk(size, dim=dim)[rank].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        pieces = [torch.empty_like(grad) for _ in range(dist.get_world_size(ctx.group))]
        dist.all_gather(pieces, grad.contiguous(), group=ctx.group)
        return torch.cat(pieces, dim=ctx.dim), None, None


def split(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group is None else _Split.apply(x, 0, group)


def gather(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    return x if group is None else _Gather.apply(x, dim, group)


# --- the model ------------------------------------------------------------------------------

def seeded_router(hidden: int, experts: int, seed: int, fqn: str) -> torch.nn.Linear:
    """A plain Linear router, normal(0, 0.02) from the module's own seed: the same weights on
    every rank and in the unsharded run."""
    router = torch.nn.Linear(hidden, experts, bias=False)
    generator = torch.Generator().manual_seed(FT.derive_seed(seed, fqn) % 2 ** 63)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=generator) * 0.02)
    return router


class MoEBlock(torch.nn.Module):
    """x + attn(norm(x)), then + experts(norm(x)) routed top-k."""

    def __init__(self, build: Any, seed: int, fqn: str, tp_group: Any,
                 sequence_parallel: bool) -> None:
        super().__init__()
        self.attn_norm = build("norm", fqn + ".attn_norm")
        self.attn = build("attention", fqn + ".attn", rope_theta=ROPE_THETA)
        self.moe_norm = build("norm", fqn + ".moe_norm")
        self.router = seeded_router(CONFIG["hidden_size"], CONFIG["num_experts"], seed,
                                    fqn + ".router")
        self.experts = build("grouped_experts", fqn + ".experts")
        self.tp_group = tp_group
        self.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        h = self.moe_norm(x).reshape(-1, x.shape[-1])
        if self.sequence_parallel:
            # Each tp rank holds its own piece of the sequence: its tokens go to the experts as
            # they are, and the router, seeing only them, sums its gradient over tp.
            router = self.router.weight
            if self.tp_group is not None:
                router = _CopyToGroup.apply(router, self.tp_group)
            weights, chosen = torch.softmax(F.linear(h, router), dim=-1).topk(TOP_K, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
            return x + self.experts(h, chosen, weights).reshape(x.shape)
        weights, chosen = torch.softmax(self.router(h), dim=-1).topk(TOP_K, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        # The tp group's ranks hold the same tokens: each sends its own slice to the experts.
        y = self.experts(split(h, self.tp_group), split(chosen, self.tp_group),
                         split(weights, self.tp_group))
        return x + gather(y, 0, self.tp_group).reshape(x.shape)


class MoETransformer(torch.nn.Module):
    def __init__(self, client: Any, mesh: Optional[FT.JobMesh], layers: int, seed: int) -> None:
        super().__init__()

        def build(family: str, fqn: str, **arguments: Any) -> torch.nn.Module:
            return FT.build_module(client, family, CONFIG, mesh=mesh, fqn=fqn, seed=seed,
                                   **arguments)

        self.tp_group = mesh.groups.get("tp") if mesh is not None else None
        # The job's flags, as the mesh says them (ParallelContext, from familyd's mesh).
        self.sequence_parallel = mesh is not None and mesh.context.sequence_parallel
        self.loss_parallel = mesh is not None and mesh.context.loss_parallel
        self.embed = build("embedding", "embed")
        self.layers = torch.nn.ModuleList(
            [MoEBlock(build, seed, "layers.%d" % i, self.tp_group, self.sequence_parallel)
             for i in range(layers)])
        self.norm = build("norm", "norm")
        self.head = build("embedding", "head")       # [vocab, hidden], rows sharded over tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The logits: [B, S, vocab], or with loss parallelism this rank's vocabulary columns
        (the head's rows, from self.head.vocab_start)."""
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        head = self.head.weight       # a DTensor on a mesh: this rank's vocabulary rows
        head = head.to_local() if isinstance(head, DTensor) else head
        if self.tp_group is None:
            return x @ head.t()
        if self.sequence_parallel:    # the whole sequence; the gradient reduce-scattered back
            x = FT.gather_sequence(x, self.tp_group)
        else:
            x = _CopyToGroup.apply(x, self.tp_group)
        logits = x @ head.t()
        if self.loss_parallel:
            return logits             # never gathered: vocab_parallel_cross_entropy
        return gather(logits, -1, self.tp_group)     # this rank's vocabulary rows, then all

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.loss_parallel and self.tp_group is not None:
            return FT.vocab_parallel_cross_entropy(logits, targets, self.tp_group,
                                                   vocab_start=self.head.vocab_start)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- training -------------------------------------------------------------------------------

def batches(seed: int, steps: int, global_batch: int, seq: int) -> List[torch.Tensor]:
    """The global batch of every step: the same tokens on every run of the same seed."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CONFIG["vocab_size"], (global_batch, seq + 1), generator=generator)
            for _ in range(steps)]


def layout_of(model: torch.nn.Module) -> Dict[int, Any]:
    """id(parameter) -> its familyd.v1.ParameterLayout, for the parameters familyd built."""
    out: Dict[int, Any] = {}
    for module in model.modules():
        info = FT.build_info(module)
        if info is not None:
            owned = dict(module.named_parameters())
            for p in info.layout.parameters:
                out[id(owned[p.name])] = p
    return out


def local_grad(p: torch.Tensor) -> Optional[torch.Tensor]:
    """A parameter's gradient on this rank: a DTensor parameter's (build_module's) local shard
    of it, the same storage; a plain parameter's (the router's) as it is."""
    g = p.grad
    return g.to_local() if isinstance(g, DTensor) else g


def average_gradients(model: torch.nn.Module, mesh: FT.JobMesh) -> None:
    """Gradients averaged over the data-parallel replicas: dp, or edp_shard for parameters laid
    out on the expert view. tp and ep need nothing more: their modules did it."""
    layouts = layout_of(model)
    for p in model.parameters():
        layout = layouts.get(id(p))
        expert = layout is not None and layout.mesh_view == "expert"
        group = mesh.groups.get("edp_shard" if expert else "dp")
        grad = local_grad(p)
        if grad is not None and group is not None:
            dist.all_reduce(grad, group=group)
            grad /= dist.get_world_size(group)


def gradient_norm(model: torch.nn.Module, mesh: Optional[FT.JobMesh]) -> float:
    """The norm of the whole model's gradient (what clip_grad_norm_ would clip): each
    parameter's squares summed over the axes its layout shards it on, replicas counted once."""
    layouts = layout_of(model)
    by_axes: Dict[Any, torch.Tensor] = {}
    for p in model.parameters():
        grad = local_grad(p)
        if grad is not None:
            layout = layouts.get(id(p))
            axes = tuple(x.axis for x in layout.placements if x.kind != "replicate") \
                if layout is not None else ()
            by_axes[axes] = by_axes.get(axes, torch.zeros(())) + grad.double().pow(2).sum()
    total = torch.zeros((), dtype=torch.float64)
    for axes, squares in by_axes.items():
        for axis in axes:
            group = mesh.groups.get(axis) if mesh is not None else None
            if group is not None:
                dist.all_reduce(squares, group=group)
        total += squares
    return float(total.sqrt())


def train(model: torch.nn.Module, mesh: Optional[FT.JobMesh],
          args: Any) -> Dict[str, List[float]]:
    """--steps of AdamW; each dp rank takes its rows of the global batch. The dp-mean loss and
    the gradient norm of every step."""
    dp_group = mesh.groups.get("dp") if mesh is not None else None
    dp = dist.get_world_size(dp_group) if dp_group is not None else 1
    dp_rank = dist.get_rank(dp_group) if dp_group is not None else 0
    rows = args.batch // dp
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, norms = [], []
    for step, tokens in enumerate(batches(args.seed, args.steps, args.batch, args.seq)):
        tokens = tokens[dp_rank * rows:(dp_rank + 1) * rows]
        logits = model(tokens[:, :-1])
        loss = model.loss(logits, tokens[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        if mesh is not None:
            average_gradients(model, mesh)
        norms.append(gradient_norm(model, mesh))
        optimizer.step()
        mean = loss.detach().clone()
        if dp_group is not None:
            dist.all_reduce(mean, group=dp_group)
            mean /= dp
        losses.append(float(mean))
        if mesh is None or mesh.job.rank == 0:
            print("step %d loss %.6f grad_norm %.6f" % (step, losses[-1], norms[-1]), flush=True)
    return {"losses": losses, "grad_norms": norms}


# --- the job --------------------------------------------------------------------------------

def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", help="the node's familyd API socket (default $FAMILYD_SOCKET)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    p.add_argument("--ep", type=int, default=2, help="expert-parallel size (default 2)")
    p.add_argument("--batch", type=int, default=4, help="global batch, in sequences")
    p.add_argument("--seq", type=int, default=8, help="tokens per sequence")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="the mesh says sequence_parallel: activations split over the sequence "
                        "across tp outside attention")
    p.add_argument("--loss-parallel", action="store_true",
                   help="the mesh says loss_parallel: the loss from the logits split over the "
                        "vocabulary, never gathered")
    p.add_argument("--unsharded", action="store_true",
                   help="one plain process, the whole model and the whole global batch")
    p.add_argument("--json", metavar="FILE",
                   help="write the losses, gradient norms and build ids here")
    return p.parse_args(argv)


def setup(client: Any, args: argparse.Namespace) -> Optional[FT.JobMesh]:
    """torch.distributed and the job's mesh: dp x tp, expert view edp_shard x ep (None with
    --unsharded)."""
    if args.unsharded:
        return None
    job = FT.init(client)
    world = job.world_size
    refusal = None
    if world % args.tp or world % args.ep:
        refusal = "%d ranks do not split into tp=%d and ep=%d" % (world, args.tp, args.ep)
    elif args.batch % (world // args.tp):
        refusal = "--batch %d does not split over dp=%d" % (args.batch, world // args.tp)
    elif (args.batch // (world // args.tp)) * args.seq % args.tp:
        refusal = "a dp rank's tokens do not split over tp=%d" % args.tp
    elif CONFIG["vocab_size"] % args.tp:
        refusal = "the head's vocabulary does not split evenly over tp=%d" % args.tp
    elif args.sequence_parallel and args.seq % args.tp:
        refusal = "--seq %d does not split over tp=%d" % (args.seq, args.tp)
    if refusal is not None:         # every rank refuses: leave torch.distributed together
        dist.barrier()
        dist.destroy_process_group()
        raise SystemExit("train_moe: " + refusal)
    return FT.job_mesh(client, job, {"dp": world // args.tp, "tp": args.tp},
                       {"edp_shard": world // args.ep, "ep": args.ep},
                       sequence_parallel=args.sequence_parallel,
                       loss_parallel=args.loss_parallel)


def build_ids(model: torch.nn.Module, mesh: Optional[FT.JobMesh]) -> Dict[str, List[str]]:
    """fqn -> the build id of every torch rank (one rank when unsharded)."""
    mine = {FT.build_info(m).fqn: FT.build_info(m).build_id  # type: ignore[union-attr]
            for m in model.modules() if FT.build_info(m) is not None}
    every: List[Any] = [mine]
    if mesh is not None:
        every = [None] * mesh.job.world_size
        dist.all_gather_object(every, mine)
    return {fqn: [ids[fqn] for ids in every] for fqn in mine}


def report(model: torch.nn.Module, mesh: Optional[FT.JobMesh], steps: Dict[str, List[float]],
           violations: List[Any], args: argparse.Namespace) -> None:
    ids = build_ids(model, mesh)
    if mesh is not None and mesh.job.rank != 0:
        return
    print("validate: %s" % ("ok" if not violations else "; ".join(
        "%s %s: %s" % (v.reason, list(v.fqns), v.message) for v in violations)), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            variants = {FT.build_info(m).fqn: FT.build_info(m).member.variant  # type: ignore
                        for m in model.modules() if FT.build_info(m) is not None}
            json.dump(dict(steps, builds=ids, variants=variants,
                           mesh_id=mesh.mesh_id if mesh is not None else "",
                           violations=[v.reason for v in violations]), f, indent=1)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    client = familyd.Client(args.socket)
    mesh = setup(client, args)
    model = MoETransformer(client, mesh, args.layers, args.seed)
    steps = train(model, mesh, args)
    violations = FT.validate_model(client, model, context=mesh)
    report(model, mesh, steps, violations, args)
    FT.release(model)
    if mesh is not None:
        dist.barrier()
        dist.destroy_process_group()
    client.close()
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
