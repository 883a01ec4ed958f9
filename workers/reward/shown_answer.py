"""The final answer a verifier reads from a completion, as text for a person to look at.

It shows what an accuracy is made of: next to the completion and the reference, the part of the completion
that was judged. Each domain reuses its verifier's own extraction, so the shown answer cannot drift from the
graded one:
- math: the first of ``final_answer_candidates`` (the most trusted; the verifier takes the first one that
  math-verify parses, which is this one unless it is unparsable), a box shown by its content;
- choice: the option letter ``chosen_option`` settles on;
- arithmetic: the leading integer ``stated_integer`` compares;
- reasoning_gym: the answer ``submitted_answer`` hands the task's scorer;
- code: the end of the program the sandbox runs (``program_under_test``): a program has no one-line answer.
An echo of the question is removed first, as every verifier does. No answer reads as ``""``. Only the
verifiers' text extraction runs here: nothing of the completion is parsed into a value, evaluated or run.
"""

from __future__ import annotations

from workers.problem import Problem
from workers.reward.final_answer import without_echo

# A shown answer longer than this keeps its end: the end of a long program or line is where it commits.
MAX_SHOWN_CHARS = 300
_BOX = "\\boxed{"


def shown_answer(completion: str, problem: Problem) -> str:
    """The final answer of ``completion`` as its domain's verifier reads it, at most ``MAX_SHOWN_CHARS`` long."""
    # The verifier modules are imported here, per domain: the driver that shows answers imports only the ones
    # its eval sets need (reasoning-gym alone takes seconds to import).
    stripped = without_echo(completion, problem.prompt)
    match problem.domain:
        case "math":
            from workers.reward.math_verifier import final_answer_candidates

            candidates = final_answer_candidates(stripped)
            answer = candidates[0] if candidates else ""
            if answer.startswith(_BOX) and answer.endswith("}"):
                answer = answer[len(_BOX):-1]
        case "choice":
            from workers.reward.choice_verifier import chosen_option

            answer = chosen_option(stripped) or ""
        case "arithmetic" if problem.metadata.get("worked"):
            answer = completion.rstrip()  # the whole written-out sum is what the verifier compares
        case "arithmetic":
            from workers.reward.arithmetic_verifier import stated_integer

            answer = stated_integer(completion, problem.prompt) or ""  # it judges the echo itself
        case "reasoning_gym":
            from workers.reward.reasoning_gym_verifier import submitted_answer

            answer = submitted_answer(stripped) or ""
        case "code":
            from workers.reward.code_verifier import program_under_test

            entry_point = problem.metadata.get("entry_point")
            answer = program_under_test(completion, problem.prompt, entry_point) if entry_point else completion
        case _:
            raise ValueError(f"problem {problem.id}: no verifier for domain {problem.domain!r}")
    return tail(answer.strip())


def tail(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text``, or its last ``limit`` characters after an ellipsis."""
    return text if len(text) <= limit else "…" + text[-(limit - 1):]
