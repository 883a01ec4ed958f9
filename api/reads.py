"""List and get responses as ready JSON bytes, rebuilt only when the submission store has changed.

Between two reconciler passes (every ``GMTS_RECONCILE_INTERVAL_S``) nothing a list or get shows can
change, but clients poll far more often than that; the target is p99 ≤ 200 ms with 50 concurrent
clients on a busy 2-core machine (benchmarks/api_reads.py), where every millisecond of CPU per request is queued 50 times.
A cached read is a dict lookup on the event loop (no SQLite query, no pydantic validation, no
thread-pool hop); a miss builds the body in the thread pool, since SQLite blocks.

Validity is exact, not a time-to-live: an entry belongs to the store's write counter at the moment
its build began (``SubmissionStore.version``). A write during a build leaves that entry already
stale, and the next read builds again, so no read ever serves data older than the last write it
could have seen.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from starlette.concurrency import run_in_threadpool

# Distinct (kind, limit, status) lists and ids polled between two writes; past it, start afresh.
MAX_ENTRIES = 1024


class ReadCache:
    def __init__(self, version: Callable[[], int]) -> None:
        self._version = version
        self._built_at = -1  # the store version every entry was built from
        self._bodies: dict[Hashable, bytes] = {}

    async def body(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        """The cached body of ``key``, or ``build()`` run in the thread pool (its exceptions propagate
        and nothing is cached, e.g. a 404)."""
        version = self._version()
        if version != self._built_at or len(self._bodies) >= MAX_ENTRIES:
            self._bodies = {}
            self._built_at = version
        cached = self._bodies.get(key)
        if cached is not None:
            return cached
        body = await run_in_threadpool(build)
        if self._built_at == version:  # no newer write emptied the cache meanwhile
            self._bodies[key] = body
        return body
