"""The sweep's progress: the driver draws one bar per trial from the results Tune hands it.

Each trial reports every RL step to Tune (``sweeps.trainable``: the step, its metrics, the evaluations
when they ran). This callback runs in the sweep's driver — the process that owns the user's terminal —
and feeds those results to an ``orchestrator.progress.ProgressBoard``: a bar per trial on a terminal
(step / total, reward, latest eval accuracy), or, when the driver's output is no terminal (CI,
``ray job submit`` logs), one plain line per trial every ``training.log_interval`` steps. The trials
themselves show no progress of their own (``train(show_progress=False)``): their output reaches the
terminal through Ray's log forwarding, which has no terminal to draw a bar on.

Tune pickles its callbacks with the sweep's state (``--resume`` restores them), so the board, which
holds a live display, is built on first use and left out of the pickle.
"""

from __future__ import annotations

from typing import Any

from ray import tune

from orchestrator.progress import ProgressBoard
from sweeps.trainable import STEP_KEY


class TrialProgressBars(tune.Callback):
    def __init__(self, labels: dict[str, str], totals: dict[str, int], trial_key: str, interval: int = 1) -> None:
        """Per trial name: its display label and its number of RL steps; ``trial_key``: the Tune config key
        holding the trial name; ``interval``: steps between two plain lines of a trial (off a terminal)."""
        self.labels, self.totals, self.trial_key, self.interval = labels, totals, trial_key, interval
        self._board: ProgressBoard | None = None

    @property
    def board(self) -> ProgressBoard:
        if self._board is None:
            self._board = ProgressBoard(interval=self.interval)
        return self._board

    def _name(self, trial: Any) -> str | None:
        name = trial.config.get(self.trial_key)
        return name if name in self.labels else None

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info) -> None:
        name = self._name(trial)
        if name is None or STEP_KEY not in result:
            return
        metrics = {key: value for key, value in result.items() if isinstance(value, (int, float))}
        self.board.update(name, self.labels[name], self.totals[name], int(result[STEP_KEY]), metrics)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
        if (name := self._name(trial)) is not None:
            self.board.finish(name, "done")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
        if (name := self._name(trial)) is not None:
            self.board.finish(name, "failed")

    def on_experiment_end(self, trials: list, **info) -> None:
        if self._board is not None:
            self._board.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_board"] = None
        return state
