import pytest
import torch

from workers.rollout.weight_sync import SerializedTensor, pack_weight_buckets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tensor_survives_the_bytes_round_trip(dtype):
    tensor = torch.randn(3, 5).to(dtype).t()  # non-contiguous on purpose
    restored = SerializedTensor.from_tensor("w", tensor).to_tensor()
    assert restored.dtype == dtype and restored.shape == tensor.shape
    assert torch.equal(restored, tensor)


def test_buckets_respect_the_size_limit_and_keep_order():
    named = [(f"w{i}", torch.zeros(100)) for i in range(5)]  # 400 bytes each
    buckets = pack_weight_buckets(named, bucket_bytes=900)
    assert [[item.name for item in bucket] for bucket in buckets] == [["w0", "w1"], ["w2", "w3"], ["w4"]]


def test_a_tensor_larger_than_a_bucket_travels_alone():
    named = [("small", torch.zeros(10)), ("big", torch.zeros(1000)), ("tail", torch.zeros(10))]
    buckets = pack_weight_buckets(named, bucket_bytes=100)
    assert [[item.name for item in bucket] for bucket in buckets] == [["small"], ["big"], ["tail"]]
