"""The few collective operations the trainers need (``torchrun`` / ``accelerate launch``).

Why not accelerate's ``Accelerator``: the controller is < 1M parameters and the backbone is
frozen, so all we need is gradient averaging, an all-gather of outcomes and two consistency
checks; every one of them is a no-op in a single process.
"""

from __future__ import annotations

import os

import torch

from lm_eval_ponder.errors import PonderError


class Distributed:
    """The collectives, no-ops in a single process. A context manager: the process group it
    created is destroyed on the way out (left to the interpreter's exit, gloo's threads can
    outlive it and abort a rank, ``terminate called without an active exception``)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.owns_group = self.world > 1 and not dist.is_initialized()
        if self.owns_group:
            # NCCL serves only CUDA tensors, and our collectives also run on CPU tensors
            # (controller gradients, batch checks, gathered outcomes): register gloo for the CPU
            # and NCCL for CUDA in one group, so either device works.
            backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend)

    def __enter__(self) -> "Distributed":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.barrier()  # no rank leaves (or tears down) while another still works
        if self.owns_group and self.dist.is_initialized():
            self.dist.destroy_process_group()

    def barrier(self) -> None:
        if self.world > 1:
            self.dist.barrier()

    def average_gradients(self, module: torch.nn.Module) -> None:
        if self.world > 1:
            for p in module.parameters():
                if p.grad is not None:
                    self.dist.all_reduce(p.grad)
                    p.grad /= self.world

    def assert_same(self, module: torch.nn.Module) -> None:
        """Every rank must end with the same weights (averaged gradients, same init)."""
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        self.assert_equal(flat, "ranks ended with different controllers")

    def assert_equal(self, tensor: torch.Tensor, what: str) -> None:
        """Raise unless ``tensor`` is identical on every rank (one all_reduce)."""
        if self.world > 1:
            spread = tensor.clone()
            self.dist.all_reduce(spread, op=self.dist.ReduceOp.MAX)
            if not torch.equal(spread, tensor):
                raise RuntimeError(f"internal: {what}")

    def check_batch(self, prompts_per_step: int) -> int:
        """Every rank takes an equal shard of the global batch of prompts."""
        if prompts_per_step % self.world:
            raise PonderError(f"grpo.prompts_per_step ({prompts_per_step}) must be divisible by "
                              f"the number of processes ({self.world})")
        return prompts_per_step

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world)]
        self.dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)
