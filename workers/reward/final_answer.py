"""Finding the final answer a completion commits to, shared by the math, choice and reasoning-gym verifiers."""

from __future__ import annotations

_BOX_COMMANDS = ("\\boxed{", "\\fbox{")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), nested braces included.

    None when there is none, or when the last one is cut off (a truncated generation commits to nothing).
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    content_start = text.index("{", start) + 1
    depth = 1
    for position in range(content_start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[content_start:position].strip()
    return None
