"""zerocourse.comm: every op's recorded bytes against hand-computed values, N = 2, 3, 4."""
import pytest
import torch
import torch.distributed as dist

from zerocourse import launch
from zerocourse.comm import CommTracer, ring_bytes_sent


def _every_op(rank, world_size):
    n = world_size
    with CommTracer(include_barrier=True) as tr:
        t = torch.ones(6, dtype=torch.float32)                     # S = 24 B
        dist.all_reduce(t)
        dist.broadcast(torch.ones(5, dtype=torch.bfloat16), src=1)  # S = 10 B
        out = torch.empty(3 * n, dtype=torch.float64)
        dist.all_gather_into_tensor(out, torch.ones(3, dtype=torch.float64))  # S = 24n B
        dist.all_gather([torch.empty(2) for _ in range(n)], torch.ones(2))      # S = 8n B
        shard = torch.empty(4, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(shard, torch.ones(4 * n, dtype=torch.bfloat16))  # S = 8n B
        dist.reduce_scatter(torch.empty(1), [torch.ones(1) for _ in range(n)])     # S = 4n B
        x = torch.ones(7)                                           # S = 28 B
        if rank == 0:
            dist.send(x, dst=1)
        elif rank == 1:
            dist.recv(x, src=0)
        dist.barrier()
    return [(r["op"], r["dtype"], r["numel"], r["full_bytes"], r["sent_bytes"])
            for r in tr.summary()["records"]], tr.calls(), tr.sent_bytes


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_op_matches_the_ring_model(n):
    f = (n - 1) / n
    for rank, (records, calls, total) in enumerate(launch(_every_op, n)):
        bcast = 0.0 if (rank - 1) % n == n - 1 else 10.0
        expected = [
            ("all_reduce", "torch.float32", 6, 24, 2 * f * 24),
            ("broadcast", "torch.bfloat16", 5, 10, bcast),
            ("all_gather", "torch.float64", 3 * n, 24 * n, f * 24 * n),
            ("all_gather", "torch.float32", 2 * n, 8 * n, f * 8 * n),
            ("reduce_scatter", "torch.bfloat16", 4 * n, 8 * n, f * 8 * n),
            ("reduce_scatter", "torch.float32", n, 4 * n, f * 4 * n),
        ]
        if rank == 0:
            expected.append(("send", "torch.float32", 7, 28, 28.0))
        elif rank == 1:
            expected.append(("recv", "torch.float32", 7, 28, 0.0))
        expected.append(("barrier", "", 0, 0, 0.0))
        assert len(records) == len(expected), (rank, records)
        for got, exp in zip(records, expected):
            assert got[:4] == exp[:4], (rank, got, exp)
            assert got[4] == pytest.approx(exp[4]), (rank, got, exp)
        assert total == pytest.approx(sum(e[4] for e in expected))
        assert calls["all_gather"] == 2 and calls["reduce_scatter"] == 2


def _ddp_step(rank, world_size):
    model = torch.nn.Linear(10, 3)                                 # 33 params, fp32
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    with CommTracer() as tr:
        ddp(torch.ones(2, 10)).sum().backward()
    return tr.calls(), tr.sent_bytes


def test_tracer_sees_collectives_issued_by_torch_itself():
    """DDP all-reduces from C++; the tracer sits below torch.distributed and still sees it."""
    for calls, sent in launch(_ddp_step, 2):
        assert calls == {"all_reduce": 1}
        assert sent == pytest.approx(2 * 1 / 2 * 33 * 4)


def test_tracer_records_nothing_outside_its_block():
    def fn(rank, world_size):
        dist.all_reduce(torch.ones(1))
        with CommTracer() as tr:
            pass
        dist.all_reduce(torch.ones(1))
        return tr.calls()
    assert launch(fn, 2) == [{}, {}]


def test_ring_formula_edge_cases():
    assert ring_bytes_sent("all_reduce", 100, 1) == 0
    assert ring_bytes_sent("all_reduce", 100, 4) == 150
    assert ring_bytes_sent("all_gather", 100, 4) == 75
    assert ring_bytes_sent("broadcast", 100, 4, rank=2, root=3) == 0   # last in ring order
    assert ring_bytes_sent("broadcast", 100, 4, rank=3, root=3) == 100
    with pytest.raises(ValueError, match="unknown op"):
        ring_bytes_sent("allreduce", 1, 2)
