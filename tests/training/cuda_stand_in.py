"""``torchrun ... tests/training/cuda_stand_in.py ARGV``: ``python -m lm_eval_ponder.train ARGV``
as it runs on a CUDA machine, on the CPU.

On a GPU node the trainer's process group is built while torch reports CUDA, and NCCL serves
CUDA tensors only: a collective on a CPU tensor then fails with "No backend type associated with
device type cpu". Here, while ``Distributed`` builds its group, torch reports CUDA and ``nccl``
is replaced by ``cudaonly``, a gloo backend registered for the CUDA device only, so a group that
would refuse CPU tensors on a GPU node refuses them here too. Nothing else is patched: the
backbone stays on the CPU.
"""

from __future__ import annotations

import runpy
import sys
from unittest import mock

import torch
import torch.distributed as dist

from lm_eval_ponder.training.distributed import Distributed


def cuda_only_gloo(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def main() -> None:
    dist.Backend.register_backend("cudaonly", cuda_only_gloo, devices=["cuda"])
    init_group = dist.init_process_group
    build = Distributed.__init__

    def init_with_stand_in(backend=None, *args, **kwargs):
        return init_group(backend.replace("nccl", "cudaonly"), *args, **kwargs)

    def build_as_on_cuda(self) -> None:
        with mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(dist, "init_process_group", init_with_stand_in):
            build(self)

    Distributed.__init__ = build_as_on_cuda
    sys.argv = ["lm_eval_ponder.train", *sys.argv[1:]]
    runpy.run_module("lm_eval_ponder.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
