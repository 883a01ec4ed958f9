"""Math domain: the completion's final answer against the reference, compared by math-verify.

An echo of the question is removed first. Which part of the completion is then the final answer
(first rule that yields a parsable answer wins):
1. a box: if the completion has one, only the box counts — its last ``\\boxed{…}``, and only when
   every box holds the same answer (``\\boxed{1} … \\boxed{2}`` commits to nothing, nor does ``\\boxed{}``);
2. the rest of the line after the last "answer is" / "answer:" (up to ", since …" / the sentence's end);
3. the rest of the line after the last ``=`` — small models restate the question
   ("36 + 22 = 58"), so the first number is the question, the last expression the answer;
4. the last number in the completion (integer, decimal, thousands commas, or a/b), unless it ends a
   list ("1, 2", "1 or 2").
Against a reference that is one value, an answer that lists several ("1, 2", "1 or 2", ``1 \\lor 2``,
``1;2``, ``\\pm 2``; math-verify would take the last of them) scores 0, as does one longer than
``MAX_ANSWER_CHARS`` or with a run of more digits than ``MAX_DIGITS`` (more than the reference's).
math-verify then parses that text (LaTeX or plain) and compares it symbolically with the reference
(so 1/2, 0.5 and \\frac{2}{4} agree); a set or tuple never equals a single value.

math-verify bounds each parse and comparison with ``signal.alarm``: it works only on the main
thread of a process (``RewardScorer`` runs checks in worker processes for that reason), and a step
it cuts off simply returns "no answer"; a step that ran into its limit is reported here as a timeout.
"""

from __future__ import annotations

import re
import threading
import time

from math_verify import parse, verify

from workers.problem import Problem
from workers.reward.final_answer import NO_BOX, single_boxed, without_echo
from workers.reward.results import CheckError, CheckTimeout

_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
MAX_ANSWER_CHARS = 300
MAX_DIGITS = 40
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
# What separates several candidate values in one answer (at any depth: "\{1, 2\}" lists two as well).
_SEVERAL_VALUES = re.compile(r",|;|\\lor|\\vee|\\land|\\wedge|\\cup|\\&|&|\\\\|\\quad|\\qquad|\\pm|\\mp"
                             r"|\bor\b|\band\b", re.IGNORECASE)
_ENDS_A_LIST = re.compile(r"(?:,|;|&|\bor\b|\band\b|\\lor|\\vee)\s*\$?\s*$", re.IGNORECASE)
# Where the answer of rules 2 and 3 ends: before ", since …", "and we are done", the sentence's end.
_CLAUSE_AFTER_ANSWER = re.compile(r",\s+(?=[A-Za-z]{2})|\s+(?:and|so|since|because|which|as)\s+(?=[A-Za-z]{2})"
                                  r"|\.(?:\s|$)", re.IGNORECASE)
_DIGIT_RUN = re.compile(r"\d+")


def verify_math(completion: str, problem: Problem, *, timeout_s: int = 3) -> float:
    """1.0 when the completion's final answer equals ``problem.answer`` mathematically, else 0.0."""
    if threading.current_thread() is not threading.main_thread():
        raise CheckError("math-verify needs the main thread of its process (its timeouts use signal.alarm)")
    gold = _parse_timed(_as_latex(problem.answer), timeout_s)
    if not gold:
        raise CheckError(f"math-verify cannot parse the reference answer {problem.answer!r} of problem {problem.id}")
    single_value = not _lists_several_values(problem.answer)
    longest_gold_digits = max((len(run) for run in _DIGIT_RUN.findall(problem.answer)), default=0)
    for candidate in final_answer_candidates(without_echo(completion, problem.prompt)):
        if (len(candidate) > MAX_ANSWER_CHARS or (single_value and _lists_several_values(candidate))
                or max((len(run) for run in _DIGIT_RUN.findall(candidate)), default=0)
                > max(MAX_DIGITS, longest_gold_digits)):
            return 0.0  # the completion's final answer is a hedge or a digit flood: no other rule may rescue it
        predicted = _parse_timed(candidate, timeout_s)
        if predicted:
            return 1.0 if _verify_timed(gold, predicted, timeout_s) else 0.0
    return 0.0


def final_answer_candidates(completion: str) -> list[str]:
    """Texts that may hold the final answer, most trusted first (rules 1–4 of the module docstring)."""
    boxed = single_boxed(completion)
    if boxed is not NO_BOX:
        return [f"\\boxed{{{boxed}}}"]  # a box decides alone (an empty one, for boxes that disagree)
    candidates = []
    for marker in (_last_match_end(_ANSWER_PHRASE, completion), _rfind_end(completion, "=")):
        if marker is not None:
            answer = _rest_of_line(completion, marker)
            clause = _CLAUSE_AFTER_ANSWER.search(answer)
            candidates.append(_as_latex_if_bare(answer[:clause.start()] if clause else answer))
    numbers = list(_NUMBER.finditer(completion))
    if numbers:
        last = numbers[-1]
        line_start = completion.rfind("\n", 0, last.start()) + 1
        if not _ENDS_A_LIST.search(completion[line_start:last.start()]):
            candidates.append(last.group())
    return candidates


def _lists_several_values(text: str) -> bool:
    return bool(_SEVERAL_VALUES.search(_THOUSANDS_COMMA.sub("", text)))


def _last_match_end(pattern: re.Pattern[str], text: str) -> int | None:
    matches = list(pattern.finditer(text))
    return matches[-1].end() if matches else None


def _rfind_end(text: str, marker: str) -> int | None:
    position = text.rfind(marker)
    return position + len(marker) if position >= 0 else None


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]


def _as_latex(answer: str) -> str:
    """Reference answers are bare LaTeX ("\\frac{1}{2}"); math-verify finds LaTeX only inside delimiters."""
    return answer if "$" in answer or "\\boxed" in answer else f"\\boxed{{{answer}}}"


def _as_latex_if_bare(text: str) -> str:
    # "= 3\sqrt{2}" without $…$ would otherwise be read as plain text, i.e. as "3".
    return f"${text.strip().rstrip('.')}$" if "\\" in text and "$" not in text else text


def _parse_timed(text: str, timeout_s: int) -> list:
    started = time.monotonic()
    parsed = parse(text, parsing_timeout=timeout_s)
    _raise_if_cut_off("parsing", started, timeout_s)
    return parsed


def _verify_timed(gold: list, predicted: list, timeout_s: int) -> bool:
    started = time.monotonic()
    equal = verify(gold, predicted, timeout_seconds=timeout_s)
    _raise_if_cut_off("comparison", started, timeout_s)
    return equal


def _raise_if_cut_off(step: str, started: float, timeout_s: int) -> None:
    # math-verify swallows its own timeout (returns [] / False); the alarm fires at timeout_s, so a
    # step that lasted that long was cut off rather than answered.
    if time.monotonic() - started >= timeout_s:
        raise CheckTimeout(f"timeout: math-verify {step} reached its {timeout_s} s limit")
