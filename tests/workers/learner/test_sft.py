import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from workers.learner.sft import answer_loss, supervised_warmup

VOCAB = 20
EOS = 1


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "tiny"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=128, vocab_size=VOCAB)
        Qwen2ForCausalLM(config).save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")  # stands in for the tokenizer files that must be copied
    return folder


def addition_examples():
    # "a b +" → "(a+b) mod 10, EOS", digits as tokens 10..19
    return [([10 + a, 10 + b, 2], [10 + (a + b) % 10, EOS]) for a in range(6) for b in range(6)]


@pytest.mark.slow
def test_supervised_warmup_lowers_the_answer_loss_and_saves_an_hf_folder(model_dir, tmp_path):
    torch.set_num_threads(1)
    examples = addition_examples()
    with torch.no_grad():
        before = float(answer_loss(AutoModelForCausalLM.from_pretrained(model_dir), examples))
    out = supervised_warmup(model_dir, examples, steps=60, lr=3e-3, batch_size=12, seed=0, out_dir=tmp_path / "warm")
    assert out == tmp_path / "warm"
    assert (out / "tokenizer.json").read_text() == "{}"
    with torch.no_grad():
        after = float(answer_loss(AutoModelForCausalLM.from_pretrained(out), examples))
    assert after < 0.6 * before, (before, after)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # staging folder renamed away

    with pytest.raises(FileExistsError):
        supervised_warmup(model_dir, examples, steps=1, lr=1e-3, batch_size=4, seed=0, out_dir=out)


def test_answer_loss_ignores_the_prompt_tokens(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        one = answer_loss(model, [([10, 11, 2], [13, EOS])])
        other_prompt_token = answer_loss(model, [([10, 11, 3], [13, EOS])])
        full = torch.log_softmax(model(torch.tensor([[10, 11, 2, 13, EOS]])).logits[0], -1)
    expected = -(full[2, 13] + full[3, EOS]) / 2
    torch.testing.assert_close(one, expected)
    assert not torch.equal(one, other_prompt_token)  # the prompt is context: it changes the answer's loss


@pytest.mark.slow
def test_warmup_weights_are_bit_identical_whatever_the_callers_thread_setting(model_dir, tmp_path):
    from workers.learner.sft import CHECKSUM_FILE, folder_checksum

    examples = addition_examples()
    previous = torch.get_num_threads()
    checksums = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)  # the fit pins its own count; the caller's must not matter
            out = supervised_warmup(model_dir, examples, steps=8, lr=3e-3, batch_size=12, seed=0,
                                    out_dir=tmp_path / f"warm-{threads}")
            assert torch.get_num_threads() == threads  # restored afterwards
            recorded = json.loads((out / CHECKSUM_FILE).read_text())["sha256"]
            assert recorded == folder_checksum(out)
            checksums.append(recorded)
    finally:
        torch.set_num_threads(previous)
    assert checksums[0] == checksums[1]
    other_seed = supervised_warmup(model_dir, examples, steps=8, lr=3e-3, batch_size=12, seed=1, out_dir=tmp_path / "s1")
    assert folder_checksum(other_seed) != checksums[0]  # the checksum sees a different data order
