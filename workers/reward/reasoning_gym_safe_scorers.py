"""Our own transcriptions of the reasoning-gym scorers that evaluate text as Python code.

These tasks' ``score_answer`` call ``eval`` or sympy's ``parse_expr`` (itself an ``eval``) on the model's
answer (spiral_matrix, string_insertion, binary_matrix, n_queens, countdown, puzzle24,
polynomial_multiplication, simple_integration, intermediate_integration) or on the entry's own text
(bitwise_arithmetic, number_sorting). An answer that is evaluated is code the policy wrote, running in the
verifier: it can patch the verifier so that every later answer scores 1.0. Each function below follows its
task's scorer line by line (reasoning-gym 0.1.x; the original's return values kept, including its partial
credits) but builds values with parsers that never run code:

- ``literal_value``: ``ast.literal_eval`` (Python literals only) where the task ``eval``-ed a list, matrix or
  board; a list comprehension, ``list("abc")`` and the like, which ``eval`` accepted, now fail — only the
  partial-credit branch of those tasks (0.1 / 0.5) is affected, full marks are an exact string match;
- ``sympy_value``: sympy's own tokenizer and transformations (``stringify_expr``, as ``parse_expr`` does),
  then the resulting Python expression walked node by node into sympy constructors: numbers, the task's
  symbols, a fixed list of sympy functions and constants, + - * / ** ^ % // and parentheses. Size, depth,
  exponent and factorial arguments are capped, so that a short answer cannot ask for a huge number.
Any other construct is ``UnsafeAnswer``, handled where the original handled its parse errors.

One deliberate difference: ``Integral`` is not in the grammar. intermediate_integration's generator leaves some
golds unevaluated ("-3*Integral(x**2*sin(x), x) + C"), and the task's scorer pays 1.0 for any answer that
restates the question as ``Integral(integrand, x)``; here that answer scores 0 (a closed form still scores 1).

``tests/workers/reward/test_reward_reasoning_gym_safe_scorers.py`` checks each against the task's own
scorer on generated entries with gold answers, wrong answers and near misses.
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import operator
import re
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy
from sympy.parsing.sympy_parser import stringify_expr, standard_transformations


class UnsafeAnswer(ValueError):
    """The text is not a value our parsers build (too long, too deep, or not in the grammar)."""


MAX_LITERAL_CHARS = 100_000  # a 100×100 matrix of small numbers is ~30,000 characters
MAX_EXPRESSION_CHARS = 2_000  # every gold expression of these tasks is under 200 characters
MAX_EXPRESSION_NODES = 2_000
MAX_EXPRESSION_DEPTH = 60
MAX_EXPONENT = 1_000  # |n| in x**n; the golds' exponents are below 20
MAX_RESULT_BITS = 100_000  # a number**number may not exceed 2**100000 (about 30,000 digits)
MAX_FACTORIAL = 1_000

ScoreFn = Callable[[Any, str | None, dict[str, Any]], float]  # (task's dataset instance, answer, entry) -> score


# --- value parsers -----------------------------------------------------------------------------------

def literal_value(text: str) -> Any:
    """A Python literal (numbers, strings, lists, tuples, dicts, sets), built without running code."""
    if len(text) > MAX_LITERAL_CHARS:
        raise UnsafeAnswer(f"literal of {len(text)} characters (limit {MAX_LITERAL_CHARS})")
    return ast.literal_eval(text)


_SYMPY_FUNCTIONS = {name: getattr(sympy, name) for name in (
    "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "sinh", "cosh", "tanh",
    "asinh", "acosh", "atanh", "exp", "log", "ln", "sqrt", "Abs", "sign")}
_SYMPY_CONSTANTS = {"E": sympy.E, "pi": sympy.pi, "I": sympy.I, "oo": sympy.oo}
_BINARY_OPERATORS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
    # parse_expr's default transformations do not turn ^ into **: in the task's scorer "x^2" is Python's xor,
    # which sympy rejects for numbers (TypeError) — kept, so that such an answer scores as it did.
    ast.BitXor: operator.xor,
}
_UNARY_OPERATORS = {ast.USub: operator.neg, ast.UAdd: operator.pos}


@functools.cache
def _parse_expr_namespace() -> dict[str, Any]:
    """The global names ``parse_expr`` gives its transformations (``from sympy import *``, builtin functions,
    max/min): they decide which names stay names and which become ``Symbol``s, so ours must be the same."""
    namespace = {name: getattr(sympy, name) for name in sympy.__all__}
    for name, value in vars(builtins).items():
        if isinstance(value, types.BuiltinFunctionType):
            namespace[name] = value
    namespace["max"], namespace["min"] = sympy.Max, sympy.Min
    return namespace


def sympy_value(text: str, local_dict: dict[str, Any] | None = None) -> Any:
    """What ``sympy.parse_expr(text, local_dict=local_dict)`` returns for an expression in our grammar;
    ``UnsafeAnswer`` for anything else."""
    if not isinstance(text, str):
        raise UnsafeAnswer(f"expression must be text, not {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise UnsafeAnswer(f"expression of {len(text)} characters (limit {MAX_EXPRESSION_CHARS})")
    local_dict = dict(local_dict or {})
    code = stringify_expr(text, local_dict, _parse_expr_namespace(), standard_transformations)
    try:
        tree = ast.parse(code.strip(), mode="eval")
    except (SyntaxError, ValueError) as error:
        raise UnsafeAnswer(f"not an expression: {text[:80]!r}") from error
    if sum(1 for _ in ast.walk(tree)) > MAX_EXPRESSION_NODES:
        raise UnsafeAnswer(f"expression of more than {MAX_EXPRESSION_NODES} nodes")
    return _build(tree.body, local_dict, 0)


def _build(node: ast.AST, local_dict: dict[str, Any], depth: int) -> Any:
    if depth > MAX_EXPRESSION_DEPTH:
        raise UnsafeAnswer(f"expression nested deeper than {MAX_EXPRESSION_DEPTH}")
    depth += 1
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
        return _BINARY_OPERATORS[type(node.op)](_build(node.left, local_dict, depth),
                                                _build(node.right, local_dict, depth))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_build(node.left, local_dict, depth), _build(node.right, local_dict, depth))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPERATORS:
        return _UNARY_OPERATORS[type(node.op)](_build(node.operand, local_dict, depth))
    if isinstance(node, ast.Name):
        if node.id in local_dict:
            return local_dict[node.id]
        if node.id in _SYMPY_CONSTANTS:
            return _SYMPY_CONSTANTS[node.id]
        raise UnsafeAnswer(f"name {node.id!r} is not in the expression grammar")
    if isinstance(node, ast.Call) and not node.keywords:
        return _call(node, local_dict, depth)
    raise UnsafeAnswer(f"{type(node).__name__} is not in the expression grammar")


def _call(node: ast.Call, local_dict: dict[str, Any], depth: int) -> Any:
    """The constructor calls sympy's transformations write (``Integer('2')``, ``Symbol('y')``,
    ``Function('f')(x)``, ``factorial(n)``) and the listed sympy functions; nothing else."""
    func = node.func
    constants = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
    all_constant = len(constants) == len(node.args)
    if isinstance(func, ast.Name):
        name = func.id
        if name in ("Integer", "Float") and all_constant and len(constants) == 1 \
                and isinstance(constants[0], str | int) and not isinstance(constants[0], bool):
            return getattr(sympy, name)(constants[0])
        if name == "Rational" and all_constant and len(constants) in (1, 2) \
                and all(isinstance(value, str | int) and not isinstance(value, bool) for value in constants):
            return sympy.Rational(*constants)
        if name == "Symbol" and all_constant and len(constants) == 1 and _is_identifier(constants[0]):
            return sympy.Symbol(constants[0])
        args = [_build(arg, local_dict, depth) for arg in node.args]
        if name in _SYMPY_FUNCTIONS and len(args) in (1, 2):
            return _SYMPY_FUNCTIONS[name](*args)
        if name == "factorial" and len(args) == 1:
            if args[0].is_Number and abs(args[0]) > MAX_FACTORIAL:
                raise UnsafeAnswer(f"factorial of {args[0]} (limit {MAX_FACTORIAL})")
            return sympy.factorial(args[0])
        raise UnsafeAnswer(f"call of {name!r} is not in the expression grammar")
    # An undefined function applied: Function('f')(x), as auto_symbol writes "f(x)".
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "Function" \
            and len(func.args) == 1 and isinstance(func.args[0], ast.Constant) and _is_identifier(func.args[0].value) \
            and not func.keywords:
        return sympy.Function(func.args[0].value)(*[_build(arg, local_dict, depth) for arg in node.args])
    raise UnsafeAnswer("this call is not in the expression grammar")


def _is_identifier(value: object) -> bool:
    return isinstance(value, str) and value.isidentifier() and not value.startswith("__")


def _power(base: Any, exponent: Any) -> Any:
    # A number's size cap: 9**9**9 is three tokens and a number of 370 million digits.
    if getattr(exponent, "is_Number", False) and abs(exponent) > MAX_EXPONENT:
        raise UnsafeAnswer(f"exponent {exponent} (limit {MAX_EXPONENT})")
    if getattr(base, "is_Integer", False) and getattr(exponent, "is_Number", False) and base != 0:
        bits = int(abs(base)).bit_length() * abs(float(exponent))
        if bits > MAX_RESULT_BITS:
            raise UnsafeAnswer(f"{base}**{exponent} has about {bits:.0f} bits (limit {MAX_RESULT_BITS})")
    return operator.pow(base, exponent)


# --- the tasks' scorers ---------------------------------------------------------------------------------

def _spiral_matrix(task, answer, entry):
    oracle_answer = entry["answer"].strip()
    if answer is not None and len(answer) > 0:
        answer = answer.strip()
        if answer == oracle_answer:
            return 1.0
        try:
            answer = " ".join(str(item) for item in literal_value(answer))
            if answer == oracle_answer:
                return 0.1
        except Exception:  # noqa: BLE001 - as the original: anything unparsable is simply wrong
            pass
    return 0.0


def _string_insertion(task, answer, entry):
    oracle_answer = entry["answer"]
    if isinstance(answer, str):
        if answer == oracle_answer:
            return 1.0
        try:
            answer = "".join(literal_value(answer))  # "check if answer is python list of characters"
            if answer == oracle_answer:
                return 0.1
        except Exception:  # noqa: BLE001
            pass
    return 0.0


def _matrix_to_str(matrix) -> str:  # BinaryMatrixDataset._matrix_to_str
    return "\n".join(" ".join(str(x) for x in row) for row in matrix)


def _binary_matrix(task, answer, entry):
    oracle_answer = entry["answer"]
    if answer is not None:
        if answer == oracle_answer:
            return 1.0
        try:
            answer = _matrix_to_str(literal_value(answer))
            if answer == oracle_answer:
                return 0.1
        except Exception:  # noqa: BLE001
            return 0.0
    return 0.0


def _board_to_string(board) -> str:  # NQueensDataset._board_to_string
    return "\n".join(" ".join(x for x in row) for row in board)


def _n_queens(task, answer, entry):
    if isinstance(answer, str):
        valid_solutions = entry["metadata"]["valid_answers"]
        if answer in valid_solutions:
            return 1.0
        try:
            answer = _board_to_string(literal_value(answer))
            if answer in valid_solutions:
                return 0.5
        except Exception:  # noqa: BLE001
            pass
    return 0.0


_COUNTDOWN_NUMBER = re.compile(r"\b\d+\b")  # countdown._num_re


def _countdown(task, answer, entry):
    reward = 0.01
    if answer is None or not answer.strip():
        return reward
    try:
        user_answer = float(sympy_value(answer))
        used_numbers = [int(m) for m in _COUNTDOWN_NUMBER.findall(answer)]
        target_numbers = entry["metadata"]["numbers"]
        if sorted(used_numbers) != sorted(target_numbers):
            return 0.05
        if np.isclose(user_answer, entry["metadata"]["target"], atol=1e-6):
            return 1.0
        return 0.05 if answer else 0.01
    except Exception:  # noqa: BLE001
        return 0.01


def _puzzle24(task, answer, entry):
    reward = 0.01
    if answer is not None:
        try:
            answer = answer.strip()
            user_answer = int(sympy_value(answer))
            solved = user_answer == 24
            used_numbers = [int(num) for num in re.findall(r"\b\d+\b", answer)]
            if len(used_numbers) != 4:
                reward = 0.01
            elif any(num > task.config.max_value or num < task.config.min_value for num in used_numbers):
                reward = 0.01
            elif not solved:
                reward = 0.01
            else:
                reward = 1.0
        except Exception:  # noqa: BLE001
            reward = 0.01
    return reward


def _polynomial_multiplication(task, answer, entry):
    reward = 0.0
    if answer is not None:
        try:
            if sympy_value(answer) == sympy_value(entry["answer"]):
                reward = 1.0
        except Exception:  # noqa: BLE001
            reward = 0.0
    return reward


def _integration(task, answer, entry):  # simple_integration and intermediate_integration score alike
    reward = 0.0
    metadata = entry["metadata"]
    if isinstance(answer, str):  # simple_integration tests "is not None"; only strings reach us
        try:
            var = metadata["variable"]
            x = sympy.Symbol(var)
            user_expr = sympy_value(answer, {var: x, "C": sympy.Symbol("C")})  # the constant C allowed
            derivative = sympy.diff(user_expr, x)
            integrand = sympy_value(metadata["integrand"], {var: x})
            if sympy.simplify(derivative - integrand) == 0:
                reward = 1.0
        except Exception:  # noqa: BLE001 - the original's bare except
            reward = 0.0
    return reward


_BITWISE_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                      ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def _integer_expression(node: ast.AST) -> int:
    """bitwise_arithmetic's problem (the entry's own text, e.g. "((0x3a2f << 0x2) - 0x1b)"), as Python's eval
    computes it, for integers and + - * << >> only."""
    if isinstance(node, ast.Expression):
        return _integer_expression(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_integer_expression(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BITWISE_OPERATORS:
        left, right = _integer_expression(node.left), _integer_expression(node.right)
        if isinstance(node.op, ast.LShift) and right > MAX_RESULT_BITS:
            raise UnsafeAnswer(f"shift by {right} (limit {MAX_RESULT_BITS})")
        return _BITWISE_OPERATORS[type(node.op)](left, right)
    raise UnsafeAnswer(f"{type(node).__name__} in a bitwise_arithmetic problem")


def _bitwise_arithmetic(task, answer, entry):
    if isinstance(answer, str):
        try:  # verify_solution(problem, answer)
            correct_value = _integer_expression(ast.parse(entry["metadata"]["problem"], mode="eval"))
            user_value = int(str(answer), 0)
            if correct_value == user_value:
                return 1.0
        except Exception:  # noqa: BLE001
            pass
    return 0.0


def _number_sorting(task, answer, entry):
    if answer is None:
        return 0.0
    try:
        try:
            answer = answer.replace("'", '"')
            user_answer = json.loads(answer)
        except json.JSONDecodeError:
            return 0.0
        if not isinstance(user_answer, list):
            return 0.0
        try:
            expected_answer = json.loads(entry["answer"])
        except json.JSONDecodeError:
            expected_answer = literal_value(entry["answer"])  # the original eval-ed its own gold here
        if len(user_answer) != len(expected_answer):
            return 0.0
        user_floats = [float(num) for num in user_answer]
        expected_floats = [float(num) for num in expected_answer]
        direction = entry["metadata"]["direction"]
        if direction == "ascending":
            is_correctly_sorted = user_floats == sorted(user_floats)
        else:
            is_correctly_sorted = user_floats == sorted(user_floats, reverse=True)
        if not is_correctly_sorted:
            return 0.0
        tolerance = 1
        for i in range(len(user_floats)):
            if abs(user_floats[i] - expected_floats[i]) > tolerance:
                return 0.0
        return 1.0
    except Exception:  # noqa: BLE001
        return 0.0


SAFE_SCORERS: dict[str, ScoreFn] = {
    "spiral_matrix": _spiral_matrix,
    "string_insertion": _string_insertion,
    "binary_matrix": _binary_matrix,
    "n_queens": _n_queens,
    "countdown": _countdown,
    "puzzle24": _puzzle24,
    "polynomial_multiplication": _polynomial_multiplication,
    "simple_integration": _integration,
    "intermediate_integration": _integration,
    "bitwise_arithmetic": _bitwise_arithmetic,
    "number_sorting": _number_sorting,
}
# Tasks whose checks always error, and why.
REFUSED_TASKS: dict[str, str] = {
    "composite": "it scores each entry with its sub-task's own scorer (eval-ing ones included, past our "
                 "transcriptions) and cannot be built without its configuration; generate the sub-tasks instead",
}
