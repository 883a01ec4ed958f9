import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from workers.reward.results import CheckError, CheckTimeout
from workers.reward.verifier_pool import VerifierPool


def _square_or_misbehave(x: int) -> float:
    """A real check function with every way a verifier can end (the pool forks, so it can live here)."""
    if x == -1:
        time.sleep(3600)  # hangs where no timeout of its own reaches it
    if x == -2:
        os.kill(os.getpid(), signal.SIGKILL)  # dies, like an OOM kill or a segfault
    if x == -3:
        raise CheckTimeout("timeout: gave up")
    if x == -4:
        raise CheckError("cannot judge")
    if x == -5:
        raise ZeroDivisionError("bug in a verifier")
    if x == -6:
        return 1.5  # out of range
    return (x % 2) * 1.0


@pytest.fixture
def pool():
    with_pool = VerifierPool(_square_or_misbehave, num_workers=2)
    yield with_pool
    with_pool.close()


def test_results_keep_the_input_order(pool):
    results = pool.run([(x,) for x in range(20)], [5.0] * 20)
    assert [result.score for result in results] == [float(x % 2) for x in range(20)]
    assert all(result.error is None for result in results)


@pytest.mark.slow
def test_a_hanging_check_is_killed_at_its_deadline_and_the_batch_goes_on(pool):
    started = time.monotonic()
    results = pool.run([(-1,), (1,), (3,), (-1,), (5,)], [1.0] * 5)
    elapsed = time.monotonic() - started
    assert [result.score for result in results] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert results[0].timed_out and results[3].timed_out and "killed after 1 s" in results[0].error
    assert elapsed < 4.0  # both hangs run at once on the two processes, then are replaced
    # The replacement processes work.
    assert [result.score for result in pool.run([(1,), (3,)], [5.0, 5.0])] == [1.0, 1.0]


def test_a_dying_process_scores_zero_and_is_replaced(pool):
    results = pool.run([(-2,), (1,), (-2,), (3,)], [5.0] * 4)
    assert [result.score for result in results] == [0.0, 1.0, 0.0, 1.0]
    assert results[0].error == f"verifier process died (exit code {-signal.SIGKILL})"
    assert not results[0].timed_out


def test_verifier_exceptions_become_counted_errors(pool):
    timeout, error, bug, out_of_range = pool.run([(-3,), (-4,), (-5,), (-6,)], [5.0] * 4)
    assert timeout.timed_out and timeout.error == "timeout: gave up"
    assert error.error == "cannot judge" and not error.timed_out
    assert bug.error == "ZeroDivisionError: bug in a verifier"
    assert out_of_range.error == "verifier returned 1.5, outside [0, 1]"
    assert all(result.score == 0.0 for result in (timeout, error, bug, out_of_range))


def test_close_ends_the_processes():
    pool = VerifierPool(_square_or_misbehave, num_workers=2)
    processes = [worker.process for worker in pool._workers]
    pool.close()
    assert all(not process.is_alive() for process in processes)


def test_items_and_deadlines_must_match(pool):
    with pytest.raises(ValueError, match="2 items but 1 deadlines"):
        pool.run([(1,), (2,)], [1.0])


def test_processes_exit_when_their_parent_is_killed():
    # E.g. a Ray actor killed with SIGKILL: its verifier processes must not live on.
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from workers.reward.verifier_pool import VerifierPool
            pool = VerifierPool(abs, num_workers=2)
            print(*[worker.process.pid for worker in pool._workers], flush=True)
            time.sleep(3600)
        """)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[3],
    )
    children = [int(pid) for pid in parent.stdout.readline().split()]
    try:
        assert len(children) == 2 and all(_alive(pid) for pid in children)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in children)
    finally:
        parent.kill()
        parent.wait()
        for pid in filter(_alive, children):  # only if the test failed: leave nothing behind
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # an exited child not yet reaped by init is gone for our purposes
