"""Verifier processes that run one check at a time each, under a hard wall-clock limit per check.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one stuck task. A check can hang
where no Python-level timeout reaches it (inside C code, e.g. a huge sympy computation), so here
the parent tracks when each check started, and past its deadline kills that process and starts a
replacement; the check scores 0 as a timeout and the rest of the batch goes on.

Processes are forked from the caller (``fork`` start method): they inherit the verifier modules
already imported, start in milliseconds, and run each check on their main thread, so math-verify's
``signal.alarm`` timeouts work. (``forkserver`` would avoid forking a multi-threaded caller such as a
Ray actor, but it re-imports the caller's ``__main__`` in every worker, which fails for stdin scripts
and re-imports Ray in actors; a forked worker only runs the verifiers and exits with ``os._exit``, so
it never touches the locks or state of the caller's other threads.)
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from workers.reward.results import CheckError, CheckTimeout, RewardResult

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 60.0  # a fresh process runs prepare() (the sandbox probe) first
_ERROR_TEXT_LIMIT = 500


class VerifierPool:
    """``num_workers`` processes that each call ``check(*item)`` for one item at a time.

    ``check`` returns a score and raises ``CheckError`` / ``CheckTimeout`` when it cannot judge;
    ``prepare()`` runs once in each process before its first check.
    """

    def __init__(self, check: Callable[..., float], num_workers: int, *, prepare: Callable[[], None] | None = None):
        self._check = check
        self._prepare = prepare
        self._context = multiprocessing.get_context("fork")
        self._workers: list[_Worker] = []
        try:
            for _ in range(num_workers):
                self._workers.append(self._start_worker())
            for worker in self._workers:
                worker.wait_until_ready()
        except BaseException:
            self.close()
            raise

    def run(self, items: Sequence[tuple[Any, ...]], deadlines_s: Sequence[float]) -> list[RewardResult]:
        """Check every item; ``deadlines_s[i]`` is item i's wall-clock limit from the moment it starts."""
        if len(items) != len(deadlines_s):
            raise ValueError(f"{len(items)} items but {len(deadlines_s)} deadlines")
        results: list[RewardResult | None] = [None] * len(items)
        waiting = deque(range(len(items)))
        running: dict[int, tuple[int, float]] = {}  # worker slot -> (item index, deadline as monotonic time)
        while waiting or running:
            for slot, worker in enumerate(self._workers):
                if slot not in running and waiting:
                    index = waiting.popleft()
                    self._send(slot, (index, items[index]))
                    running[slot] = (index, time.monotonic() + deadlines_s[index])
            next_deadline = min(deadline for _, deadline in running.values())
            ready = wait([self._workers[slot].connection for slot in running],
                         timeout=max(0.0, next_deadline - time.monotonic()))
            for slot in list(running):
                worker = self._workers[slot]
                index, deadline = running[slot]
                if worker.connection in ready:
                    results[index] = self._receive(slot, index)
                    del running[slot]
                elif time.monotonic() >= deadline:
                    results[index] = RewardResult(
                        0.0, f"timeout: verifier process killed after {deadlines_s[index]:g} s", timed_out=True
                    )
                    self._replace(slot)
                    del running[slot]
        return results  # type: ignore[return-value]  # every slot was filled above

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def _send(self, slot: int, message: tuple[int, tuple[Any, ...]]) -> None:
        try:
            self._workers[slot].connection.send(message)
        except OSError:  # the idle process died since its last check: replace it and retry once
            self._replace(slot)
            self._workers[slot].connection.send(message)

    def _receive(self, slot: int, index: int) -> RewardResult:
        worker = self._workers[slot]
        try:
            received_index, result = worker.connection.recv()
        except (EOFError, OSError):
            # The process died mid-check (killed by the OOM killer, a segfault in C code …).
            worker.process.join(timeout=1.0)
            result = RewardResult(0.0, f"verifier process died (exit code {worker.process.exitcode})")
            self._replace(slot)
            return result
        assert received_index == index, (received_index, index)
        return result

    def _replace(self, slot: int) -> None:
        self._workers[slot].stop()
        self._workers[slot] = self._start_worker()
        self._workers[slot].wait_until_ready()

    def _start_worker(self) -> _Worker:
        parent_end, child_end = self._context.Pipe()
        # A forked child holds copies of every pipe end open in the parent. It must close the parent's
        # ends, or it would never see EOF when the parent dies (e.g. a killed Ray actor) and would live on.
        parent_ends = [parent_end, *(worker.connection for worker in self._workers if not worker.connection.closed)]
        process = self._context.Process(target=_serve, args=(child_end, self._check, self._prepare, parent_ends),
                                        daemon=True, name="reward-verifier")
        process.start()
        child_end.close()
        return _Worker(process, parent_end)


class _Worker:
    def __init__(self, process: multiprocessing.process.BaseProcess, connection: Connection):
        self.process = process
        self.connection = connection

    def wait_until_ready(self) -> None:
        if not self.connection.poll(_START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"a verifier process did not start within {_START_TIMEOUT_S:g} s")
        try:
            self.connection.recv()  # the "ready" message
        except EOFError:
            self.process.join(timeout=5.0)
            raise RuntimeError(
                f"a verifier process exited while starting (exit code {self.process.exitcode})"
            ) from None

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)
        self.connection.close()


def _serve(connection: Connection, check: Callable[..., float], prepare: Callable[[], None] | None,
           parent_ends: list[Connection]) -> None:
    """Body of a verifier process: answer (index, item) messages until the pipe closes."""
    for parent_end in parent_ends:
        parent_end.close()
    if prepare is not None:
        prepare()
    connection.send("ready")
    while True:
        try:
            index, item = connection.recv()
        except EOFError:
            return
        connection.send((index, run_check(check, item)))


def run_check(check: Callable[..., float], item: tuple[Any, ...]) -> RewardResult:
    """``check(*item)`` as a ``RewardResult``: an error or an out-of-range score is a 0 with its reason, never a raise."""
    try:
        score = float(check(*item))
    except CheckTimeout as timeout:
        return RewardResult(0.0, str(timeout), timed_out=True)
    except CheckError as error:
        return RewardResult(0.0, str(error)[:_ERROR_TEXT_LIMIT])
    except Exception as error:  # a reward never crashes the run: any verifier bug scores 0 and is counted
        logger.debug("verifier raised", exc_info=True)
        return RewardResult(0.0, f"{type(error).__name__}: {error}"[:_ERROR_TEXT_LIMIT])
    if not 0.0 <= score <= 1.0:
        return RewardResult(0.0, f"verifier returned {score!r}, outside [0, 1]")
    return RewardResult(score)
