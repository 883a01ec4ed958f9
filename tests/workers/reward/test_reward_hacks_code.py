"""Ways to earn the code reward without solving the problem, each kept as a regression case.

The forging attacks of ``benchmarks.reward_integrity`` (exit early, patch the harness, return an object
equal to everything…) are tested in ``test_reward_code_integrity.py``; this module holds the hacks that
use the *tests'* own control flow.

StopIteration: a check written as ``all(map(candidate, xs))`` iterates a ``map`` whose next item calls the
candidate. A StopIteration raised by that call is, to ``map``, the end of its input: ``all`` sees a shorter
(or empty) sequence and returns True. A candidate that solves the easy inputs and raises StopIteration on the
first hard one — or on every one — would pass. (A generator expression is safe: PEP 479 turns a
StopIteration inside a generator into RuntimeError; ``map``, ``filter`` and ``zip`` have no such rule.)
"""

from __future__ import annotations

import textwrap

import pytest

from workers.problem import Problem
from workers.reward.code_verifier import verify_code
from workers.reward.config import SandboxConfig

SANDBOX = SandboxConfig(cpu_seconds=2, memory_mb=512, wall_timeout_s=5.0)

# Checks of ``f(x) == x * x`` on 1..5 whose verdict survives a shortened iteration (an empty one included).
CHECK_SHAPES = {
    "all(map)": "assert all(map(lambda x: candidate(x) == x * x, XS))",
    "not any(map)": "assert not any(map(lambda x: candidate(x) != x * x, XS))",
    "list(filter)": "assert list(filter(lambda x: candidate(x) != x * x, XS)) == []",
    "sum(map)": "assert sum(map(lambda x: candidate(x) != x * x, XS)) == 0",
    "sorted(map)": "errors = sorted(map(lambda x: abs(candidate(x) - x * x), XS))\n"
                   "    assert not errors or errors[-1] == 0",
    "set(map)": "assert set(map(lambda x: candidate(x) == x * x, XS)) <= {True}",
    "dict(zip(map))": "got = dict(zip(XS, map(candidate, XS)))\n"
                      "    assert all(got[x] == x * x for x in got)",
    "min(map)": "assert min(map(lambda x: candidate(x) == x * x, XS), default=True)",
    "max(map)": "assert max(map(lambda x: abs(candidate(x) - x * x), XS), default=0) == 0",
    # A generator expression was never fooled (PEP 479): kept as the control of the shapes above.
    "all(genexpr)": "assert all(candidate(x) == x * x for x in XS)",
    # The asynchronous twin: StopAsyncIteration from __anext__ ends an ``async for``.
    "async for": "import asyncio\n"
                 "    class Results:\n"
                 "        def __init__(self): self.items = iter(XS)\n"
                 "        def __aiter__(self): return self\n"
                 "        async def __anext__(self):\n"
                 "            x = next(self.items, None)\n"
                 "            if x is None: raise StopAsyncIteration\n"
                 "            return candidate(x) == x * x\n"
                 "    async def collect():\n"
                 "        return [ok async for ok in Results()]\n"
                 "    assert all(asyncio.run(collect()))",
}

# Each solves x <= 2 and gives up on the rest (or on everything) by raising what ends an iteration.
STOPPING_CANDIDATES = {
    "raise StopIteration past 2": "def f(x):\n    if x > 2:\n        raise StopIteration\n    return x * x\n",
    "next() on an exhausted iterator":
        "def f(x):\n    if x > 2:\n        return next(iter(()))\n    return x * x\n",
    "raise StopIteration always": "def f(x):\n    raise StopIteration('give up')\n",
    "raise StopAsyncIteration past 2":
        "def f(x):\n    if x > 2:\n        raise StopAsyncIteration\n    return x * x\n",
}

# Honest, and built from iterators: next() with a default, a generator function, a class with __next__
# that ends by raising StopIteration — none of which may leak out of the call.
HONEST_WITH_ITERATORS = textwrap.dedent("""\
    def _squares():
        n = 0
        while True:
            yield n * n
            n += 1

    class _Countdown:
        def __init__(self, n): self.n = n
        def __iter__(self): return self
        def __next__(self):
            if self.n == 0:
                raise StopIteration
            self.n -= 1
            return self.n

    def f(x):
        steps = sum(1 for _ in _Countdown(x))
        squares = _squares()
        for _ in range(steps):
            next(squares)
        first_empty = next(iter(()), None)
        assert first_empty is None
        return next(squares)
    """)


def _problem(check_body: str) -> Problem:
    tests = f"XS = [1, 2, 3, 4, 5]\n\ndef check(candidate):\n    {check_body}\n"
    return Problem(id="custom", prompt="def f(x):\n", answer="", domain="code", tests=tests,
                   metadata={"entry_point": "f"})


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(CHECK_SHAPES))
def test_an_honest_candidate_built_on_iterators_passes_every_shape(shape):
    assert verify_code(HONEST_WITH_ITERATORS, _problem(CHECK_SHAPES[shape]), sandbox=SANDBOX) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("candidate", sorted(STOPPING_CANDIDATES))
@pytest.mark.parametrize("shape", sorted(CHECK_SHAPES))
def test_a_candidate_that_ends_the_checks_iteration_fails(shape, candidate):
    assert verify_code(STOPPING_CANDIDATES[candidate], _problem(CHECK_SHAPES[shape]), sandbox=SANDBOX) == 0.0


def test_a_stop_iteration_comes_back_as_a_failure_a_test_cannot_mistake_for_the_end_of_its_loop():
    # What the trusted side sees: neither StopIteration nor StopAsyncIteration, so a test's own
    # ``except StopIteration`` cannot catch it either — the price of the rule (as PEP 479's in generators):
    # no test can tell its own iteration's end from the candidate's.
    expecting = ("try:\n        candidate(3)\n    except StopIteration:\n        return\n"
                 "    raise AssertionError")
    candidate = STOPPING_CANDIDATES["raise StopIteration past 2"]
    assert verify_code(candidate, _problem(expecting), sandbox=SANDBOX) == 0.0
    catching_all = ("try:\n        candidate(3)\n    except Exception as error:\n"
                    "        assert 'StopIteration' in str(error)")
    assert verify_code(candidate, _problem(catching_all), sandbox=SANDBOX) == 1.0
