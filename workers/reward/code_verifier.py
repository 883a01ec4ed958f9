"""Code domain (HumanEval format): the completion's program must pass the problem's check program.

The program run in the sandbox is ``<completion program> + <problem.tests> + check(<entry_point>)``,
followed by a line that prints a random token drawn for this run. Score 1 if it exits 0 *and* printed
the token, else 0: a completion that ends the process early with exit code 0 (``sys.exit(0)``,
``os._exit(0)`` — a known way for RL policies to game unit-test rewards) never reaches the token.
What counts as the completion's program:
- the last fenced block (```python … ```) that defines ``entry_point``, else the first fenced block,
  else the whole completion (an unclosed fence — a truncated generation — runs to the end);
- if it defines ``def entry_point(``, it runs after the prompt's import lines (a rewritten function
  still needs the prompt's ``from typing import List``); otherwise it is a continuation of the
  prompt's function, as in HumanEval, and runs as ``prompt + program``.
"""

from __future__ import annotations

import re
import secrets
import signal

from workers.problem import Problem
from workers.reward.config import SandboxConfig
from workers.reward.results import CheckError, CheckTimeout
from workers.reward.sandbox import run_python_in_sandbox

_FENCED_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_IMPORT_LINE = re.compile(r"^(?:import|from)\s+\S+.*$", re.MULTILINE)


def verify_code(completion: str, problem: Problem, *, sandbox: SandboxConfig | None = None) -> float:
    """1.0 if the completion's program passes ``problem.tests`` in the sandbox, else 0.0."""
    sandbox = sandbox or SandboxConfig()
    entry_point = problem.metadata.get("entry_point")
    if not problem.tests or not entry_point:
        raise CheckError(f"code problem {problem.id} needs tests and metadata['entry_point']")
    finished_token = secrets.token_hex(16)
    source = (
        f"{program_under_test(completion, problem.prompt, entry_point)}\n\n{problem.tests}\n\n"
        f"check({entry_point})\nprint({finished_token!r}, flush=True)\n"
    )
    result = run_python_in_sandbox(source, sandbox)
    if result.timed_out:
        raise CheckTimeout(f"sandbox: timeout after {sandbox.wall_timeout_s:g} s")
    if result.exit_code < 0:
        # Killed by the kernel (CPU limit: SIGXCPU/SIGKILL) rather than failing a test: report it.
        raise CheckError(f"sandbox: killed by {signal.Signals(-result.exit_code).name}")
    return 1.0 if result.exit_code == 0 and finished_token in result.output_tail else 0.0


def program_under_test(completion: str, prompt: str, entry_point: str) -> str:
    """The Python source to test, following the rules of the module docstring."""
    defines_entry_point = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    blocks = _FENCED_BLOCK.findall(completion)
    defining = [block for block in blocks if defines_entry_point.search(block)]
    program = defining[-1] if defining else blocks[0] if blocks else completion
    if defines_entry_point.search(program):
        return "\n".join(_IMPORT_LINE.findall(prompt)) + "\n\n" + program
    return prompt + program
