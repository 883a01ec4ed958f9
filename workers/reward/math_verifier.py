"""Math domain: the completion's final answer against the reference, compared by math-verify.

An echo of the question is removed first. Which part of the completion is then the final answer
(first rule that yields a parsable answer wins):
1. a box: if the completion has one, only the box counts — its last ``\\boxed{…}``, and only when
   every box holds the same answer (``\\boxed{1} … \\boxed{2}`` commits to nothing, nor does ``\\boxed{}``);
2. the rest of the line after the last "answer is" / "answer:" (up to ", since …" / the sentence's end);
3. the rest of the line after the last ``=`` — small models restate the question
   ("36 + 22 = 58"), so the first number is the question, the last expression the answer;
4. the last line, when it is one piece of mathematics alone (``$\\frac{1+\\sqrt{5}}{2}$``, ``\\[ … \\]``);
5. the last number in the completion (integer, decimal, thousands commas, or a/b), unless it ends a
   list ("1, 2", "1 or 2") or is an operand ("40-20", "2a", "4^x": math-verify would read the bare number).
Against a reference that is one value, an answer that lists several ("1, 2", "1 or 2", ``1 \\lor 2``,
``1;2``, ``\\pm 2``; math-verify would take the last of them) scores 0, as does one longer than
``MAX_ANSWER_CHARS`` or with a run of more digits than ``MAX_DIGITS`` (more than the reference's).
math-verify then parses that text (LaTeX or plain) and compares it symbolically with the reference
(so 1/2, 0.5 and \\frac{2}{4} agree); a set or tuple never equals a single value.

**Values, not arithmetic** (``stated_value``): when the reference is a value — a number, a fraction, a
simplified radical, an interval or tuple of values — the answer must state a value of that kind: ``7 * 8``,
``\\boxed{99^2+99+1}``, ``\\binom{5}{2}`` or ``\\frac{112}{2}`` score 0 (math-verify would do the arithmetic and
pay, so restating the question would earn the reward). A reference written as an expression (``x^2+1``,
``2^{100}``) keeps symbolic equality. Two rationals must be equal exactly, or the answer a decimal of at least
two places that rounds the reference correctly (``0.33`` for 1/3; ``0.0`` is not 1/3000000).
Also hedges: an answer that negates a value ("the answer is not 3, …") or chains different values with ``=``
(``\\boxed{3 = 7}``) scores 0; ``7 \\times 8 = 56`` states 56.

math-verify bounds each parse and comparison with ``signal.alarm``: it works only on the main
thread of a process (``RewardScorer`` runs checks in worker processes for that reason), and a step
it cuts off simply returns "no answer"; a step that ran into its limit is reported here as a timeout.
"""

from __future__ import annotations

import re
import threading
import time

import sympy
from math_verify import parse, verify
from math_verify import parser as math_verify_parser

from workers.problem import Problem
from workers.reward.final_answer import NO_BOX, single_boxed, without_echo
from workers.reward.results import CheckError, CheckTimeout
from workers.reward.stated_value import is_numeric, is_stated_value

_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)
# A number that stands alone: not an exponent or index ("x^2", "a_1"), not a factor of a letter or a power
# ("2a", "4^x", "12^{th}"), which math-verify would read as the bare number.
_NUMBER = re.compile(r"(?<![\^_A-Za-z\d.])-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?(?![\d.]*(?:[A-Za-z({]|\s*\^))")
MAX_ANSWER_CHARS = 300
MAX_DIGITS = 40
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
# What separates several candidate values in one answer (at any depth: "\{1, 2\}" lists two as well).
_SEVERAL_VALUES = re.compile(r",|，|;|；|\\lor|\\vee|∨|\\land|\\wedge|∧|\\cup|∪|\\cap|∩|\\&|&|\\\\|\\quad|\\qquad"
                             r"|\\pm|\\mp|±|∓|\||\\mid|\\to\b|\\rightarrow|\\Rightarrow|→|⇒|\\neq|≠"
                             r"|\bor\b|\band\b", re.IGNORECASE)
_NEGATION = re.compile(r"\bnot\b|n't\b|\\neg|¬", re.IGNORECASE)
# An "=" that is not part of <=, >=, !=, \leq …: what separates the sides of an equation.
_EQUALS = re.compile(r"(?<![<>!=\\])=(?!=)")
_ENDS_A_LIST = re.compile(r"(?:,|;|&|\bor\b|\band\b|\\lor|\\vee)\s*\$?\s*$", re.IGNORECASE)
# Where the answer of rules 2 and 3 ends: before ", since …", "and we are done", the sentence's end.
_CLAUSE_AFTER_ANSWER = re.compile(r",\s+(?=[A-Za-z]{2})|\s+(?:and|so|since|because|which|as)\s+(?=[A-Za-z]{2})"
                                  r"|\.(?:\s|$)", re.IGNORECASE)
_DIGIT_RUN = re.compile(r"\d+")
# The last number is an operand, not a result: "40-20", "20 * .25" (the result would follow an "=").
_OPERAND_BEFORE = re.compile(r"[\d.)]\s*(?:[-+*/×÷^]|\\times|\\cdot|\\div)\s*\(?\s*$")
_OPERAND_AFTER = re.compile(r"\s*\)?\s*(?:[-+*/×÷^]|\\times|\\cdot|\\div)\s*[\d.(]")
_LATEX_MARK = re.compile(r"\\|[{}^_]")
# What is not a variable in a LaTeX answer: commands, \text{…}-style words (units), degree signs.
_NOT_VARIABLES = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname|mbox)\s*\{[^{}]*\}|\\[A-Za-z]+")
_DECIMAL_PLACES = re.compile(r"\d\.(\d+)")
_DECIMAL = re.compile(r"-?\d+\.\d+")
# A last line that is one piece of mathematics and nothing else: "$\frac{1+\sqrt{5}}{2}$", "\[ 3\sqrt{2} \]".
_MATH_LINE = re.compile(r"(\$\$?)[^$]+\1\.?|\\\[.+\\\]\.?|\\\(.+\\\)\.?")


def verify_math(completion: str, problem: Problem, *, timeout_s: int = 3) -> float:
    """1.0 when the completion's final answer equals ``problem.answer`` mathematically, else 0.0."""
    if threading.current_thread() is not threading.main_thread():
        raise CheckError("math-verify needs the main thread of its process (its timeouts use signal.alarm)")
    gold = _parse_timed(_as_latex(problem.answer), timeout_s)
    if not gold:
        raise CheckError(f"math-verify cannot parse the reference answer {problem.answer!r} of problem {problem.id}")
    if _drops_variables(_as_latex(problem.answer), gold):
        raise CheckError(f"math-verify reads the reference answer {problem.answer!r} of problem {problem.id} as "
                         f"{gold[0]}: it drops part of it, and would pay that number")
    single_value = not _lists_several_values(problem.answer)
    value_reference = _is_value(_as_latex(problem.answer), gold, timeout_s)
    longest_gold_digits = max((len(run) for run in _DIGIT_RUN.findall(problem.answer)), default=0)
    for candidate in final_answer_candidates(without_echo(completion, problem.prompt)):
        if (len(candidate) > MAX_ANSWER_CHARS or (single_value and _lists_several_values(candidate))
                or _NEGATION.search(candidate)
                or max((len(run) for run in _DIGIT_RUN.findall(candidate)), default=0)
                > max(MAX_DIGITS, longest_gold_digits)):
            return 0.0  # the completion's final answer is a hedge or a digit flood: no other rule may rescue it
        predicted = _parse_timed(candidate, timeout_s)
        if predicted:
            if _chains_different_values(candidate, timeout_s):
                return 0.0
            if value_reference:
                stated = _last_side(candidate)
                if not _is_value(stated, None, timeout_s) or _drops_variables(stated, predicted):
                    return 0.0  # arithmetic left for math-verify to do (stated_value.RULES), or a misread
            return 1.0 if _equal(gold, predicted, candidate, timeout_s) else 0.0
    return 0.0


def final_answer_candidates(completion: str) -> list[str]:
    """Texts that may hold the final answer, most trusted first (rules 1–5 of the module docstring)."""
    boxed = single_boxed(completion)
    if boxed is not NO_BOX:
        return [f"\\boxed{{{boxed}}}"]  # a box decides alone (an empty one, for boxes that disagree)
    candidates = []
    for marker in (_last_match_end(_ANSWER_PHRASE, completion), _rfind_end(completion, "=")):
        if marker is not None:
            answer = _rest_of_line(completion, marker)
            clause = _CLAUSE_AFTER_ANSWER.search(answer)
            candidates.append(_as_latex_if_bare(answer[:clause.start()] if clause else answer))
    lines = completion.strip().splitlines()
    if lines and _MATH_LINE.fullmatch(lines[-1].strip()):
        candidates.append(lines[-1].strip().rstrip("."))
    numbers = list(_NUMBER.finditer(completion))
    if numbers:
        last = numbers[-1]
        line_start = completion.rfind("\n", 0, last.start()) + 1
        if not (_ENDS_A_LIST.search(completion[line_start:last.start()])
                or _OPERAND_BEFORE.search(completion, 0, last.start()) or _OPERAND_AFTER.match(completion, last.end())):
            candidates.append(last.group())
    return candidates


def _is_value(text: str, parsed: list | None, timeout_s: int) -> bool:
    """Whether ``text`` states a number-only value (``stated_value``); ``parsed``: its evaluated parse, if known."""
    parsed = parsed if parsed is not None else _parse_timed(text, timeout_s)
    if not parsed or not is_numeric(parsed[0]):
        return False
    written = _parse_as_written(text, timeout_s)
    return bool(written) and isinstance(written[0], sympy.Basic) and is_stated_value(written[0], text)


def _parse_as_written(text: str, timeout_s: int) -> list:
    """math-verify's parse without sympy's automatic evaluation: ``7 * 8`` stays ``Mul(7, 8)``. math-verify caches
    its LaTeX parses by text, so the evaluated parse of the same text must not be served from (or into) them."""
    caches = (math_verify_parser.parse_latex_cached, math_verify_parser.extract_latex)
    for cache in caches:
        cache.cache_clear()
    try:
        with sympy.evaluate(False):
            return _parse_timed(text, timeout_s)
    finally:
        for cache in caches:
            cache.cache_clear()


def _drops_variables(text: str, parsed: list) -> bool:
    """A LaTeX answer with variables that math-verify read as a number: it keeps a parsable prefix of what it
    cannot read (``4+\\frac{12}{a}+\\cdots`` becomes 4), which must not pass for the value."""
    if not _LATEX_MARK.search(text) or not is_numeric(parsed[0]):
        return False
    return bool(re.search(r"[A-Za-z]", _NOT_VARIABLES.sub(" ", text.replace("\\boxed{", "{"))))


def _last_side(candidate: str) -> str:
    """The last side of an equation, in the candidate's own wrapping: ``\\boxed{7 \\times 8 = 56}`` states 56."""
    sides = _EQUALS.split(candidate)
    if len(sides) == 1:
        return candidate
    last = sides[-1]
    return f"\\boxed{{{last}" if candidate.startswith("\\boxed{") else _as_latex_if_bare(last)


def _chains_different_values(candidate: str, timeout_s: int) -> bool:
    """``3 = 7``: an equation between different numbers commits to neither (math-verify would take the last)."""
    content = candidate.removeprefix("\\boxed{").removesuffix("}") if candidate.startswith("\\boxed{") else candidate
    sides = _EQUALS.split(content)
    if len(sides) < 2:
        return False
    values = []
    for side in sides:
        parsed = _parse_timed(_as_latex_if_bare(side) if "\\" in side else side, timeout_s)
        if parsed and is_numeric(parsed[0]):
            values.append(parsed)
    return any(not _verify_timed(values[0], other, timeout_s) for other in values[1:])


def _equal(gold: list, predicted: list, candidate: str, timeout_s: int) -> bool:
    """math-verify's symbolic equality, except between two rationals: math-verify rounds both to 6 places, so
    ``0.0`` would equal 1/3000000. There the answer must be exact, or a decimal of at least two places that
    rounds the reference correctly."""
    exact = _as_rational(predicted)
    if isinstance(gold[0], sympy.Rational) and exact is not None:
        if gold[0] == exact:
            return True
        places = max((len(digits) for digits in _DECIMAL_PLACES.findall(candidate)), default=0)
        return places >= 2 and exact != 0 and abs(exact - gold[0]) <= sympy.Rational(1, 2 * 10**places)
    return _verify_timed(gold, predicted, timeout_s)


def _as_rational(parsed: list) -> sympy.Rational | None:
    """The exact rational a parsed number stands for (a decimal from its text: math-verify makes ``0.33`` a float)."""
    value = parsed[0]
    if isinstance(value, sympy.Rational):
        return value
    if isinstance(value, sympy.Float) and len(parsed) > 1 and _DECIMAL.fullmatch(str(parsed[1]).strip()):
        return sympy.Rational(str(parsed[1]).strip())
    return None


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
    # "= 3\sqrt{2}" or "1^{(2^{9})}" without $…$ would otherwise be read as plain text, i.e. as "3" or "1".
    return f"${text.strip().rstrip('.')}$" if _LATEX_MARK.search(text) and "$" not in text else text


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
