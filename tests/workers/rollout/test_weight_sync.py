import pytest
import torch

from workers.weights.vllm_reload import pack_weight_buckets, tensor_from_wire, tensor_to_wire


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tensor_survives_the_bytes_round_trip(dtype):
    tensor = torch.randn(3, 5).to(dtype).t()  # non-contiguous on purpose
    # msgpack delivers the tuple as a list
    name, restored = tensor_from_wire(list(tensor_to_wire("w", tensor)))
    assert name == "w"
    assert restored.dtype == dtype and restored.shape == tensor.shape
    assert torch.equal(restored, tensor)


def test_buckets_respect_the_size_limit_and_keep_order():
    named = [(f"w{i}", torch.zeros(100)) for i in range(5)]  # 400 bytes each
    buckets = pack_weight_buckets(named, bucket_bytes=900)
    assert [[item[0] for item in bucket] for bucket in buckets] == [["w0", "w1"], ["w2", "w3"], ["w4"]]


def test_a_tensor_larger_than_a_bucket_travels_alone():
    named = [("small", torch.zeros(10)), ("big", torch.zeros(1000)), ("tail", torch.zeros(10))]
    buckets = pack_weight_buckets(named, bucket_bytes=100)
    assert [[item[0] for item in bucket] for bucket in buckets] == [["small"], ["big"], ["tail"]]
