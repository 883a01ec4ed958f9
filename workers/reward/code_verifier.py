"""Code domain (HumanEval format): the completion's function must pass the problem's check program.

The verdict is made here, in the verifier's own process, never by the candidate. The problem's
prompt (it defines helpers the tests use, such as ``poly`` or ``encode_cyclic``) and its tests run
here; ``check`` gets a proxy for ``candidate``, and each call crosses to the candidate's function in
the sandbox and back as plain data only (``call_boundary``): the return value the tests compare is
a genuine builtin, arguments are copies, and nothing the program does in its own process — exit
early, print, patch ``sys.exit``/``builtins``/``assert``, register ``atexit`` hooks, return an object
equal to everything — reaches the tests. Score 1 if ``check`` returns, else 0: an assertion fails,
the candidate raises, dies, returns something that is not plain data, or breaks the protocol.
An exception escaping the candidate is a failure wherever the test calls it: a StopIteration (or
StopAsyncIteration) comes back as ``CandidateRaised``, never as itself, so it cannot end a test's
``all(map(candidate, xs))`` early and pass it. A candidate that runs past the sandbox's wall clock is a
``CheckTimeout``.

What counts as the completion's program:
- the last fenced block (```python … ```) that defines ``entry_point``, else the first fenced block,
  else the whole completion (an unclosed fence — a truncated generation — runs to the end);
- if it defines ``def entry_point(``, it runs after the prompt's import lines (a rewritten function
  still needs the prompt's ``from typing import List``); otherwise it is a continuation of the
  prompt's function, as in HumanEval, and runs as ``prompt + program``.
"""

from __future__ import annotations

import builtins
import functools
import os
import re
import select
import time
from pathlib import Path

from workers.problem import Problem
from workers.reward import call_boundary
from workers.reward.config import SandboxConfig
from workers.reward.results import CheckError, CheckTimeout
from workers.reward.sandbox import sandboxed_python

_FENCED_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_IMPORT_LINE = re.compile(r"^(?:import|from)\s+\S+.*$", re.MULTILINE)


def verify_code(completion: str, problem: Problem, *, sandbox: SandboxConfig | None = None) -> float:
    """1.0 if the completion's function passes ``problem.tests``, else 0.0."""
    sandbox = sandbox or SandboxConfig()
    entry_point = problem.metadata.get("entry_point")
    if not problem.tests or not entry_point:
        raise CheckError(f"code problem {problem.id} needs tests and metadata['entry_point']")
    check = _trusted_check(problem)
    request_read, request_write = os.pipe()
    response_read, response_write = os.pipe()
    server = _server_program(program_under_test(completion, problem.prompt, entry_point), entry_point,
                             request_read, response_write)
    try:
        with sandboxed_python(server, sandbox, pass_fds=(request_read, response_write)) as running:
            os.close(request_read)
            os.close(response_write)
            request_read = response_write = -1
            proxy = CandidateProxy(request_write, response_read, running.deadline)
            # Tests may name the function instead of ``candidate`` (HumanEval/33 compares with
            # ``sort_third(...)``): in the original harness that name is the candidate's function too.
            check.__globals__[entry_point] = proxy
            try:
                passed = _passes(check, proxy)
            finally:
                # The verdict is in: the closed pipe ends the call loop, and whatever the program still
                # does after a short grace (an atexit hook that sleeps) is killed, not waited for.
                os.close(request_write)
                request_write = -1
                running.stop_now()
    finally:
        for fd in (request_read, request_write, response_read, response_write):
            if fd >= 0:
                os.close(fd)
    if proxy.timed_out:
        raise CheckTimeout(f"sandbox: timeout after {sandbox.wall_timeout_s:g} s")
    if proxy.calls == 0:
        raise CheckError(f"the tests of code problem {problem.id} never call the candidate")
    return 1.0 if passed and proxy.failure is None else 0.0


def _passes(check, proxy: CandidateProxy) -> bool:
    try:
        check(proxy)
    except CheckError:
        raise  # the tests themselves cannot be judged (they pass a value that is not plain data)
    except (Exception, _BoundaryFailure):
        return False
    return True


def _trusted_check(problem: Problem):
    """``check`` of the problem's tests, defined here with the prompt's helpers in scope."""
    namespace: dict = {"__name__": "__gmts_check__", "__builtins__": builtins}
    try:
        prompt_code = compile(problem.prompt, f"<prompt of {problem.id}>", "exec")
    except SyntaxError:
        prompt_code = None  # a prompt that is prose, not code: the tests must stand alone
    try:
        if prompt_code is not None:
            exec(prompt_code, namespace)  # noqa: S102 - the dataset's own code, trusted
        exec(compile(problem.tests, f"<tests of {problem.id}>", "exec"), namespace)  # noqa: S102
    except Exception as error:  # noqa: BLE001 - a broken dataset entry cannot judge anything
        raise CheckError(f"the tests of code problem {problem.id} do not run: {type(error).__name__}: {error}") from None
    check = namespace.get("check")
    if not callable(check):
        raise CheckError(f"the tests of code problem {problem.id} define no check(candidate)")
    return check


@functools.cache
def _boundary_source() -> str:
    return Path(call_boundary.__file__).read_text(encoding="utf-8")


def _server_program(candidate_source: str, entry_point: str, request_fd: int, response_fd: int) -> str:
    """The sandboxed program: the boundary's code, then the candidate's, then the call loop."""
    return (f"{_boundary_source()}\n\n"
            f"run_server_main({entry_point!r}, {candidate_source!r}, 'candidate.py', {request_fd}, {response_fd})\n")


class _BoundaryFailure(BaseException):
    """The candidate died, timed out or broke the protocol. A BaseException, so that a test's
    ``except Exception`` cannot swallow it; the proxy also remembers it, so that no handler can."""


class CandidateRaised(Exception):
    """The candidate raised an exception that is not a plain builtin one, or a StopIteration (below)."""


class CandidateProxy:
    """Stands for ``candidate`` in the trusted tests; each call runs the function in the sandbox."""

    def __init__(self, request_fd: int, response_fd: int, deadline: float):
        self._request_fd = request_fd
        self._response_fd = response_fd
        self._deadline = deadline
        self.calls = 0
        self.failure: str | None = None  # the first failure of the boundary; the check fails then
        self.timed_out = False

    def __call__(self, *args, **kwargs):
        if self.failure is not None:
            raise _BoundaryFailure(self.failure)
        self.calls += 1
        try:
            request = {"args": call_boundary.encode(list(args)),
                       "kwargs": [[name, call_boundary.encode(value)] for name, value in kwargs.items()]}
        except call_boundary.NotPlainData as error:
            raise CheckError(f"the tests pass the candidate a value that is not plain data: {error}") from None
        try:
            self._write(call_boundary.write_frame_bytes(request))
            response = call_boundary.read_frame(self._response_fd, self._read_exactly)
            return self._result(response)
        except TimeoutError:
            self.timed_out = True
            self._fail("the candidate did not answer before the wall clock")
        except (EOFError, BrokenPipeError):
            self._fail("the candidate's process ended")
        except call_boundary.ProtocolError as error:
            self._fail(f"the candidate broke the call protocol: {error}")

    def _fail(self, reason: str):
        self.failure = self.failure or reason
        raise _BoundaryFailure(reason)

    @staticmethod
    def _result(response: object):
        if type(response) is dict and set(response) == {"return"}:
            return call_boundary.decode(response["return"])
        if (type(response) is dict and set(response) == {"raise"} and type(response["raise"]) is list
                and len(response["raise"]) == 2 and all(type(part) is str for part in response["raise"])):
            raise _rebuilt_exception(*response["raise"])
        raise call_boundary.ProtocolError("a response must be {'return': value} or {'raise': [type, message]}")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._wait_until(select.POLLOUT, self._request_fd)
            view = view[os.write(self._request_fd, view[:65536]):]

    def _read_exactly(self, fd: int, size: int) -> bytes:
        return call_boundary.read_exactly(fd, size, wait=lambda ready: self._wait_until(select.POLLIN, ready))

    def _wait_until(self, event: int, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, event)
        remaining_ms = max(0, int((self._deadline - time.monotonic()) * 1000))
        if not poller.poll(remaining_ms):
            raise TimeoutError


# Exceptions that, raised inside an iteration, end it instead of propagating: from a call in
# ``all(map(candidate, xs))`` a StopIteration tells ``map`` its input is exhausted, and ``all`` of the
# shortened sequence is True. PEP 479 turns them into RuntimeError inside generators (a generator
# expression in a test is safe); ``map``, ``filter``, ``zip`` and a test's own ``__next__``/``__anext__``
# have no such rule, so they never come back under their own type. Only the entry point's calls cross
# the boundary, so this one place covers every function and class of the candidate's program, whose own
# iterators (``__next__``, generators, ``next(it, default)``) work as usual inside the sandbox.
_ITERATION_ENDING = frozenset({"StopIteration", "StopAsyncIteration"})


def _rebuilt_exception(type_name: str, message: str) -> Exception:
    """A builtin exception of that name (so a test may expect ``ValueError``), else ``CandidateRaised``;
    always ``CandidateRaised`` for one that would end the test's iteration (``_ITERATION_ENDING``)."""
    exception_type = getattr(builtins, type_name, None)
    if type_name in _ITERATION_ENDING:
        exception_type = None
    if isinstance(exception_type, type) and issubclass(exception_type, Exception):
        try:
            return exception_type(message)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
            pass
    return CandidateRaised(f"{type_name}: {message}")


def program_under_test(completion: str, prompt: str, entry_point: str) -> str:
    """The Python source to test, following the rules of the module docstring."""
    defines_entry_point = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    blocks = _FENCED_BLOCK.findall(completion)
    defining = [block for block in blocks if defines_entry_point.search(block)]
    program = defining[-1] if defining else blocks[0] if blocks else completion
    if defines_entry_point.search(program):
        return "\n".join(_IMPORT_LINE.findall(prompt)) + "\n\n" + program
    return prompt + program
