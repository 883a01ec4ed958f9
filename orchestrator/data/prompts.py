"""Turning a ``Problem`` into the text, or token ids, that the policy model reads."""

from __future__ import annotations

from typing import Any, Protocol

from orchestrator.data.config import PromptTemplateConfig
from workers.problem import Problem


class PromptTokenizer(Protocol):
    """The slice of a Hugging Face tokenizer that prompt formatting uses."""

    bos_token_id: int | None

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...


def chat_messages(problem: Problem, template: PromptTemplateConfig) -> list[dict[str, str]]:
    """The conversation for the chat template: verl rows keep their own messages, others get ours."""
    if "messages" in problem.metadata:
        return [dict(message) for message in problem.metadata["messages"]]
    instruction = template.instructions[problem.domain]
    user_text = f"{problem.prompt}\n\n{instruction}" if instruction else problem.prompt
    system = [{"role": "system", "content": template.system_prompt}] if template.system_prompt else []
    return [*system, {"role": "user", "content": user_text}]


def format_prompt(problem: Problem, tokenizer: PromptTokenizer | None, template: PromptTemplateConfig) -> str:
    """The prompt as text: the rendered chat template (ending with the assistant turn's opening) or the
    raw prompt for ``plain``. ``tokenizer`` may be None for ``plain``."""
    if template.kind == "plain":
        return problem.prompt
    if tokenizer is None:
        raise ValueError("tokenizer: the 'chat' prompt template needs a tokenizer with a chat template")
    return tokenizer.apply_chat_template(
        chat_messages(problem, template), add_generation_prompt=True, tokenize=False
    )


def prompt_token_ids(
    problem: Problem, tokenizer: PromptTokenizer, template: PromptTemplateConfig
) -> list[int]:
    """The prompt as token ids, which is what rollout and learner should both use.

    The rendered chat template already holds every special token, so it is encoded without adding more
    (a second BOS would shift the model off its training distribution). ``plain`` prompts get the BOS
    token only when the template asks and the tokenizer has one.
    """
    ids = list(tokenizer(format_prompt(problem, tokenizer, template), add_special_tokens=False)["input_ids"])
    if template.kind == "plain" and template.prepend_bos and tokenizer.bos_token_id is not None:
        ids.insert(0, tokenizer.bos_token_id)
    return ids
