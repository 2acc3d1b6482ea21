#!/usr/bin/python3
"""A second trainer process for test_torch_build.py: builds a module through familyd and,
on command, trains it in place or reads it back, so the test can watch what one process's
writes do to another's view of the same build.

    torch_build_worker.py SOCKET      (FAMILYD_DESCRIPTORS, PYTHONPATH from the test)

Reads one JSON command per line on stdin, answers one JSON line on stdout:
  {"op": "build", "family", "config", "fqn", "seed"} -> {"build_id", "shared", "pid",
      "params": {name: flat list}}
  {"op": "step"}  -> an SGD step on sum(module(x)) (an in-place optimizer write); "params"
  {"op": "read"}  -> "params"
  {"op": "exit"}  -> releases the module's build and exits 0
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def params(module):
    return {name: p.detach().reshape(-1).tolist() for name, p in module.named_parameters()}


def main(socket_path):
    import torch
    import familyd
    import familyd.torch as FT

    client = familyd.Client(socket_path)
    module = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "build":
            module = FT.build_module(client, cmd["family"], cmd["config"], fqn=cmd["fqn"],
                                     seed=cmd["seed"], trainable=cmd.get("trainable", True))
            for p in module.parameters():        # a frozen build, trained here all the same
                p.requires_grad_(True)
            info = FT.build_info(module)
            out = {"build_id": info.build_id, "shared": bool(info.build.shared),
                   "pid": os.getpid(), "params": params(module)}
        elif op == "step":
            opt = torch.optim.SGD(module.parameters(), lr=0.5)
            x = torch.ones(3, module.weight.shape[1])
            module(x).sum().backward()
            opt.step()
            out = {"params": params(module)}
        elif op == "read":
            out = {"params": params(module)}
        elif op == "exit":
            FT.release(module)
            client.close()
            print(json.dumps({"released": True}), flush=True)
            return
        else:
            raise ValueError("unknown op %r" % op)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
