"""The progress display: the fields a bar shows, plain periodic lines off a terminal, bars on one."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from orchestrator.progress import ProgressBoard, RunState

STEP_METRICS = {"reward/mean": 0.41234, "train/accuracy": 0.41234, "selection/selected_fraction": 0.2}
EVAL_METRICS = {"eval/arithmetic/accuracy": 0.3125, "eval/gsm8k/accuracy": 0.05, "eval/arithmetic/pass_at_1": 0.3}


def test_state_keeps_the_latest_reward_and_evaluation() -> None:
    state = RunState("GMTS top-20 % · seed 0", total=100)
    assert state.line() == "GMTS top-20 % · seed 0 step 0/100 · reward — · eval —"
    state.update(30, {**STEP_METRICS, **EVAL_METRICS})
    state.update(31, {"reward/mean": 0.5})  # no evaluation at this step: the step-30 one stays
    assert state.reward_text == "reward 0.500"
    assert state.eval_text == "eval arithmetic 31.2 %, gsm8k 5.0 % (step 30)"
    assert state.line("time/step=1.2") == ("GMTS top-20 % · seed 0 step 31/100 · reward 0.500 · "
                                           "eval arithmetic 31.2 %, gsm8k 5.0 % (step 30) | time/step=1.2")


def test_off_a_terminal_one_plain_line_every_interval_and_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()  # not a TTY, like a CI log or a Ray worker's output
    board = ProgressBoard(stream=stream, interval=5)
    assert not board.live
    with caplog.at_level(logging.INFO, logger="orchestrator.progress"), board:
        board.update("t0", "run", 12, 0, EVAL_METRICS)
        for step in range(1, 13):
            board.update("t0", "run", 12, step, {**STEP_METRICS, "time/step": float(step)})
        board.update("t0", "run", 12, 12, {"eval/arithmetic/accuracy": 0.5})  # the final evaluation: no new line
    lines = [r.getMessage() for r in caplog.records if r.name == "orchestrator.progress"]
    assert [line.split(" step ")[1].split(" ")[0] for line in lines] == ["0/12", "5/12", "10/12", "12/12"]
    assert lines[0] == "run step 0/12 · reward — · eval arithmetic 31.2 %, gsm8k 5.0 % (step 0)"
    assert lines[-1] == ("run step 12/12 · reward 0.412 · eval arithmetic 31.2 %, gsm8k 5.0 % (step 0) | "
                         "train/accuracy=0.412 selection/selected_fraction=0.2 time/step=12")
    assert board.states["t0"].eval_text == "eval arithmetic 50.0 % (step 12)"
    assert stream.getvalue() == ""  # no bar, no carriage returns


def test_on_a_terminal_one_bar_per_run_with_its_fields() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    with ProgressBoard(stream=out, live=True, console=console) as board:
        board.update("a", "ETS top-20 % · seed 0", 100, 37, {**STEP_METRICS, **EVAL_METRICS})
        board.update("b", "GMTS top-20 % · seed 0", 100, 5, {"reward/mean": 0.25})
        board.update("a", "ETS top-20 % · seed 0", 100, 38, {"reward/mean": 0.5})
        board.finish("b", "failed")
        tasks = {task.description: task for task in board._progress.tasks}
        assert set(tasks) == {"ETS top-20 % · seed 0", "GMTS top-20 % · seed 0 [failed]"}
        first = tasks["ETS top-20 % · seed 0"]
        assert (first.completed, first.total) == (38, 100)
        assert first.fields == {"reward": "reward 0.500", "eval": "eval arithmetic 31.2 %, gsm8k 5.0 % (step 37)"}
    # Closing draws the bars a last time: the final state is on the terminal.
    last_frame = out.getvalue().rsplit("\x1b[2K", 2)[-2:]
    assert any("38/100" in part and "reward 0.500" in part for part in last_frame)
    assert any("5/100" in part and "GMTS top-20 % · seed 0 [failed]" in part for part in last_frame)


def test_log_lines_print_above_the_bars_and_the_handler_gets_its_stream_back() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        console = Console(file=out, force_terminal=True, width=200, color_system=None)
        with ProgressBoard(stream=out, live=True, console=console) as board:
            board.update("a", "run", 10, 1, STEP_METRICS)
            assert handler.stream is not out  # through the console while the bars are up
            logging.getLogger("orchestrator.train").warning("evaluating at step 2 …")
        assert handler.stream is out
        assert "evaluating at step 2 …" in out.getvalue()
    finally:
        root.removeHandler(handler)


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval must be ≥ 1 step, got 0"):
        ProgressBoard(stream=io.StringIO(), interval=0)
