#!/usr/bin/python3
"""One worker of the example job (client/python/examples/train_moe.py), with the checks the
torch-train tests need around it. Started by torchrun:

    torch_job_worker.py OUTDIR [train_moe.py arguments...]

It runs the example's own steps (setup, MoETransformer, train, validate_model) and then, while
every rank still holds its builds: rank 0 records the daemon's ListBuilds and GetStatus; every
rank records which of torchrun's variables it was started with and its pid. Then three modules
that do not fit the job are put into the live model, one at a time, and validate_model's reasons
recorded: a norm built on another mesh, grouped experts built without the job's mesh (ep 1), and
a norm of another hidden size whose weight is tied to the model's final norm. Each rank writes
OUTDIR/RANK.json.
"""

import json
import os
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "client", "python"))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "client", "python", "examples"))

# torchrun's variables (torch 1.13's elastic agent): names, and prefixes of names.
TORCHRUN_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "LOCAL_ROLE_RANK")
TORCHRUN_PREFIXES = ("TORCHELASTIC_", "ROLE_", "GROUP_")


def torchrun_variables() -> List[str]:
    return sorted(k for k in os.environ
                  if k in TORCHRUN_NAMES or k.startswith(TORCHRUN_PREFIXES))


def snapshot(client: Any) -> Dict[str, Any]:
    """The daemon's builds (id, family, variant, mesh, holders' pids, segments) and counters."""
    builds = []
    for b in client.list_builds():
        # materialised here: allocation_bytes (a training handout shows its tokens only to
        # the process that made it)
        here = [s for s in b.shards if s.allocation_bytes]
        contents = {tuple((sl.parameter, tuple(sl.global_offset), tuple(sl.local_shape))
                          for sl in s.slices) for s in here}
        builds.append({"build_id": b.build_id, "family": b.info.resolved.family,
                       "variant": b.info.resolved.variant, "mesh_id": b.info.layout.mesh_id,
                       "pids": sorted(r.pid for r in b.references), "segments": len(contents),
                       "ranks": sorted(int(s.rank) for s in here),
                       "tokens": sorted(int(s.rank) for s in b.shards if s.token),
                       "writable": b.writable, "private": b.private_build})
    status = client.call("familyd.v1.AdminService/GetStatus",
                         client.protos.cls("familyd.v1.GetStatusRequest")())
    return {"builds": builds, "fills_started": int(status.fills_started),
            "shm_bytes_in_use": int(status.shm_bytes_in_use)}


def reasons(violations: List[Any]) -> List[List[Any]]:
    return [[v.reason, list(v.fqns), v.message] for v in violations]


def misfits(client: Any, model: Any, mesh: Any, seed: int) -> Dict[str, Any]:
    """validate_model's answers with one misfit module at a time in the live model."""
    import torch
    import familyd.torch as FT
    import train_moe as T

    other = FT.job_mesh(client, mesh.job, {"dp": mesh.job.world_size})
    cases = {
        "other_mesh": lambda: FT.build_module(client, "norm", T.CONFIG, mesh=other,
                                              fqn="misfit", seed=seed),
        "ep_1": lambda: FT.build_module(client, "grouped_experts", T.CONFIG, fqn="misfit",
                                        seed=seed),
        "tied_shapes": lambda: FT.build_module(
            client, "norm", dict(T.CONFIG, hidden_size=2 * T.CONFIG["hidden_size"]),
            mesh=mesh, fqn="misfit", seed=seed),
    }
    out = {}
    for name, make in cases.items():
        misfit = make()
        if name == "tied_shapes":
            misfit.weight = model.norm.weight        # [hidden] tied into a [2 * hidden] build
        model.misfit = misfit
        try:
            out[name] = reasons(FT.validate_model(client, model, context=mesh))
        except TypeError as e:                       # Client.validate without shared_parameters
            out[name] = [["TypeError", str(e)]]
        finally:
            del model.misfit
            FT.release(misfit)
        torch.distributed.barrier()
    return out


def main(outdir: str, argv: List[str]) -> int:
    import torch.distributed as dist
    import familyd
    import familyd.torch as FT
    import train_moe as T

    seen = torchrun_variables()
    args = T.parse_args(argv)
    client = familyd.Client(args.socket)
    mesh = T.setup(client, args)
    model = T.MoETransformer(client, mesh, args.layers, args.seed)
    steps = T.train(model, mesh, args)
    violations = FT.validate_model(client, model, context=mesh)
    T.report(model, mesh, steps, violations, args)
    out: Dict[str, Any] = dict(steps, rank=mesh.job.rank, pid=os.getpid(), torchrun_env=seen,
                               violations=reasons(violations), mesh_id=mesh.mesh_id)
    dist.barrier()
    if mesh.job.rank == 0:
        out["daemon"] = snapshot(client)
    dist.barrier()
    out["misfits"] = misfits(client, model, mesh, args.seed)
    FT.release(model)
    dist.barrier()
    dist.destroy_process_group()
    client.close()
    with open(os.path.join(outdir, "%d.json" % out["rank"]), "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
