"""Multiple-choice domain: the one option letter (A–J) the completion settles on, against ``problem.answer``.

An echo of the question (with its option list) is removed first. Then the first rule that applies decides:
1. a box: ``\\boxed{C}`` (also ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``). If there is a box, it alone
   counts: boxes naming different letters, or a box that is not exactly one letter (``\\boxed{A, B}``,
   ``\\boxed{}``), commit to nothing;
2. the last "answer is C" / "Answer: (C)" phrase — unless another letter follows it ("the answer is
   A or B");
3. the last parenthesised letter "(C)", else the last standalone capital A–J (not "A" / "I" used as
   a word: "A cat", "I think") — unless the sentence it stands in names more than one letter ("A B C D",
   "(A) (B)", "A or B", an option list "A) … B) …"): a hedge is no answer.
So exactly one letter, stated once at the end, earns the reward; listing candidates earns nothing.
"""

from __future__ import annotations

import re

from workers.problem import Problem
from workers.reward.final_answer import NO_BOX, all_boxed, last_boxed, single_boxed, without_echo
from workers.reward.results import CheckError

_LETTERS = "A-J"
_BOXED_LETTER = re.compile(rf"^\(?\s*(?:\\text\{{)?\s*([{_LETTERS}])\s*\}}?\s*\)?$")
_ANSWER_PHRASE = re.compile(rf"answer\s*(?:is|:)\s*(?:option\s*)?\(?\s*([{_LETTERS}])\b", re.IGNORECASE)
_ANOTHER_LETTER_FOLLOWS = re.compile(rf"\)?\s*(?:,|;|/|&|\bor\b|\band\b)\s*(?:option\s*)?\(?\s*[{_LETTERS}]\b",
                                     re.IGNORECASE)
_PARENTHESISED = re.compile(rf"\(\s*([{_LETTERS}])\s*\)")
_STANDALONE = re.compile(rf"(?<![A-Za-z0-9])([{_LETTERS}])(?![A-Za-z0-9])")
_WORD_USE = re.compile(r"\s+(?!(?:or|and)\b)[a-z]")  # "A cat", "I think": an article or a pronoun, not an option ("A or B" is)
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)|\n")


def verify_choice(completion: str, problem: Problem) -> float:
    """1.0 if the chosen option letter equals ``problem.answer`` (e.g. "C" or "(C)"), else 0.0."""
    gold = problem.answer.strip().strip("()").strip().upper()
    if len(gold) != 1 or not re.fullmatch(f"[{_LETTERS}]", gold):
        raise CheckError(f"choice problem {problem.id} has answer {problem.answer!r}; expected one letter A–J")
    return 1.0 if chosen_option(without_echo(completion, problem.prompt)) == gold else 0.0


def chosen_option(completion: str) -> str | None:
    if single_boxed(completion) is not NO_BOX:  # there is a box: it alone decides
        if last_boxed(completion) is None:
            return None  # the last box is cut off
        letters = {match.group(1).upper() if match else None
                   for match in map(_BOXED_LETTER.match, all_boxed(completion))}
        return letters.pop() if len(letters) == 1 else None  # {None}: a box that is no single letter
    phrases = list(_ANSWER_PHRASE.finditer(completion))
    if phrases:
        last = phrases[-1]
        return None if _ANOTHER_LETTER_FOLLOWS.match(completion, last.end()) else last.group(1).upper()
    parenthesised = list(_PARENTHESISED.finditer(completion))
    standalone = [match for match in _STANDALONE.finditer(completion)
                  if not (match.group(1) in "AI" and _WORD_USE.match(completion, match.end()))]
    chosen = parenthesised[-1] if parenthesised else standalone[-1] if standalone else None
    if chosen is None:
        return None
    start, end = _sentence_around(completion, chosen.start())
    letters_in_sentence = {match.group(1) for match in standalone if start <= match.start() < end}
    return chosen.group(1) if letters_in_sentence <= {chosen.group(1)} else None


def _sentence_around(text: str, position: int) -> tuple[int, int]:
    start = 0
    for end_mark in _SENTENCE_END.finditer(text, 0, position):
        start = end_mark.end()
    following = _SENTENCE_END.search(text, position)
    return start, following.start() if following else len(text)
