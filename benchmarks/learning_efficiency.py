"""Learning efficiency on the toy task: test accuracy after the same number of RL steps, per arm, at the lr that
suits each arm, with 95 % intervals over seeds.

cpu-tiny-s (2-digit addition; every run starts from the one deterministic, checksummed warm-up base). An
*arm* is a named selection method or recipe plus config overrides, and a small lr grid. Every arm runs every lr for every seed, a
fixed number of RL steps (not a wall-clock budget, which the machine's load would change); each arm's lr is
the one with the best mean *validation* accuracy over seeds (``arithmetic_val``, disjoint from the test
split), and the figure is its *test* accuracy there (``arithmetic``, 1,173 problems), mean and Student-t 95 %
interval over seeds. Differences between arms are paired by seed (both at their own chosen lr) with their
own t interval, whatever their sign.

Arms: ``none`` (all tokens); ``ets-release`` and ``gmts-release``, the GMTS release's recipes (the GMTS
release's code: ETS over the optimiser step's mini-batch, GMTS within each prompt group); ``random`` (ρ random
tokens per group, the control that separates "fewer tokens" from "the right tokens"); and ETS/GMTS at each
other's population (matched-scope pairs ``ets@group``, ``gmts@mini_batch``). ρ = 0.2, top.

The seed is ``training.seed``: prompt order and rollout sampling, and (derived from it, as in every run) the
mini-batch shuffle, random selection and tie-breaks.
Runs are interleaved seed by seed, arms rotated. The full grid is hours on 2 cores; a reduced one is chosen with
environment variables, and the report says which ran: ``GMTS_LE_SEEDS=0,1,2``, ``GMTS_LE_STEPS=30``,
``GMTS_LE_ARMS=none,ets-release,gmts-release``, ``GMTS_LE_LRS=1e-4`` (one grid for every arm), and
``GMTS_LE_ARM_LRS="random=1e-4 ets@group=1e-4"`` (a grid of its own for the arms named). The same protocol
under other settings: ``GMTS_LE_OVERRIDES="rollout.max_staleness=1 learner.old_logp_source=rollout"`` (config
overrides, space-separated, for every run).

A grid of hours should survive a crash and use both cores: ``GMTS_LE_JOURNAL=<file.jsonl>`` appends every
finished run to that file and reuses the runs already in it (same preset, steps, overrides and training code), and
``GMTS_LE_SHARD=k/n`` runs only every n-th run of the grid, from the k-th. Two processes with shards 0/2 and
1/2 and one journal run the grid side by side; a last invocation without a shard finds every run in the
journal and writes the table. Runs are deterministic whatever the load (docs/usage.md §8), so a run's
numbers do not depend on what ran beside it.

``--smoke`` runs one seed, one lr, two steps of two arms without the warm-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from benchmarks.ray_session import start_local_ray
from benchmarks.report import BenchmarkResult, Figure, cpu_kind
from benchmarks.training_runs import LoopRun, require_loop, rl_step_shape, run_loop
from sweeps.statistics import Estimate, paired_comparisons, t_interval
from workers.learner.recipes import RECIPES

logger = logging.getLogger(__name__)

PRESET = "cpu-tiny-s"
TEST_METRIC = "eval/arithmetic/accuracy"
VALIDATION_METRIC = "eval/arithmetic_val/accuracy"
RATIO = ("selection.ratio=0.2", "selection.mode=top")
# What the first step's rollouts scored: equal within a seed (no update yet), different across seeds.
FIRST_STEP_KEYS = ("train/accuracy", "reward/mean", "train/response_length")


@dataclass(frozen=True)
class Arm:
    name: str
    method: str  # a selection method, or a named recipe (workers/learner/recipes.py)
    overrides: tuple[str, ...] = ()

    def config_overrides(self) -> list[str]:
        if self.method in RECIPES:
            return [f"selection.recipe={self.method}", *self.overrides]
        # The preset's own recipe fixes the method: clear it to run a plain method.
        return ["selection.recipe=null", f"selection.method={self.method}", *self.overrides]


ARMS = (
    Arm("none", "none", ("selection.ratio=null",)),
    # ETS and GMTS as the GMTS release's code runs them: ETS over the optimiser step's
    # mini-batch, GMTS within each prompt group.
    Arm("ets-release", "ets-release", RATIO),
    Arm("gmts-release", "gmts-release", RATIO),
    Arm("random", "random", (*RATIO, "selection.scope=group")),
    Arm("ets@group", "ets", (*RATIO, "selection.scope=group")),  # matched to gmts-release's population
    Arm("gmts@mini_batch", "gmts", (*RATIO, "selection.scope=mini_batch")),  # matched to ets-release's
)
# (a, b): the differences a − b the report gives, when both arms ran.
COMPARISONS = (("gmts-release", "ets-release"), ("gmts-release", "none"), ("ets-release", "none"),
               ("random", "none"), ("gmts-release", "random"), ("gmts-release", "ets@group"),
               ("gmts@mini_batch", "ets-release"))
FULL = {"seeds": [0, 1, 2, 3, 4], "steps": 150, "lrs": [5e-5, 1e-4, 2e-4], "arms": [a.name for a in ARMS]}


def settings_for(smoke: bool) -> dict:
    if smoke:
        return {"seeds": [0], "steps": 2, "lrs": [1e-4], "arms": ["none", "gmts-release"], "reduced": "smoke",
                "overrides": ["warmup.enabled=false", "data.prompts_per_step=8", "learner.mini_batch_size=64",
                              "learner.micro_batch_size=64", "data.eval.arithmetic.limit=8",
                              "data.eval.arithmetic_val.limit=8", "evaluation.compare_to_base=false"]}
    chosen = {
        "seeds": [int(s) for s in os.environ["GMTS_LE_SEEDS"].split(",")] if "GMTS_LE_SEEDS" in os.environ else FULL["seeds"],
        "steps": int(os.environ.get("GMTS_LE_STEPS", FULL["steps"])),
        "lrs": [float(x) for x in os.environ["GMTS_LE_LRS"].split(",")] if "GMTS_LE_LRS" in os.environ else FULL["lrs"],
        "arms": os.environ["GMTS_LE_ARMS"].split(",") if "GMTS_LE_ARMS" in os.environ else FULL["arms"],
        # Whatever every run of this grid changes beside the arms' own settings (a journal keys runs by them).
        "overrides": os.environ.get("GMTS_LE_OVERRIDES", "").split(),
    }
    unknown = set(chosen["arms"]) - {a.name for a in ARMS}
    if unknown:
        raise ValueError(f"GMTS_LE_ARMS: unknown arms {sorted(unknown)}; arms are {[a.name for a in ARMS]}")
    chosen["arm_lrs"] = parse_arm_lrs(os.environ.get("GMTS_LE_ARM_LRS"), chosen["arms"])
    chosen["reduced"] = "no (the full grid)" if all(chosen[k] == FULL[k] for k in FULL) and not chosen["arm_lrs"] \
        else "yes: " + ", ".join([f"{k}={chosen[k]}" for k in FULL if chosen[k] != FULL[k]] +
                                 [f"{arm} lrs={lrs}" for arm, lrs in chosen["arm_lrs"].items()]) + f" (full: {FULL})"
    if chosen["overrides"]:
        chosen["reduced"] += f"; every run with {' '.join(chosen['overrides'])}"
    return chosen


def run(smoke: bool) -> dict:
    require_loop()
    cfg = settings_for(smoke)
    arms = [a for a in ARMS if a.name in cfg["arms"]]
    journal = RunJournal(Path(os.environ["GMTS_LE_JOURNAL"])) if "GMTS_LE_JOURNAL" in os.environ and not smoke \
        else None
    shard = parse_shard(os.environ.get("GMTS_LE_SHARD"))
    grid = list(_grid(cfg, arms))
    finals, per_run = _run_grid(cfg, grid, journal, shard)
    if len(per_run) < len(grid):
        return BenchmarkResult(
            title=f"learning_efficiency shard {shard[0]}/{shard[1]}: {len(per_run)} of {len(grid)} runs",
            settings={"preset": PRESET, "reduced": cfg["reduced"], "journal": str(journal.path) if journal else None},
            figures=[Figure("runs in the journal", len(per_run), "", f"of {len(grid)}; run once more without "
                            "GMTS_LE_SHARD, with the same GMTS_LE_JOURNAL, for the table")],
            measurements={"runs": per_run}).as_dict()
    return _table(cfg, arms, finals, per_run)


def _run_grid(cfg: dict, grid: list, journal: RunJournal | None, shard: tuple[int, int] | None):
    """Runs (or reuses from the journal) this shard's part of the grid. Returns (arm, lr) → seed → final
    metrics, and one entry per run available (its own or the journal's)."""
    import ray

    finals: dict[tuple[str, float], dict[int, dict[str, float]]] = defaultdict(dict)
    per_run: list[dict] = []
    started_ray = False
    try:
        for index, (arm, lr, seed) in enumerate(grid):
            overrides = cfg["overrides"] + arm.config_overrides() + [
                f"learner.lr={lr}", f"training.seed={seed}"]
            key = {"preset": PRESET, "steps": cfg["steps"], "arm": arm.name, "overrides": overrides}
            record = journal.get(key) if journal else None
            if record is None:
                if shard is not None and index % shard[1] != shard[0]:
                    continue
                if not started_ray:
                    start_local_ray()
                    started_ray = True
                result: LoopRun = run_loop(PRESET, overrides, cfg["steps"])
                record = {"final": result.final_metrics,
                          "entry": {"arm": arm.name, "method": arm.name, "lr": lr, "seed": seed, "host": cpu_kind(),
                                    "steps": len(result.history), "wall_seconds": result.wall_seconds,
                                    "base_accuracy": result.initial_metrics.get("base/accuracy"),
                                    "first_step": {k: result.history[0].get(k) for k in FIRST_STEP_KEYS}}}
                if journal:
                    journal.add(key, record)
            finals[(arm.name, lr)][seed] = record["final"]
            per_run.append({**record["entry"], **record["final"]})
    finally:
        if started_ray:
            ray.shutdown()
    return finals, per_run


def _table(cfg: dict, arms: list[Arm], finals: dict, per_run: list[dict]) -> dict:
    """Each arm's test accuracy at the lr chosen on validation, paired differences, base and seed checks."""
    chosen_lr = {arm.name: _best_lr(finals, arm.name, lrs_of(cfg, arm.name)) for arm in arms}
    test = {name: {seed: m[TEST_METRIC] for seed, m in finals[(name, lr)].items()} for name, lr in chosen_lr.items()}
    figures: list[Figure] = []
    for arm in arms:
        estimate = t_interval(list(test[arm.name].values()))
        lr_curve = "; ".join(f"lr {lr:g}: val {_mean(finals, arm.name, lr, VALIDATION_METRIC):.3f}, "
                             f"test {_mean(finals, arm.name, lr, TEST_METRIC):.3f}" for lr in lrs_of(cfg, arm.name))
        drift = {key.rsplit("/", 1)[1]: _mean(finals, arm.name, chosen_lr[arm.name], key)
                 for key in ("eval/arithmetic/changed_vs_base", "eval/arithmetic/kl_to_base")
                 if all(key in m for m in finals[(arm.name, chosen_lr[arm.name])].values())}
        figures.append(Figure(f"{arm.name}: test accuracy at its lr {chosen_lr[arm.name]:g} (chosen on validation)",
                              estimate.mean, "", f"{_interval(estimate)}; per seed {_per_seed(test[arm.name])}; "
                              f"lr curve (means over seeds): {lr_curve}; vs base: {drift}"))
    for pair in paired_comparisons(test, COMPARISONS):
        figures.append(Figure(f"{pair.a} − {pair.b}: test accuracy, paired by seed", pair.difference.mean, "",
                              f"{_interval(pair.difference)}; per seed {_per_seed(pair.per_seed)}"))
    bases = {entry["base_accuracy"] for entry in per_run}
    figures.append(Figure("base policy test accuracy (step-0 evaluation of every run)",
                          next(iter(bases)) if len(bases) == 1 else None, "",
                          f"the same in all {len(per_run)} runs" if len(bases) == 1 else f"differs: {sorted(bases)}"))
    figures += seed_check_figures(per_run)
    return BenchmarkResult(
        title="test accuracy after a fixed number of RL steps, each arm at its validation-chosen lr (cpu-tiny-s)",
        settings={"preset": PRESET, "seeds": cfg["seeds"], "rl_steps": cfg["steps"],
                  "lr_grid": {a.name: lrs_of(cfg, a.name) for a in arms},
                  "arms": {a.name: a.config_overrides() for a in arms}, "reduced": cfg["reduced"],
                  "overrides": cfg["overrides"], "rl_step": rl_step_shape(PRESET, cfg["overrides"]),
                  "metric": f"{TEST_METRIC} (greedy, 1,173 held-out problems); lr chosen on {VALIDATION_METRIC}",
                  "interval": "Student-t 95 % over seeds (sweeps.statistics)"},
        figures=figures, measurements={"runs": per_run, "chosen_lr": chosen_lr},
    ).as_dict()


def _grid(cfg: dict, arms: list[Arm]):
    """(arm, lr, seed) in run order: seed by seed, the arms rotated one place per seed, every lr of each arm."""
    for index, seed in enumerate(cfg["seeds"]):
        shift = index % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            for lr in lrs_of(cfg, arm.name):
                yield arm, lr, seed


def lrs_of(cfg: dict, arm: str) -> list[float]:
    return cfg.get("arm_lrs", {}).get(arm, cfg["lrs"])


def parse_arm_lrs(text: str | None, arms: list[str]) -> dict[str, list[float]]:
    """``"random=1e-4 ets@group=1e-4,2e-4"`` → {arm: lrs}; every arm named must be one that runs."""
    out: dict[str, list[float]] = {}
    for item in (text or "").split():
        arm, _, lrs = item.partition("=")
        if arm not in arms:
            raise ValueError(f"GMTS_LE_ARM_LRS: {arm!r} is not one of the arms that run: {arms}")
        try:
            out[arm] = [float(x) for x in lrs.split(",")]
        except ValueError:
            raise ValueError(f"GMTS_LE_ARM_LRS: {item!r}: expected arm=lr[,lr…]") from None
    return out


def parse_shard(text: str | None, field: str = "GMTS_LE_SHARD") -> tuple[int, int] | None:
    """``"k/n"`` → (k, n) with 0 ≤ k < n (shards count from 0: ``0/2`` and ``1/2``); None when unset. Errors name
    ``field``, where the text came from."""
    if not text:
        return None
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"{field}: expected k/n such as 0/2, got {text!r}") from None
    if not 0 <= k < n:
        raise ValueError(f"{field}: need 0 <= k < n (shards count from 0: two shards are 0/2 and 1/2), got {text!r}")
    return k, n


class RunJournal:
    """Finished runs, one JSON line each, keyed by what decides their numbers: preset, steps, overrides and the
    version of the training code (``_code_version``). A line made by other training code is never reused (it may
    compute differently); floats round-trip exactly through JSON."""

    def __init__(self, path: Path, code_version: str | None = None):
        self.path = path
        self.code_version = code_version if code_version is not None else _code_version()
        self._records: dict[str, dict] = {}
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                # A process killed mid-write leaves a partial line: that run is simply run again.
                logger.warning("GMTS_LE_JOURNAL: %s line %d is not JSON; ignoring it", path, number)
                continue
            self._records[self._id(item["key"], item["code_version"])] = item["record"]

    def _id(self, key: dict, code_version: str) -> str:
        return json.dumps({"key": key, "code_version": code_version}, sort_keys=True)

    def get(self, key: dict) -> dict | None:
        return self._records.get(self._id(key, self.code_version))

    def add(self, key: dict, record: dict) -> None:
        self._records[self._id(key, self.code_version)] = record
        line = json.dumps({"key": key, "code_version": self.code_version, "record": record}, sort_keys=True) + "\n"
        # One write per line, in append mode: two shards appending to one journal never interleave a line.
        with open(self.path, "a+b") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell():
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":  # the partial line of a killed writer: start a new one
                    line = "\n" + line
            handle.write(line.encode())


# What a run's numbers depend on: the training code, the loop the benchmark drives, the pinned dependencies.
# The benchmark's own report code, docs and tests are not in it, so editing them keeps a journal usable.
TRAINING_CODE = ("orchestrator", "workers", "sweeps", "benchmarks/training_runs.py", "pyproject.toml")


def _code_version() -> str:
    """Git's object ids of ``TRAINING_CODE`` at HEAD, plus a hash of their uncommitted changes if any."""
    root = Path(__file__).resolve().parent.parent
    try:
        trees = subprocess.run(["git", "rev-parse", *(f"HEAD:{path}" for path in TRAINING_CODE)], cwd=root,
                               capture_output=True, text=True, check=True).stdout.split()
        diff = subprocess.run(["git", "diff", "HEAD", "--", *TRAINING_CODE], cwd=root, capture_output=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    version = hashlib.sha256(" ".join(trees).encode()).hexdigest()[:16]
    return version + (f"+diff-{hashlib.sha256(diff).hexdigest()[:12]}" if diff else "")


def _best_lr(finals: dict, arm: str, lrs: list[float]) -> float:
    """The lr with the best mean validation accuracy over seeds (ties: the smaller lr). Never the test metric."""
    return max(lrs, key=lambda lr: (_mean(finals, arm, lr, VALIDATION_METRIC), -lr))


def _mean(finals: dict, arm: str, lr: float, key: str) -> float:
    values = [m[key] for m in finals[(arm, lr)].values() if key in m]
    return sum(values) / len(values) if values else float("nan")


def _interval(estimate: Estimate) -> str:
    if estimate.low is None:
        return "1 seed, no interval"
    return f"95 % t interval [{estimate.low:.3f}, {estimate.high:.3f}] (± {estimate.half_width:.3f}), n = {estimate.n}"


def _per_seed(values: dict[int, float]) -> str:
    return ", ".join(f"{seed}: {value:.3f}" for seed, value in sorted(values.items()))


def seed_check_figures(per_run: list[dict]) -> list[Figure]:
    """The first step's rollouts: one signature per seed (all arms and lrs alike), a different one per seed."""
    by_seed: dict[int, set] = defaultdict(set)
    for entry in per_run:
        by_seed[entry["seed"]].add(tuple(entry["first_step"][k] for k in FIRST_STEP_KEYS))
    same_within = all(len(signatures) == 1 for signatures in by_seed.values())
    firsts = [next(iter(signatures)) for signatures in by_seed.values()]
    distinct_across = len(set(firsts)) == len(firsts)
    detail = "; ".join(f"seed {seed}: " + ", ".join(f"{k}={v:.4g}" for k, v in zip(FIRST_STEP_KEYS, sig))
                       for seed, signatures in sorted(by_seed.items()) for sig in sorted(signatures))
    return [Figure("seed check: first-step rollouts identical across arms within each seed", str(same_within), "",
                   detail),
            Figure("seed check: first-step rollouts differ between seeds", str(distinct_across) if len(firsts) > 1
                   else "n/a (one seed)", "", f"{len(firsts)} seeds")]
