"""The throwaway child that scores one reasoning-gym answer: what comes back, and what it refuses."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
import reasoning_gym

from workers.reward import reasoning_gym_verifier
from workers.reward.results import CheckError
from workers.reward.scoring_jail import available_layers, score_in_child

MARKER = "/tmp/gmts-scoring-jail-marker"
PATCH = "__import__('sys').modules['workers.reward.reasoning_gym_verifier'].__dict__.update({'_FULL_MARKS': -1.0})"


def _jailed(fn):
    return score_in_child(fn, task="demo", cpu_seconds=5)


def test_a_plain_score_comes_back():
    assert _jailed(lambda: 0.25) == 0.25


def test_eval_of_answer_text_is_refused_before_it_runs_and_patches_nothing():
    with pytest.raises(CheckError, match="'demo'.s scorer tried to execute the answer text"):
        _jailed(lambda: eval(PATCH))  # noqa: S307 - the attack under test
    assert reasoning_gym_verifier._FULL_MARKS > 0.99


def test_a_scorer_that_swallows_the_refusal_still_errors():
    def swallowing():
        try:
            eval(PATCH)  # noqa: S307
        except:  # noqa: E722 - as simple_integration's scorer does
            return 0.0
        return 1.0
    with pytest.raises(CheckError, match="execute the answer text"):
        _jailed(swallowing)


def test_the_task_s_own_eval_scorer_is_refused_in_the_child():
    # spiral_matrix's own score_answer eval()s a non-matching answer: in the child that is a CheckError.
    entry = reasoning_gym.create_dataset("spiral_matrix", size=1, seed=1)[0]
    own = reasoning_gym.get_score_answer_fn("spiral_matrix")
    with pytest.raises(CheckError, match="spiral_matrix.*execute the answer text"):
        score_in_child(lambda: own(answer=PATCH, entry=entry), task="spiral_matrix", cpu_seconds=5)
    assert reasoning_gym_verifier._FULL_MARKS > 0.99


def test_writing_a_file_is_refused_and_leaves_no_file():
    if os.path.exists(MARKER):
        os.remove(MARKER)

    def write():
        with open(MARKER, "w") as handle:
            handle.write("x")
        return 1.0
    with pytest.raises(CheckError, match="for writing"):
        _jailed(write)
    assert not os.path.exists(MARKER)


def test_sockets_and_processes_are_refused():
    with pytest.raises(CheckError, match="socket"):
        _jailed(lambda: socket.create_connection(("127.0.0.1", 22), 1) and 1.0)
    with pytest.raises(CheckError, match="subprocess|os"):
        _jailed(lambda: subprocess.run(["true"]).returncode + 1.0)


@pytest.mark.skipif(not all(available_layers()), reason="Landlock and seccomp are not both available here")
def test_the_child_runs_under_the_sandbox_s_kernel_layers():
    def locked_down() -> float:
        with open("/proc/self/status") as status:  # reading stays allowed
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        return float(fields["Seccomp"].strip() == "2" and fields["NoNewPrivs"].strip() == "1"
                     and int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0)
    assert _jailed(locked_down) == 1.0
    assert locked_down() == 0.0 or os.geteuid() != 0  # the control: this test process is not locked down


def test_a_scorer_exception_is_a_check_error_naming_the_task():
    with pytest.raises(CheckError, match="'demo'.s scorer failed: ZeroDivisionError"):
        _jailed(lambda: 1 / 0)


@pytest.mark.slow
def test_a_child_that_blocks_without_using_cpu_is_killed_at_its_wall_clock():
    import threading
    import time

    from workers.reward.results import CheckTimeout
    lock = threading.Lock()
    lock.acquire()  # held at the fork, never released in the child: it blocks using no CPU time
    started = time.monotonic()
    try:
        with pytest.raises(CheckTimeout, match="killed"):
            score_in_child(lambda: lock.acquire() and 1.0, task="demo", cpu_seconds=1)
    finally:
        lock.release()
    assert time.monotonic() - started < 10
