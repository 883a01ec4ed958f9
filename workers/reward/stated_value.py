"""Is a final answer a *stated value*, or arithmetic left for the verifier to do?

math-verify compares answers symbolically, so ``7 * 8``, ``\\boxed{99^2+99+1}`` or ``\\binom{5}{2}`` equal
56, 9901 and 10: a policy that restates the question ("What is 7 * 8?" → "The answer is 7 * 8.") would be
paid for arithmetic the verifier did. When the reference is a value, the answer must be one too
(``RULES``); when the reference itself is written as an expression (a polynomial, ``2^{100}``), symbolic
equality stays, since there the form is the answer.

The check walks the answer as written: math-verify's own parse under ``sympy.evaluate(False)`` keeps
``7 * 8`` as ``Mul(7, 8)`` instead of 56. Nothing of the answer is evaluated as code: the LaTeX parser builds
sympy objects, and math-verify's plain-text path accepts only digits, ``.`` and arithmetic signs.
"""

from __future__ import annotations

import math
import re

import sympy

RULES = (
    "a number (integer, decimal, percentage), a fraction of integers in lowest terms, a simplified radical "
    "(no k-th power factor under a k-th root), and sums or products of these with at most one rational term "
    "(2 + \\sqrt{3}, 3\\sqrt{2}, \\frac{1+\\sqrt{5}}{2}, 2\\pi); intervals, tuples and sets of such values. "
    "Anything else made only of numbers — an operation whose result is rational (7 * 8, 99^2+99+1, "
    "(16-3-4)*2, \\binom{5}{2}, 3!, \\sqrt{49}), two rational terms in one sum or product (1 + 1 + \\sqrt{3}), "
    "an unsimplified radical (\\sqrt{8}) or fraction (\\frac{112}{2}, 4/8) — is unevaluated arithmetic."
)

# Beyond these a written number is not an answer anyone states (and computing it could hang the check).
_MAX_EXPONENT = 1000
_MAX_FACTORIAL = 1000
_MAX_FACTORED_RADICAND = 10**12
# ``\frac{a}{b}``, ``\dfrac{a}{b}``, ``a/b`` between integers as written (the LaTeX parser reduces them at once).
_WRITTEN_FRACTION = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}|(?<![\d.])(\d+)\s*/\s*(\d+)(?![\d.])")


def is_numeric(expr: sympy.Basic) -> bool:
    """A value made of numbers only: no free symbol (so ``x + 1`` and ``2^{n}`` are expressions, not values)."""
    return isinstance(expr, sympy.Basic) and not expr.free_symbols


def is_stated_value(expr: sympy.Basic, text: str) -> bool:
    """True when ``expr`` — the answer parsed under ``sympy.evaluate(False)`` from ``text`` — states a value
    (``RULES``) rather than leaving arithmetic to be done."""
    if _has_unreduced_fraction(text):
        return False
    return not any(_is_unevaluated(node) for node in sympy.preorder_traversal(expr))


def _has_unreduced_fraction(text: str) -> bool:
    for match in _WRITTEN_FRACTION.finditer(text):
        numerator, denominator = (int(g) for g in (match.groups()[:2] if match.group(1) else match.groups()[2:]))
        if denominator in (0, 1, -1) or math.gcd(numerator, denominator) != 1:
            return True
    return False


def _is_unevaluated(node: sympy.Basic) -> bool:
    if node.is_Atom or not node.args or node.free_symbols or not isinstance(node, sympy.Expr):
        return False  # literals, symbols, and containers (intervals, tuples, sets) are judged by their parts
    if _too_large_to_compute(node):
        return True
    if isinstance(node, sympy.Pow) and _is_unsimplified_root(node):
        return True
    if _is_literal_form(node):
        return False
    value = node.doit()  # bounded by _too_large_to_compute
    if _is_rational_number(value):
        return True  # 7 * 8, \binom{5}{2}, \sqrt{49}, 20 * .25: a rational computed from numbers
    rational_terms = [arg for arg in node.args if _is_rational_number(arg)]
    return isinstance(node, (sympy.Add, sympy.Mul)) and len(rational_terms) >= 2


def _is_rational_number(value: sympy.Basic) -> bool:
    # A decimal written in plain text ("8.5") is a sympy Float, whose is_rational sympy leaves unknown.
    return bool(value.is_rational) or isinstance(value, sympy.Float)


def _is_literal_form(node: sympy.Expr) -> bool:
    """How math-verify writes a number that is stated: ``-5`` as ``Mul(-1, 5)``, ``1/2`` as ``Mul(1, Pow(2, -1))``,
    ``10\\%`` as ``Mul(1/100, 10)``."""
    if isinstance(node, sympy.Pow) and node.exp == -1 and node.base.is_Integer:
        return True  # a written fraction's denominator: \frac{1+\sqrt{5}}{2} is Mul(Pow(2, -1), …)
    if not isinstance(node, sympy.Mul) or len(node.args) != 2:
        return False
    first, second = node.args
    if isinstance(second, sympy.Pow) and second.exp == -1 and first.is_Integer and second.base.is_Integer:
        return True  # p/q as written in plain text; lowest terms is checked on the text
    if sympy.Rational(1, 100) in node.args:
        return all(arg.is_Rational for arg in node.args)  # a percentage
    return -1 in node.args and all(arg.is_Rational for arg in node.args)


def _is_unsimplified_root(node: sympy.Pow) -> bool:
    base, exponent = node.base, node.exp
    if not (base.is_Integer and exponent.is_Rational and not exponent.is_Integer and exponent.p == 1):
        return False
    if base > _MAX_FACTORED_RADICAND:
        return True
    return any(power >= exponent.q for power in sympy.factorint(abs(int(base))).values())


def _too_large_to_compute(node: sympy.Expr) -> bool:
    if isinstance(node, sympy.Pow) and node.exp.is_Integer and abs(node.exp) > _MAX_EXPONENT:
        return True
    if isinstance(node, sympy.Pow) and not node.exp.is_Atom:
        return True  # a tower such as 9^{9^{9}}: nobody states a value like that
    if isinstance(node, (sympy.factorial, sympy.binomial)):
        return any(arg.is_Integer and abs(arg) > _MAX_FACTORIAL for arg in node.args)
    return False
