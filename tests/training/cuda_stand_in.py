"""``torchrun ... tests/training/cuda_stand_in.py ARGV``: ``python -m lm_eval_ponder.train ARGV``
as it runs on a CUDA machine, on the CPU.

On a GPU node the trainer's process group is built while torch reports CUDA, and NCCL serves
CUDA tensors only: a collective on a CPU tensor then fails with "No backend type associated with
device type cpu". Here, while ``Distributed`` builds its group, torch reports CUDA and the
backend string it asks for is read as torch reads it (``BackendConfig``): unless some backend
serves the CPU, the group is refused with NCCL's words, so a trainer that would fail on a GPU
node fails here too. A group that serves the CPU is then built with the backend named for the
CPU (gloo). Nothing else is patched: the backbone stays on the CPU.

Until 2026-11-27 this file registered a real CUDA-only gloo backend from Python
(``Backend.register_backend``); reading the backend string refuses the same groups with less
machinery, and keeps a Python-built backend out of the group's teardown.
"""

from __future__ import annotations

import os
import runpy
import sys
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import BackendConfig

from lm_eval_ponder.training.distributed import Distributed


def main() -> None:
    init_group = dist.init_process_group
    build = Distributed.__init__

    def init_as_on_cuda(backend=None, *args, **kwargs):
        served = BackendConfig(dist.Backend(backend)).get_device_backend_map()
        if "cpu" not in served:
            raise RuntimeError("No backend type associated with device type cpu "
                               f"(backend {backend!r} serves {sorted(served)} only)")
        return init_group(served["cpu"], *args, **kwargs)

    def build_as_on_cuda(self) -> None:
        with mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(dist, "init_process_group", init_as_on_cuda):
            build(self)

    Distributed.__init__ = build_as_on_cuda
    sys.argv = ["lm_eval_ponder.train", *sys.argv[1:]]
    try:
        runpy.run_module("lm_eval_ponder.train", run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as done:
        status = 0 if done.code is None else done.code
        if not isinstance(status, int):  # sys.exit("message"): Python prints it, status 1
            print(status, file=sys.stderr)
            status = 1
    # Leave without the interpreter's finalization. A rank aborted after the run had finished
    # and its group was destroyed ("terminate called without an active exception"): in 2 of the
    # 3 CI runs of 2026-11-27 on fresh clones and 1 of 5 first local runs, 0 of about 90 reruns.
    # The cause is not pinned down (see docs/design/training.md, "Distributed training"); what the trainer
    # does and the status it returns are unchanged, and torch's teardown is not under test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
