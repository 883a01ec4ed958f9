"""Acceptance: vLLM's logprobs after an in-place weight update equal transformers' with the same weights."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from workers.models.char_tokenizer import VOCAB
from workers.rollout.config import RolloutConfig
from workers.rollout.engine import RolloutEngine
from workers.weights.vllm_reload import send_weights_via_rpc

pytestmark = pytest.mark.slow  # every test here starts a vLLM engine

TEMPERATURE = 0.7
PROMPT = [VOCAB[c] for c in "23+45="]
TOLERANCE = 1e-4  # fp32 on both sides; measured differences are ≈1e-6
# Longer than one KV block (128 tokens on CPU), so that vLLM's prefix cache holds a full block of it.
LONG_PROMPT_TOKENS = 160


def transformers_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each response token, teacher-forced: what the learner computes."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]


def transformers_argmax(model, prompt: list[int], response: list[int]) -> list[int]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        return model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()


def perturbed(model, seed: int, scale: float = 0.05):
    new_model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in new_model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return new_model


@pytest.fixture(scope="module")
def old_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    config = RolloutConfig(temperature=TEMPERATURE, max_new_tokens=24, max_prompt_tokens=LONG_PROMPT_TOKENS)
    engine = RolloutEngine(tiny_model_dir, config)
    yield engine
    engine.shutdown()


def assert_close(vllm_values, expected: torch.Tensor) -> None:
    difference = (torch.tensor(vllm_values) - expected).abs().max().item()
    assert difference < TOLERANCE, f"max |vLLM - transformers| = {difference}"


def test_sampled_logprobs_are_at_the_sampling_temperature(engine, old_model):
    for sample in engine.generate([PROMPT], n=4):
        expected = transformers_logprobs(old_model, PROMPT, sample.response_ids, TEMPERATURE)
        assert_close(sample.response_logprobs, expected)
        at_temperature_one = transformers_logprobs(old_model, PROMPT, sample.response_ids, 1.0)
        assert (torch.tensor(sample.response_logprobs) - at_temperature_one).abs().max() > 1e-2


def test_update_weights_in_place_matches_transformers(engine, old_model):
    new_model = perturbed(old_model, seed=0)
    seconds = engine.update_weights(new_model.state_dict())
    assert 0 < seconds < 5

    for sample in engine.generate([PROMPT], n=4):
        new = transformers_logprobs(new_model, PROMPT, sample.response_ids, TEMPERATURE)
        assert_close(sample.response_logprobs, new)
        old = transformers_logprobs(old_model, PROMPT, sample.response_ids, TEMPERATURE)
        assert (torch.tensor(sample.response_logprobs) - old).abs().max() > 1e-2, "weights did not change"
        assert_close(
            engine.sequence_logprobs(PROMPT, sample.response_ids),
            transformers_logprobs(new_model, PROMPT, sample.response_ids, 1.0),
        )

    (greedy,) = engine.generate([PROMPT], n=1, greedy=True)
    assert greedy.response_ids == transformers_argmax(new_model, PROMPT, greedy.response_ids)

    # And back: the old weights give the old logprobs again (no state left over from the first update).
    engine.update_weights(list(old_model.state_dict().items()))
    assert_close(
        engine.sequence_logprobs(PROMPT, greedy.response_ids),
        transformers_logprobs(old_model, PROMPT, greedy.response_ids, 1.0),
    )


def test_bucketed_update_through_the_worker_extension(engine, old_model):
    """The route used when vLLM runs its workers in other processes (CUDA): bytes via collective_rpc."""
    new_model = perturbed(old_model, seed=1)
    state = list(new_model.state_dict().items())
    send_weights_via_rpc(engine.llm, state, bucket_bytes=64 * 1024)  # several buckets for this model
    engine.llm.reset_prefix_cache()

    (greedy,) = engine.generate([PROMPT], n=1, greedy=True)
    assert greedy.response_ids == transformers_argmax(new_model, PROMPT, greedy.response_ids)
    assert_close(
        engine.sequence_logprobs(PROMPT, greedy.response_ids),
        transformers_logprobs(new_model, PROMPT, greedy.response_ids, 1.0),
    )


def test_update_invalidates_cached_prefix_blocks(engine, old_model):
    """A prompt whose KV blocks were cached under the old weights must be recomputed after an update."""
    long_prompt = [VOCAB[c] for c in ("12+34=46 " * 20)[:LONG_PROMPT_TOKENS]]
    engine.update_weights(old_model.state_dict())
    engine.generate([long_prompt], n=1)  # fills the prefix cache with old-weight KV blocks

    new_model = perturbed(old_model, seed=2)
    engine.update_weights(new_model.state_dict())
    (sample,) = engine.generate([long_prompt], n=1)
    assert_close(
        sample.response_logprobs,
        transformers_logprobs(new_model, long_prompt, sample.response_ids, TEMPERATURE),
    )


def _learner_process(model_dir, port: int, response: list[int], results) -> None:
    """A real LearnerEngine (DeepSpeed, one gloo rank) in its own process: perturbs its weights, then
    broadcasts them as rank 0 of the weight-sync group and reports its own logprobs of ``response``."""
    import socket

    from workers.learner.batch import TrainBatch
    from workers.learner.config import LearnerConfig
    from workers.learner.engine import LearnerEngine, init_process_group
    from workers.learner.losses import PolicyLossConfig
    from workers.learner.selection import SelectionConfig
    from workers.weights.broadcast import join_group

    torch.set_num_threads(1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        learner_port = probe.getsockname()[1]
    init_process_group(0, 1, "127.0.0.1", learner_port)
    # T = 1: compared with vLLM's prompt logprobs, which never pass through the sampler.
    learner = LearnerEngine(model_dir, LearnerConfig(mini_batch_size=8, micro_batch_size=8), PolicyLossConfig(),
                            SelectionConfig(), temperature=1.0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in learner.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    learner.weight_group = join_group("127.0.0.1", port, 0, 2, "gloo", timeout_s=300)
    sent = learner.broadcast_weights(bucket_bytes=64 * 1024)  # several buckets for this model
    scored = learner.compute_reference_stats(TrainBatch.from_lists([PROMPT], [response], [0.0], [0], pad_id=0))
    results.put((sent, scored.old_logp[0].tolist()))


def test_collective_update_from_a_learner_process_matches_the_learner(engine, old_model, tiny_model_dir):
    """The collective route: a real LearnerEngine in another process broadcasts over gloo straight into
    this in-process vLLM worker, which then scores like the learner."""
    assert engine.weight_sync_route() == "in_process"  # 'auto' on CPU; the collective calls work on any engine
    import multiprocessing
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    response = [VOCAB[c] for c in "68"] + [VOCAB["<eos>"]]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    learner = context.Process(target=_learner_process, args=(tiny_model_dir, port, response, results))
    learner.start()
    try:
        engine.join_weight_sync_group("127.0.0.1", port, 1, 2, "gloo")
        seconds = engine.receive_weights()
        sent, learner_logprobs = results.get(timeout=300)
    finally:
        learner.join(timeout=120)
        if learner.is_alive():
            learner.kill()
    assert learner.exitcode == 0
    # Tied embeddings travel once: the bytes are those of the parameters, not of the state dict's aliases.
    assert sent == sum(p.numel() * 4 for p in old_model.parameters())
    assert 0 < seconds < 300
    vllm_logprobs = engine.sequence_logprobs(PROMPT, response)
    assert_close(vllm_logprobs, torch.tensor(learner_logprobs))
    old = transformers_logprobs(old_model, PROMPT, response, 1.0)
    assert (torch.tensor(vllm_logprobs) - old).abs().max() > 1e-2, "weights did not change"


def test_torch_linear_engine_keeps_its_weights_unpacked_and_matches_transformers_after_updates(tiny_model_dir,
                                                                                             old_model):
    """rollout.cpu_linear='torch': vLLM's torch.nn.functional.linear fallback (no oneDNN packing), checked by the
    engine itself at start; the logprobs still equal transformers' before and after a weight sync."""
    import vllm._custom_ops as vllm_ops

    dispatch_before = vllm_ops._supports_onednn
    config = RolloutConfig(temperature=TEMPERATURE, max_new_tokens=8, cpu_linear="torch")
    engine = RolloutEngine(tiny_model_dir, config)
    try:
        model = engine._in_process_worker().model_runner.get_model()
        linears = [module for module in model.modules() if hasattr(module, "cpu_linear")]
        assert linears and all(module.weight.numel() > 0 for module in linears)
        for sample in engine.generate([PROMPT], n=2, seed=3):
            assert_close(sample.response_logprobs,
                         transformers_logprobs(old_model, PROMPT, sample.response_ids, TEMPERATURE))
        new_model = perturbed(old_model, seed=2)
        engine.update_weights(new_model.state_dict())
        assert all(module.weight.numel() > 0 for module in model.modules() if hasattr(module, "cpu_linear"))
        assert vllm_ops._supports_onednn == dispatch_before, "another engine of this process keeps vLLM's dispatch"
        for sample in engine.generate([PROMPT], n=2, seed=3):
            assert_close(sample.response_logprobs,
                         transformers_logprobs(new_model, PROMPT, sample.response_ids, TEMPERATURE))
    finally:
        engine.shutdown()
