"""The weight-sync group and its bucket protocol, between real processes (gloo on CPU)."""

import io
import multiprocessing
import socket

import pytest
import torch

from workers.weights.broadcast import choose_backend, join_group, plan_buckets, receive_weights, send_weights


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def example_weights() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    random = lambda *shape: torch.randn(*shape, generator=generator)
    return [
        ("embed.weight", random(50, 16)),
        ("layer.q.weight", random(16, 16).t()),  # non-contiguous on purpose
        ("layer.norm.weight", random(16).to(torch.bfloat16)),
        ("layer.k.weight", random(8, 16).to(torch.bfloat16)),
        ("head.bias", random(50).to(torch.float16)),
        ("scalar", random(())),
        ("counter", torch.arange(7)),
    ]


def with_tied_head(weights):
    """The state dict of a tied model: lm_head.weight is embed.weight under a second name."""
    return [*weights, ("lm_head.weight", weights[0][1])]


def _receiver(port: int, rank: int, world_size: int, results) -> None:
    torch.set_num_threads(1)
    group = join_group("127.0.0.1", port, rank, world_size, "gloo", timeout_s=120)
    for _ in range(2):  # the same group serves every sync
        # As bytes: a tensor put on a queue is passed as shared memory, gone once this process exits.
        buffer = io.BytesIO()
        torch.save(receive_weights(group), buffer)
        results.put(buffer.getvalue())


@pytest.mark.slow
@pytest.mark.parametrize("receivers", [1, 2])
def test_weights_arrive_bit_exact_in_every_receiver(receivers):
    port = free_port()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_receiver, args=(port, rank, receivers + 1, results))
                 for rank in range(1, receivers + 1)]
    for process in processes:
        process.start()
    try:
        group = join_group("127.0.0.1", port, 0, receivers + 1, "gloo", timeout_s=120)
        weights = with_tied_head(example_weights())
        # 200 bytes: several buckets, a tensor larger than a bucket (embed, 3.2 kB), three dtype changes.
        sent = send_weights(group, weights, bucket_bytes=200)
        # the tied head travels once, and arrives under both names
        assert sent == sum(t.numel() * t.element_size() for _, t in weights[:-1])
        doubled = [(name, tensor * 2) for name, tensor in weights]
        send_weights(group, doubled, bucket_bytes=10**6)  # a second sync, other bucket size
        for expected in [weights] * receivers + [doubled] * receivers:
            got = torch.load(io.BytesIO(results.get(timeout=120)))
            assert [name for name, _ in got] == [name for name, _ in expected]
            for (name, tensor), (_, want) in zip(got, expected):
                assert tensor.dtype == want.dtype and tensor.shape == want.shape, name
                assert torch.equal(tensor, want), name
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    assert all(process.exitcode == 0 for process in processes)


def test_buckets_hold_one_dtype_and_respect_the_size():
    specs = [("a", "float32", [10]), ("b", "float32", [10]), ("c", "float32", [10]),  # 40 bytes each
             ("d", "bfloat16", [10]), ("e", "float32", [100]), ("f", "float32", [1])]
    assert plan_buckets(specs, bucket_bytes=80) == [[0, 1], [2], [3], [4], [5]]
    assert plan_buckets(specs, bucket_bytes=10**6) == [[0, 1, 2], [3], [4, 5]]


def test_backend_is_nccl_only_with_one_gpu_per_rank():
    assert choose_backend([None, None]) == "gloo"
    assert choose_backend(["host:gpu0", "host:gpu1"]) == "nccl"
    assert choose_backend(["host:gpu0", "host:gpu0"]) == "gloo"  # colocated: NCCL refuses a shared GPU
    assert choose_backend(["host:gpu0", None]) == "gloo"


def test_a_bad_backend_or_rank_is_refused():
    with pytest.raises(ValueError, match="backend"):
        join_group("127.0.0.1", free_port(), 0, 2, "mpi")
    with pytest.raises(ValueError, match="rank 2"):
        join_group("127.0.0.1", free_port(), 2, 2, "gloo")
