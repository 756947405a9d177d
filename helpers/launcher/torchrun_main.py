"""Run a workbook worker function under ``torchrun``: the scale-out path of every launcher demo.

    torchrun --standalone --nproc_per_node=4 -m helpers.launcher.torchrun_main helpers.collectives:ring_check_worker
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=$NODE_RANK \\
        --rdzv_backend=c10d --rdzv_endpoint=$HEAD_NODE_ADDR:$HEAD_NODE_PORT \\
        -m helpers.launcher.torchrun_main helpers.data_parallel:ddp_train_worker --kwargs '{"steps": 5}'

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous; this module picks NCCL with
``cuda:LOCAL_RANK`` (and gloo beside it for CPU tensors, as the launcher does) when each local
rank has a GPU and gloo on the CPU otherwise, says which, calls the function, and prints each
rank's return value. The function is the same one a notebook passes to
:func:`helpers.launcher.launch`. The two-node line is the README's, run as two agents by
``tests/test_torchrun.py``; ``docs/slurm/train.sbatch`` runs it under SLURM.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
from datetime import timedelta

from . import worker


def resolve(target: str):
    """``"package.module:function"`` -> the function (ValueError when it is not of that form)."""
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"expected 'module:function', got {target!r}")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"{target!r}: {module} has no function {name!r}")
    return fn


def pick_backend(gpus: int, local_world: int) -> str:
    """NCCL when every local rank has a GPU of its own, gloo otherwise (what :func:`main` picks)."""
    return "nccl" if gpus >= local_world and gpus > 0 else "gloo"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="module:function to run on every rank")
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("RANK is not set: start this module with torchrun (see the module docstring)")
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = args.backend or pick_backend(gpus, local_world)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    worker.set_device("cuda" if backend == "nccl" else "cpu", local_rank)
    dist.init_process_group(worker.process_group_backend(backend), timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"backend={backend} device={'cuda' if backend == 'nccl' else 'cpu'} world_size={world} (torchrun)", flush=True)
    try:
        result = resolve(args.target)(**json.loads(args.kwargs))
        print(f"[rank {rank}] returned {worker.to_cpu(result)!r}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
