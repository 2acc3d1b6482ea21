#!/usr/bin/python3
"""One of 4 workers (torchrun, gloo) checking activation layouts on the example job (docs/torch.md):
the example's model (client/python/examples/train_moe.py, one layer) built by familyd on the
job's mesh (dp=2,tp=2, expert view edp_shard=2,ep=2), with and without sequence parallelism.
Started as `torch_activation_worker.py --worker OUTDIR SOCKET`; writes OUTDIR/RANK.json:
{name: [ok, detail]}.

- build_module recorded each module's Build layout (the attention's in_src is shard(-2) over tp
  with sequence parallelism, replicate without) and validate_model finds nothing;
- the attention's recorded layout changed after the build (its in_src): Validate refuses it
  with the exact sentence, and validate_model reports the embedding before it as a neighbour
  whose out_dst disagrees;
- a vocab-parallel embedding followed by another (the head) on the sequence-parallel mesh:
  the first hands on its piece of the sequence, the second takes the whole token ids, which
  validate_model reports with the exact sentence.
"""

import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "client", "python"))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "client", "python", "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import familyd  # noqa: E402
import familyd.torch as FT  # noqa: E402
from familyd.torch import validate as V  # noqa: E402
import train_moe  # noqa: E402

TP = [{"placements": [{"axis": "tp", "kind": "replicate"}]}]
TP_SEQ = [{"placements": [{"axis": "tp", "kind": "shard", "dim": "-2"}]}]


def found(violations):
    return [[v.reason, list(v.fqns), v.message] for v in violations]


def check_job(client, job, sp, out):
    name = "sp" if sp else "plain"
    mesh = FT.job_mesh(client, job, {"dp": 2, "tp": 2}, {"edp_shard": 2, "ep": 2},
                       sequence_parallel=sp)
    model = train_moe.MoETransformer(client, mesh, 1, 7)
    try:
        attn = model.layers[0].attn
        recorded = FT.activation_layout(attn)
        want_in = TP_SEQ if sp else TP
        out[name + "_recorded"] = [
            recorded is not None and recorded.get("inSrc") == want_in
            and recorded.get("isBoundary") is True
            and recorded == V.applied_layout(attn).get("activations"), str(recorded)]
        got = found(FT.validate_model(client, model, context=mesh))
        out[name + "_clean"] = [got == [], str(got)]

        changed = dict(recorded, inSrc=TP if sp else TP_SEQ)
        FT.set_activation_layout(attn, changed)
        got = found(FT.validate_model(client, model, context=mesh))
        want = [["ACTIVATION_LAYOUT_CONFLICT", ["layers.0.attn"],
                 "in_src at 'layers.0.attn' conflicts with its constructed family layout"],
                ["ACTIVATION_NEIGHBOUR_MISMATCH", ["embed", "layers.0.attn"],
                 "out_dst at 'embed' %s disagrees with in_src at 'layers.0.attn' %s, the next "
                 "component" % (("[{tp: shard(-2)}]", "[{tp: replicate}]") if sp
                                else ("[{tp: replicate}]", "[{tp: shard(-2)}]"))]]
        out[name + "_changed"] = [got == want, str(got)]
    finally:
        FT.release(model)

    if sp:
        pair = torch.nn.Module()
        pair.embed = FT.build_module(client, "embedding", train_moe.CONFIG, mesh=mesh,
                                     fqn="embed", seed=7)
        pair.head = FT.build_module(client, "embedding", train_moe.CONFIG, mesh=mesh,
                                    fqn="head", seed=7)
        try:
            got = found(FT.validate_model(client, pair, context=mesh))
            want = [["ACTIVATION_NEIGHBOUR_MISMATCH", ["embed", "head"],
                     "out_dst at 'embed' [{tp: shard(-2)}] disagrees with in_src at 'head' "
                     "[{tp: replicate}], the next component"]]
            out["sp_neighbours"] = [got == want, str(got)]
        finally:
            FT.release(pair)


def main(outdir, socket_path):
    client = familyd.Client(socket_path)
    job = FT.init(client)
    out = {}
    for sp in (False, True):
        try:
            check_job(client, job, sp, out)
        except Exception:
            out["job_sp" if sp else "job_plain"] = [False, traceback.format_exc()]
        dist.barrier()
    dist.destroy_process_group()
    client.close()
    with open(os.path.join(outdir, "%d.json" % job.rank), "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "--worker":
        sys.exit("usage: torch_activation_worker.py --worker OUTDIR SOCKET")
    sys.exit(main(sys.argv[2], sys.argv[3]))
