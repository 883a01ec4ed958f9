"""Finding the final answer a completion commits to, shared by the math, choice and reasoning-gym verifiers.

Rules against hedging, shared by the verifiers (each verifier's docstring says how it applies them):
a completion that boxes *different* answers commits to none of them (``single_boxed``), and an
echo of the question is removed before anything is looked for (``without_echo``), so the question's
own numbers or option list are never taken for an answer.
"""

from __future__ import annotations

_BOX_COMMANDS = ("\\boxed{", "\\fbox{")
_NO_BOX = object()


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), nested braces included.

    None when there is none, or when the last one is cut off (a truncated generation commits to nothing).
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    return _box_content(text, text.index("{", start) + 1)


def all_boxed(text: str) -> list[str]:
    """Contents of every complete box, in order."""
    contents = []
    for command in _BOX_COMMANDS:
        start = text.find(command)
        while start >= 0:
            content = _box_content(text, start + len(command))
            if content is not None:
                contents.append((start, content))
            start = text.find(command, start + 1)
    return [content for _, content in sorted(contents)]


def single_boxed(text: str) -> str | None | object:
    """The one answer the completion boxes: the content of its last box when every complete box says
    the same (spaces aside); ``""`` (no answer) when they differ or the last box is cut off; ``NO_BOX``
    when there is no box at all (the verifier may then look elsewhere)."""
    if max(text.rfind(command) for command in _BOX_COMMANDS) < 0:
        return NO_BOX
    last = last_boxed(text)
    if last is None:
        return ""
    if len({"".join(content.split()) for content in all_boxed(text)}) > 1:
        return ""  # several different boxed answers: a hedge
    return last


NO_BOX = _NO_BOX


def without_echo(completion: str, prompt: str) -> str:
    """The completion with every verbatim copy of the question removed."""
    question = prompt.strip()
    return completion.replace(question, " ") if len(question) >= 8 else completion


def _box_content(text: str, content_start: int) -> str | None:
    depth = 1
    for position in range(content_start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[content_start:position].strip()
    return None
