"""Addition written out column by column: long answers whose every token is either forced by the ones before it
or a real decision, and the generator knows which.

``"347+285="`` → ``"7+5=12 4+8+1=13 3+2+1=6 632"``: one segment per column, least significant first,
``a+b=s`` with ``+1`` before ``=`` when the column below carried, then the sum. Every character is in the tiny
model's vocabulary (digits, ``+``, ``=``, space). Answers of 3-digit sums are 19–29 characters plus the end token.

Each character of an answer has a role (``ROLES``):

- ``o`` operand: a digit copied from the prompt (which digit is fixed by the column) — forced;
- ``f`` format: ``+``, ``=``, a space, the carry's ``1`` once its ``+`` is written — forced;
- ``c`` carry: the character after the second operand, ``+`` (the column below carried) or ``=`` (it did not),
  decided by the column below's sum — a decision;
- ``d`` digit: a digit of a column's sum — a decision (the computation itself);
- ``a`` answer: a digit of the final sum, a copy of the columns' last digits (and the last carry) — forced.

Decisions (``c``, ``d``) are about a quarter of the characters: the "forking tokens" of a long chain of
near-deterministic ones. ``roles_of`` labels any completion (a policy's, not only the reference) by walking this
grammar on the completion's own text; characters after it leaves the grammar are ``x``.
"""

from __future__ import annotations

ROLES = "ofcda"
DECISION_ROLES = frozenset("cd")
OFF_GRAMMAR = "x"
# The one encoding of roles as small ints (TrainBatch.token_roles): o f c d a x → 0 … 5.
ROLE_IDS = {role: index for index, role in enumerate(ROLES + OFF_GRAMMAR)}


def worked_answer(a: int, b: int, digits: int) -> tuple[str, str]:
    """(answer, roles) of ``a + b`` with both operands written on ``digits`` columns."""
    text, roles = [], []
    carry = 0
    for column in range(digits):
        x, y = a // 10**column % 10, b // 10**column % 10
        total = x + y + carry
        segment = [(str(x), "o"), ("+", "f"), (str(y), "o")]
        segment += [("+", "c"), ("1", "f"), ("=", "f")] if carry else [("=", "c")]
        segment += [(digit, "d") for digit in str(total)]
        if column:
            text.append(" ")
            roles.append("f")
        text += [ch for ch, _ in segment]
        roles += [role for _, role in segment]
        carry = total // 10
    text.append(" ")
    roles.append("f")
    final = str(a + b)
    text.append(final)
    roles.append("a" * len(final))
    return "".join(text), "".join(roles)


def roles_of(completion: str, digits: int) -> str:
    """One role per character of ``completion``, by the grammar of a worked addition of ``digits`` columns: the
    roles its characters play whatever their values (a wrong digit in a digit's place is still ``d``); ``x`` from
    the first character the grammar does not allow on."""
    roles: list[str] = []
    position = 0

    def take(allowed: str, role: str) -> bool:
        nonlocal position
        if position < len(completion) and completion[position] in allowed:
            roles.append(role)
            position += 1
            return True
        return False

    numerals = "0123456789"
    for column in range(digits):
        if column and not take(" ", "f"):
            return _rest(roles, completion)
        if not (take(numerals, "o") and take("+", "f") and take(numerals, "o")):
            return _rest(roles, completion)
        if take("+", "c"):
            if not (take("1", "f") and take("=", "f")):
                return _rest(roles, completion)
        elif not take("=", "c"):
            return _rest(roles, completion)
        if not take(numerals, "d"):
            return _rest(roles, completion)
        take(numerals, "d")  # a two-digit column sum
    if take(" ", "f"):
        while take(numerals, "a"):
            pass
    return _rest(roles, completion)


def _rest(roles: list[str], completion: str) -> str:
    return "".join(roles) + OFF_GRAMMAR * (len(completion) - len(roles))
