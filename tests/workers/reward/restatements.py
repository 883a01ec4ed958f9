"""Restatements of a problem — text a policy can copy out of its question, or an unevaluated expression of its
answer — and the forms a final answer is written in. Shared by the whole-split test and its benchmark."""

from __future__ import annotations

import re

from workers.problem import Problem

# A piece of mathematics in the question: $…$, $$…$$, \( … \), \[ … \].
_MATH_SEGMENT = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# Arithmetic written in plain text: "7 * 8", "16 - 3 - 4".
_PLAIN_ARITHMETIC = re.compile(r"\d+(?:\.\d+)?(?:\s*[-+*/×÷^]\s*\(?\d+(?:\.\d+)?\)?)+")
# GSM8K's calculator annotations: <<16-3-4=9>>.
_CALCULATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
# Something to compute: an operator, or a command that computes (\binom, \sqrt, \frac, ^, !).
_NOT_VARIABLES = re.compile(r"\\(?:text|mbox)\s*\{[^{}]*\}|\\(?:[dt]?binom|sqrt|[dt]?frac|times|cdot|div"
                            r"|choose|left|right|circ|pi|%|,|!|;|\\)")
_COMPUTES = re.compile(r"[-+*/×÷^!]|\\(?:[dt]?binom|sqrt|[dt]?frac|times|cdot|div|choose)")


def _is_computation(segment: str) -> bool:
    """Numbers and operations only: what the verifier would compute to a value. A segment with a variable, or a
    relation, is not a computation of the answer (``a + b = 0`` merely contains a value)."""
    words = _NOT_VARIABLES.sub(" ", segment)
    return (bool(_COMPUTES.search(segment)) and bool(re.search(r"\d", segment))
            and not re.search(r"[A-Za-z=<>]|\\(?:le|ge|ne)", words))


def answer_forms(text: str, problem: Problem) -> list[str]:
    """Five ways a completion states ``text`` as its final answer: bare, "The answer is …", boxed, "= …", and
    after the question's own words."""
    text = text.strip().strip("$")
    latex = bool(re.search(r"[\\{}^_]", text))
    bare = f"${text}$" if latex else text
    return [bare, f"The answer is {bare}.", f"\\boxed{{{text}}}", f"= {text}",
            f"{problem.prompt}\nFinal answer: {bare}"]


def restatements(problem: Problem) -> list[str]:
    """What a policy could copy instead of computing: every piece of the question that computes something, and
    for GSM8K the worked solution's last calculation left unevaluated."""
    found = []
    for match in _MATH_SEGMENT.finditer(problem.prompt):
        segment = next(group for group in match.groups() if group is not None).strip()
        if _is_computation(segment):
            found.append(segment)
    found += [m.group().strip() for m in _PLAIN_ARITHMETIC.finditer(_MATH_SEGMENT.sub(" ", problem.prompt))]
    calculations = _CALCULATION.findall(problem.metadata.get("solution", ""))
    if calculations and _COMPUTES.search(calculations[-1][0]):
        found.append(calculations[-1][0].strip())
    return list(dict.fromkeys(found))
