"""The collective helpers: no-ops alone, and a process group that is always torn down."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.training.distributed import Distributed


def test_single_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with Distributed() as d:
        x = torch.arange(3.0)
        assert d.gather(x) is x
        d.assert_equal(x, "never raised alone")
        assert d.check_batch(3) == 3
    assert not dist.is_initialized()


def worker(rank: int, port: str, results: str) -> None:
    os.environ.update({"WORLD_SIZE": "2", "RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": port})
    torch.set_num_threads(1)
    with Distributed() as d:
        gathered = d.gather(torch.tensor([float(rank)]))
        with pytest.raises(PonderError):
            d.check_batch(3)
    with open(f"{results}.{rank}", "w") as f:
        f.write(f"{gathered.tolist()} {dist.is_initialized()}")


def test_two_ranks_gather_and_destroy_their_group(tmp_path):
    """Each rank gathers both ranks' values and leaves the context with no process group: a
    group left to the interpreter's exit is what aborted a rank after training (gloo threads)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    mp.spawn(worker, args=(port, str(tmp_path / "out")), nprocs=2)
    for rank in (0, 1):
        assert (tmp_path / f"out.{rank}").read_text() == "[0.0, 1.0] False"
