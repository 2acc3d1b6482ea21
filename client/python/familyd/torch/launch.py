"""python3 -m familyd.torch.launch: start one node's workers of a job as torchrun starts them.

Debian 12's `python3 -m torch.distributed.run` (torch 1.13 on Python 3.11) dies before it
starts any worker, so this launcher does what torchrun does for a static job: it starts
--nproc-per-node copies of `python3 SCRIPT ARGS...`, each with torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and the
TORCHELASTIC_* and ROLE_* variables torchrun sets; with --minimal-env only the six that
familyd.torch.init reads) on top of the launcher's own; waits for them; and when one fails
it terminates the others (SIGTERM, then SIGKILL after --kill-timeout seconds), as torchrun does,
unless --keep-going. Its exit status is 0 when every worker succeeded, else the first failure's
(128 + N for a worker killed by signal N). A job written for torchrun runs under it unchanged.

Ranks are static: node K's workers are ranks K * N to K * N + N - 1 (torchrun's rendezvous may
order nodes differently; familyd.torch.init lays the mesh over whatever order torch has).
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

INIT_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def worker_env(rank: int, local_rank: int, nproc: int, nnodes: int, node_rank: int,
               master_addr: str, master_port: int, minimal: bool) -> Dict[str, str]:
    """The torchrun variables of one worker (only init()'s six when minimal)."""
    env = {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(nproc * nnodes),
           "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": master_addr,
           "MASTER_PORT": str(master_port)}
    if not minimal:
        env.update({"GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": str(nnodes),
                    "ROLE_RANK": str(rank), "ROLE_NAME": "default",
                    "ROLE_WORLD_SIZE": str(nproc * nnodes), "TORCHELASTIC_RUN_ID": "none",
                    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                    "TORCHELASTIC_USE_AGENT_STORE": "False"})
    return env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m familyd.torch.launch",
        description="Start this node's workers of a job with torchrun's environment.")
    p.add_argument("--nproc-per-node", type=int, required=True, metavar="N",
                   help="workers on this node")
    p.add_argument("--nnodes", type=int, default=1, metavar="M", help="nodes in the job (1)")
    p.add_argument("--node-rank", type=int, default=0, metavar="K",
                   help="this node's index in [0, M) (0)")
    p.add_argument("--master-addr", default="127.0.0.1",
                   help="address of rank 0's TCP store (127.0.0.1)")
    p.add_argument("--master-port", type=int, default=29500, help="its port (29500)")
    p.add_argument("--minimal-env", action="store_true",
                   help="set only RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, "
                        "MASTER_PORT of torchrun's variables")
    p.add_argument("--keep-going", action="store_true",
                   help="when a worker fails, let the others run to their own end")
    p.add_argument("--kill-timeout", type=float, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping workers (5)")
    p.add_argument("script", help="the worker's Python script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.nproc_per_node < 1:
        p.error("--nproc-per-node must be at least 1")
    if a.nnodes < 1:
        p.error("--nnodes must be at least 1")
    if not 0 <= a.node_rank < a.nnodes:
        p.error("--node-rank must be in [0, %d)" % a.nnodes)
    if not 0 < a.master_port < 65536:
        p.error("--master-port must be in [1, 65535]")
    if not os.path.isfile(a.script):
        p.error("%s: no such file" % a.script)


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def _stop(procs: Sequence[subprocess.Popen], timeout: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(argv: Optional[List[str]] = None) -> int:
    """The launcher: starts, watches and reaps the workers; returns the exit status."""
    p = _parser()
    a = p.parse_args(argv)
    _check(p, a)
    procs = []
    base = dict(os.environ)
    for name in INIT_ENV + ("GROUP_RANK",):
        base.pop(name, None)
    for local in range(a.nproc_per_node):
        env = dict(base)
        env.update(worker_env(a.node_rank * a.nproc_per_node + local, local, a.nproc_per_node,
                              a.nnodes, a.node_rank, a.master_addr, a.master_port,
                              a.minimal_env))
        procs.append(subprocess.Popen([sys.executable, a.script] + a.args, env=env))
    first = 0

    def forward(signum: int, _frame: object) -> None:
        for q in procs:
            if q.poll() is None:
                q.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    running = list(procs)
    while running:
        time.sleep(0.05)
        ended = [q for q in running if q.poll() is not None]
        running = [q for q in running if q not in ended]
        failed = [q for q in ended if q.returncode != 0]
        if failed and first == 0:
            q = failed[0]
            first = _status(q.returncode)
            sys.stderr.write("familyd.torch.launch: worker %d (pid %d) exited with %d%s\n"
                             % (procs.index(q), q.pid, first,
                                "" if a.keep_going else "; stopping the others"))
            if not a.keep_going:
                _stop(running, a.kill_timeout)
                running = []
    return first


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
