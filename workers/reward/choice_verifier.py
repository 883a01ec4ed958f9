"""Multiple-choice domain: the option letter (A–J) the completion settles on against ``problem.answer``.

Which letter is the chosen one (first rule that finds one wins; the last occurrence within a rule):
1. ``\\boxed{C}`` (also ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``);
2. "answer is C", "Answer: (C)", "answer: C." …;
3. a parenthesised letter "(C)";
4. the last standalone capital letter A–J, except "A" / "I" used as a word ("A cat", "I think").
"""

from __future__ import annotations

import re

from workers.problem import Problem
from workers.reward.final_answer import last_boxed
from workers.reward.results import CheckError

_LETTERS = "A-J"
_BOXED_LETTER = re.compile(rf"^\(?\s*(?:\\text\{{)?\s*([{_LETTERS}])\s*\}}?\s*\)?$")
_ANSWER_PHRASE = re.compile(rf"answer\s*(?:is|:)\s*(?:option\s*)?\(?\s*([{_LETTERS}])\b", re.IGNORECASE)
_PARENTHESISED = re.compile(rf"\(\s*([{_LETTERS}])\s*\)")
_STANDALONE = re.compile(rf"(?<![A-Za-z0-9])([{_LETTERS}])(?![A-Za-z0-9])")
_WORD_USE = re.compile(r"\s+[a-z]")  # "A cat", "I think": an article or a pronoun, not an option


def verify_choice(completion: str, problem: Problem) -> float:
    """1.0 if the chosen option letter equals ``problem.answer`` (e.g. "C" or "(C)"), else 0.0."""
    gold = problem.answer.strip().strip("()").strip().upper()
    if len(gold) != 1 or not re.fullmatch(f"[{_LETTERS}]", gold):
        raise CheckError(f"choice problem {problem.id} has answer {problem.answer!r}; expected one letter A–J")
    return 1.0 if chosen_option(completion) == gold else 0.0


def chosen_option(completion: str) -> str | None:
    boxed = last_boxed(completion)
    if boxed is not None:
        match = _BOXED_LETTER.match(boxed)
        if match:
            return match.group(1)
    for pattern in (_ANSWER_PHRASE, _PARENTHESISED):
        matches = pattern.findall(completion)
        if matches:
            return matches[-1].upper()
    for match in reversed(list(_STANDALONE.finditer(completion))):
        if match.group(1) in "AI" and _WORD_USE.match(completion, match.end()):
            continue
        return match.group(1)
    return None
