"""Procedural integer arithmetic: ``"23+45="`` → ``"68"`` for the tiny character-level model, or
``"What is 23 + 45?"`` for chat models.

Equation prompts and answers use only ``0123456789+-*=``, the characters the tiny model's tokenizer knows.
Question prompts are scored in the ``math`` domain (the completion's final answer, see
``workers/reward/math_verifier.py``): a chat model restates the question ("23 + 45 = 68"), so the leading
integer would be the question's. There, a problem whose answer equals one of its operands is left out: a
completion that merely restates "0 + 7" would otherwise end with the right number (and the verifier refuses
"7 * 8" as an answer: it pays only for a stated value).
Which split a problem belongs to depends on its operands alone (a hash), never on the seed: every seed's
training set is disjoint from every seed's validation and test sets, and those two from each other. For ``+`` and ``*`` the hash ignores operand order,
so ``23+45`` and ``45+23`` are always on the same side and the test set measures more than commutativity.
"""

from __future__ import annotations

import hashlib
import logging
import random

from orchestrator.data.config import ArithmeticOptions, ArithmeticStyle, Split
from orchestrator.data.worked_addition import worked_answer
from workers.problem import Problem

logger = logging.getLogger(__name__)

COMMUTATIVE_OPERATIONS = frozenset("+*")
# Up to this many (operation, a, b) triples we enumerate them all; above, we sample (3 digits: 10**6 per
# operation would take seconds and hundreds of MB to enumerate).
MAX_ENUMERATED_TRIPLES = 200_000
# Rejection sampling slows down as the sample nears the whole split; past this share, refuse.
MAX_SAMPLED_SHARE = 0.5

Triple = tuple[str, int, int]


def split_of(operation: str, a: int, b: int, test_fraction: float, validation_fraction: float = 0.0) -> Split:
    """The split of one problem: a hash of the (order-free, where the operation allows) operand pair.

    The hash's unit interval is cut into [0, test) → test, [test, test + validation) → validation, the
    rest → train, so the three splits never share a problem whatever the seed.
    """
    if operation in COMMUTATIVE_OPERATIONS:
        a, b = min(a, b), max(a, b)
    digest = hashlib.sha256(f"{a}{operation}{b}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64
    if unit < test_fraction:
        return "test"
    return "validation" if unit < test_fraction + validation_fraction else "train"


def arithmetic_problems(
    options: ArithmeticOptions, split: Split, limit: int | None, seed: int
) -> list[Problem]:
    """``limit`` problems of ``split`` (all of it when ``limit`` is None), in a seeded random order."""
    operands_per_side = 10**options.digits
    total_triples = len(options.operations) * operands_per_side**2
    if total_triples <= MAX_ENUMERATED_TRIPLES:
        triples = _enumerate_split(options, split, limit, seed)
    else:
        triples = _sample_split(options, split, limit, seed, total_triples)
    logger.debug("arithmetic: %d %s problems (digits=%d)", len(triples), split, options.digits)
    return [_problem(triple, options.style, options.digits) for triple in triples]


def _in_split(triple: Triple, options: ArithmeticOptions, split: Split) -> bool:
    operation, a, b = triple
    if operation == "-" and not options.allow_negative_results and a < b:
        return False
    if options.style == "question" and _result(triple) in (a, b):
        return False
    return split_of(operation, a, b, options.test_fraction, options.validation_fraction) == split


def _enumerate_split(options: ArithmeticOptions, split: Split, limit: int | None, seed: int) -> list[Triple]:
    operands = range(10**options.digits)
    triples = [
        triple
        for triple in (
            (operation, a, b) for operation in options.operations for a in operands for b in operands
        )
        if _in_split(triple, options, split)
    ]
    if limit is not None and limit > len(triples):
        raise ValueError(
            f"limit: {limit} asked, but the {split} split of arithmetic (digits={options.digits}, "
            f"operations={list(options.operations)}) holds only {len(triples)} problems"
        )
    random.Random(seed).shuffle(triples)
    return triples if limit is None else triples[:limit]


def _sample_split(
    options: ArithmeticOptions, split: Split, limit: int | None, seed: int, total_triples: int
) -> list[Triple]:
    split_share = {"test": options.test_fraction, "validation": options.validation_fraction}.get(
        split, 1.0 - options.test_fraction - options.validation_fraction)
    ceiling = int(total_triples * split_share * MAX_SAMPLED_SHARE)
    if limit is None or limit > ceiling:
        raise ValueError(
            f"limit: arithmetic with digits={options.digits} has {total_triples} problems, too many to "
            f"enumerate; give a limit of at most {ceiling} (got {limit})"
        )
    rng = random.Random(seed)
    upper = 10**options.digits - 1
    chosen: dict[Triple, None] = {}  # insertion-ordered set: the draw order is the output order
    while len(chosen) < limit:
        triple = (rng.choice(options.operations), rng.randint(0, upper), rng.randint(0, upper))
        if triple not in chosen and _in_split(triple, options, split):
            chosen[triple] = None
    return list(chosen)


def _result(triple: Triple) -> int:
    operation, a, b = triple
    return {"+": a + b, "-": a - b, "*": a * b}[operation]


def _problem(triple: Triple, style: ArithmeticStyle, digits: int) -> Problem:
    operation, a, b = triple
    expression = f"{a}{operation}{b}"
    if style == "worked":
        answer, roles = worked_answer(a, b, digits)
        # Operands zero-padded to the column count: every column's digits are in the prompt to be copied.
        padded = f"{a:0{digits}d}{operation}{b:0{digits}d}"
        return Problem(id=f"arithmetic-worked-{expression}", prompt=f"{padded}=", answer=answer,
                       domain="arithmetic", metadata={"operation": operation, "operands": [a, b], "worked": True,
                                                      "digits": digits, "roles": roles})
    question = style == "question"
    return Problem(
        id=f"arithmetic-{expression}",
        prompt=f"What is {a} {operation} {b}?" if question else f"{expression}=",
        answer=str(_result(triple)),
        domain="math" if question else "arithmetic",
        metadata={"operation": operation, "operands": [a, b]},
    )
