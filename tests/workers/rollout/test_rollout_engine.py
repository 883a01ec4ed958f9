"""The generate contract on a real in-process vLLM engine and the random tiny model."""

import contextlib
import math

import pytest
from transformers import AutoTokenizer

from workers.models.char_tokenizer import VOCAB
from workers.rollout.config import RolloutConfig
from workers.rollout.engine import RolloutEngine

pytestmark = pytest.mark.slow  # every test here starts a vLLM engine

EOS = VOCAB["<eos>"]
MAX_NEW_TOKENS = 16
PROMPTS = [[VOCAB[c] for c in text] for text in ("23+45=", "7*8=", "1-1=", "99+1=")]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    engine = RolloutEngine(tiny_model_dir, RolloutConfig(max_new_tokens=MAX_NEW_TOKENS, max_prompt_tokens=8))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def samples(engine):
    return engine.generate(PROMPTS, n=8)


def test_requests_run_uncompiled_and_give_the_compiled_samplers_bits(engine, monkeypatch):
    """Each request of an in-process CPU engine runs under torch.compile's ``force_eager`` stance: vLLM's sampler
    does not compile its rank-counting helper at an engine's first request (≈ 2 s of every engine start on 2
    cores), and sampled tokens, their logprobs and scored logprobs are the bits of vLLM's compiled path."""
    import torch
    import vllm.v1.sample.sampler as sampler

    stances = []
    count_ranks = sampler.batched_count_greater_than

    def spy(x, values):
        stances.append(torch._dynamo.eval_frame._stance.stance)
        return count_ranks(x, values)

    def run() -> tuple[list, list[float]]:
        samples = engine.generate(PROMPTS, n=4, seed=11)
        return ([(s.response_ids, s.response_logprobs) for s in samples],
                engine.sequence_logprobs(PROMPTS[0], samples[0].response_ids))

    monkeypatch.setattr(sampler, "batched_count_greater_than", spy)
    eager = run()
    assert stances and set(stances) == {"force_eager"}
    stances.clear()
    monkeypatch.setattr(engine, "_eager", contextlib.nullcontext)  # vLLM as shipped: the helper compiled
    assert run() == eager
    assert stances and set(stances) == {"default"}


def test_n_samples_per_prompt_grouped_in_prompt_order(samples):
    assert [s.prompt_index for s in samples] == [i for i in range(len(PROMPTS)) for _ in range(8)]
    assert all(s.prompt_ids == PROMPTS[s.prompt_index] for s in samples)
    # Sampling, not copying: a group of 8 from a near-uniform model has distinct responses.
    assert len({tuple(s.response_ids) for s in samples[:8]}) > 1


def test_one_logprob_per_response_token(samples):
    for sample in samples:
        assert len(sample.response_logprobs) == len(sample.response_ids) >= 1
        assert all(math.isfinite(lp) and lp <= 0 for lp in sample.response_logprobs)


def test_eos_ends_a_response_and_length_caps_it(samples):
    # At random init each token is EOS with probability ≈ 1/18, so 32 samples of 16 tokens show both.
    reasons = {s.finish_reason for s in samples}
    assert reasons == {"stop", "length"}
    for sample in samples:
        if sample.finish_reason == "stop":
            assert sample.response_ids[-1] == EOS and EOS not in sample.response_ids[:-1]
            assert len(sample.response_ids) <= MAX_NEW_TOKENS
        else:
            assert len(sample.response_ids) == MAX_NEW_TOKENS and EOS not in sample.response_ids


def test_vllm_detokenizes_with_the_folder_tokenizer(engine, tiny_model_dir):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    (output,) = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=PROMPTS[0])], SamplingParams(max_tokens=12, seed=3), use_tqdm=False
    )
    completion = output.outputs[0]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)


def test_longest_prompt_and_response_can_be_scored(engine):
    longest_prompt = [VOCAB["7"]] * 8  # max_prompt_tokens
    (sample,) = engine.generate([longest_prompt], n=1, greedy=True)
    assert sample.finish_reason == "length"  # the random model's greedy path never picks EOS
    scored = engine.sequence_logprobs(longest_prompt, sample.response_ids)
    assert len(scored) == MAX_NEW_TOKENS and all(lp <= 0 for lp in scored)


def test_greedy_decoding_is_deterministic(engine):
    first = engine.generate(PROMPTS[:2], n=1, greedy=True)
    second = engine.generate(PROMPTS[:2], n=1, greedy=True)
    assert [s.response_ids for s in first] == [s.response_ids for s in second]


def test_greedy_with_several_samples_is_rejected(engine):
    with pytest.raises(ValueError, match="n must be 1"):
        engine.generate(PROMPTS[:1], n=2, greedy=True)


def test_prompt_longer_than_max_prompt_tokens_is_rejected(engine):
    with pytest.raises(ValueError, match="prompt 1 has 9 tokens.*max_prompt_tokens=8"):
        engine.generate([PROMPTS[0], [VOCAB["1"]] * 9], n=1)
