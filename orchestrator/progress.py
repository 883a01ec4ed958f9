"""A run's progress on the console: one bar per run on a terminal, plain periodic lines elsewhere.

On a terminal (the stream is a TTY), one rich bar per run, redrawn in place::

    GMTS-release top-20 % · seed 0 (t002) ━━━━━━╸     37/100 reward 0.412 eval arithmetic 31.0 % (step 30) 0:03:12

with the step out of the total, the step's mean reward, the latest evaluation's accuracy per benchmark
(evaluation runs every ``evaluation.interval`` steps, so it says at which step) and the time spent.
Log records (the start-up phases, warnings) print above the bars.

Anywhere else — CI, ``ray job submit`` logs, output piped to a file — a bar would be a stream of
carriage returns, so the same fields go out as one plain log line every ``interval`` steps
(``training.log_interval``; always at step 0 and at the last step)::

    cpu-demo-t002 (GMTS-release top-20 % · seed 0) step 37/100 · reward 0.412 · eval arithmetic 31.0 % (step 30) | …

Either way a run prints at most one line per step. ``orchestrator.train`` shows its own run here; in a
sweep the driver shows every trial's (``sweeps.trial_progress``).
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass, field
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

logger = logging.getLogger("orchestrator.progress")

EVAL_ACCURACY = re.compile(r"^eval/(?P<benchmark>[^/]+)/accuracy$")
REWARD_KEY = "reward/mean"
MAX_WIDTH = 140  # columns: wider, the bars would only spread their fields apart


@dataclass
class RunState:
    """What a run's bar or line shows: where it is and the latest reward and evaluation it reported."""

    label: str
    total: int
    step: int = 0
    reward: float | None = None
    eval_accuracy: dict[str, float] = field(default_factory=dict)  # benchmark → accuracy of the latest evaluation
    eval_step: int | None = None

    def update(self, step: int, metrics: dict[str, float]) -> None:
        self.step = step
        if REWARD_KEY in metrics:
            self.reward = metrics[REWARD_KEY]
        evaluated = {m["benchmark"]: value for key, value in metrics.items() if (m := EVAL_ACCURACY.match(key))}
        if evaluated:
            self.eval_accuracy, self.eval_step = evaluated, step

    @property
    def reward_text(self) -> str:
        return "reward —" if self.reward is None else f"reward {self.reward:.3f}"

    @property
    def eval_text(self) -> str:
        if not self.eval_accuracy:
            return "eval —"
        scores = ", ".join(f"{benchmark} {100 * value:.1f} %" for benchmark, value in sorted(self.eval_accuracy.items()))
        return f"eval {scores} (step {self.eval_step})"

    def line(self, details: str = "") -> str:
        text = f"{self.label} step {self.step}/{self.total} · {self.reward_text} · {self.eval_text}"
        return f"{text} | {details}" if details else text


# The rest of a plain line: the step's other headline numbers (the fields above leave them out).
DETAIL_PREFIXES = ("train/accuracy", "reward/", "selection/selected", "time/step")


def details_of(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.startswith(DETAIL_PREFIXES) and k != REWARD_KEY]
    return " ".join(f"{k}={metrics[k]:.3g}" for k in keys)


class ProgressBoard:
    """One bar per run (keyed by any hashable) on a TTY ``stream``; plain log lines otherwise.

    ``live``: force the choice (default: ``stream.isatty()``). Use it as a context manager, or call
    :meth:`close` — it stops the bars and hands the terminal back to plain logging.
    """

    def __init__(self, *, stream: IO[str] | None = None, interval: int = 1, live: bool | None = None,
                 console: Console | None = None) -> None:
        if interval < 1:
            raise ValueError(f"interval must be ≥ 1 step, got {interval}")
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.live = self.stream.isatty() if live is None else live
        self.states: dict = {}
        self._tasks: dict = {}
        self._progress: Progress | None = None
        self._console = console
        self._rerouted: list[tuple[logging.StreamHandler, IO[str]]] = []

    # ----------------------------------------------------------------------------------------- updates
    def update(self, key, label: str, total: int, step: int, metrics: dict[str, float]) -> None:
        """Run ``key`` reached ``step`` of ``total`` with these metrics. A second update at the same step (the
        final evaluation) refreshes the bar but prints no second plain line."""
        state = self.states.get(key)
        new_step = state is None or state.step != step
        if state is None:
            state = self.states[key] = RunState(label, total)
        state.label, state.total = label, total
        state.update(step, metrics)
        if self.live:
            self._draw(key, state)
        elif new_step and (step % self.interval == 0 or step == total):
            logger.info("%s", state.line(details_of(metrics)))

    def finish(self, key, outcome: str = "done") -> None:
        """The run ended (``outcome``: done, failed, …): its bar stays, labelled with the outcome."""
        state = self.states.get(key)
        if state is None or not self.live or key not in self._tasks:
            return
        self._progress.update(self._tasks[key], description=f"{state.label} [{outcome}]")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            for handler, stream in self._rerouted:
                handler.setStream(stream)
            self._rerouted = []

    def __enter__(self) -> ProgressBoard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------------------------- bars
    def _draw(self, key, state: RunState) -> None:
        progress = self._start()
        fields = {"reward": state.reward_text, "eval": state.eval_text}
        if key not in self._tasks:
            self._tasks[key] = progress.add_task(state.label, total=state.total, completed=state.step, **fields)
        else:
            progress.update(self._tasks[key], total=state.total, completed=state.step, **fields)

    def _start(self) -> Progress:
        if self._progress is not None:
            return self._progress
        console = self._console or Console(file=self.stream)
        if self._console is None and console.width > MAX_WIDTH:
            console = Console(file=self.stream, width=MAX_WIDTH)
        # markup=False: a label's or an outcome's brackets are text, not rich markup. On a narrow terminal the
        # label and the eval text give way (ellipsis) before the bar, the step count and the reward do.
        squeezable = lambda ratio: Column(ratio=ratio, overflow="ellipsis", no_wrap=True, min_width=10)
        fixed = Column(no_wrap=True)
        self._progress = Progress(
            TextColumn("{task.description}", markup=False, table_column=squeezable(2)),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5)),
            MofNCompleteColumn(table_column=fixed),
            TextColumn("{task.fields[reward]}", markup=False, table_column=fixed),
            TextColumn("{task.fields[eval]}", markup=False, table_column=squeezable(2)),
            TimeElapsedColumn(), console=console, expand=True, redirect_stdout=True, redirect_stderr=True)
        self._progress.start()
        self._reroute_logging(console)
        return self._progress

    def _reroute_logging(self, console: Console) -> None:
        """Log handlers writing to the bars' stream go through the console while the bars are up, so their
        lines print above the bars instead of through them (rich only redirects ``sys.stdout``/``sys.stderr``,
        and a handler keeps the stream object it was given)."""
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in (self.stream, sys.__stderr__):
                self._rerouted.append((handler, handler.setStream(_ConsoleStream(console))))


class _ConsoleStream:
    """A write-only stream that prints through a rich console (above its live display)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def write(self, text: str) -> int:
        if text.strip():  # logging writes the record, then the terminator: one print per record
            self.console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass
