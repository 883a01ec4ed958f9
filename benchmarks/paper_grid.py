"""The GMTS paper's ablation axes on the worked-addition testbed: which tokens carry the gradient, when most
tokens of an answer are forced and a few are decisions.

The task is ``cpu-tiny-worked`` (3-digit addition written out column by column, 20–30 tokens an answer, about a
quarter of them decisions: orchestrator/data/worked_addition.py); ``cpu-tiny-m-worked`` is the same task on the
larger tiny model. Arms (ρ and mode are the cell's): ``none`` (all tokens), ``ets-release`` and ``gmts-release``
(the GMTS release's code: ETS over the optimiser step's mini-batch, H·|ω| within each prompt group),
``gmts-paper`` (the paper's Eq. 2) and ``random`` (ρ random tokens per group: "fewer tokens" without "the right
tokens").

The protocol is fixed before any run, and the report states it:

1. **lr, chosen on validation per model size**, at the headline cell (GRPO, top-20 %): each arm runs every lr of
   its size's grid at seeds 0–2; its lr is the one with the best mean *validation* accuracy
   (``arithmetic_val``, disjoint from test; ties: the smaller lr). Test accuracy never chooses anything.
2. **The headline at 5 seeds**: seeds 3 and 4 at each arm's chosen lr (seeds 0–2 are step 1's runs at that lr).
3. **The other cells at 3 seeds**, each arm at the lr step 1 chose for it at that size: ratio 0.1 / 0.5 / 0.8 top,
   bottom at 0.2 and 0.8, DAPO at top-20 %. These are cut to cpu-tiny-s (the CPU budget: cells are cut,
   not seeds); their lrs were chosen at the headline cell, not in the cell, and the report says so.

Every run is a fixed number of RL steps (not a wall-clock budget, which the load would change) from its size's
one checksummed warm-up base. Each run's record keeps its test and validation accuracy, the base's, what the first
step's rollouts scored (the seed check: one signature per seed, whatever the arm), where the selected tokens went
(``selection/decision_share`` against ``selection/decision_base_share``, the mean over the run's steps), and the
base's and the trained policy's answers to the first held-out problems with their rewards.

Hours on 2 cores, so it runs from a journal: ``--journal FILE`` appends every finished run and reuses the runs in it
(same preset, steps, overrides and training code: ``learning_efficiency.RunJournal``); ``--shard k/n`` runs only the
runs whose key hashes to k mod n, so two processes share a journal; an invocation finds what is still missing,
runs it (step 3 only once step 1 is complete for that size) and prints the tables from the journal. ``--plan``
prints what is missing; ``--tables-only`` runs nothing; ``--code-version V`` lets those two read the runs of another
checkout's training code (a grid runs for days from a worktree frozen at one commit while main moves on);
``--size S`` plans and runs only that model size (its runs depend on no other size's, so a size can run in a journal
of its own); ``--seed N`` only that seed's runs; ``--smoke`` makes one real 2-step run without the warm-up.

CPU kinds. The same run gives other bits on another CPU kind (floating-point kernels chosen by instruction set), so
**every run of one size and seed runs on one kind**: the seed's base is trained there, and the arms it compares share
that base and their first step's rollouts. Different seeds may run on different kinds: every difference is paired by
seed and every lr choice averages the same seeds for every arm, so a seed's kind is, like the seed itself, a
per-seed draw both arms of a pair share. ``--seed`` lets one sitting on one kind finish one seed; the seed check
reports a seed whose runs came from two kinds, and the tables say which kind made each seed.

    python -m benchmarks.paper_grid --journal benchmarks/journals/paper_grid.jsonl --plan
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from benchmarks.learning_efficiency import Arm, RunJournal, parse_shard
from benchmarks.report import cpu_kind
from sweeps.statistics import paired_comparisons, t_interval

logger = logging.getLogger(__name__)

SIZES = {"tiny-s": "cpu-tiny-worked", "tiny-m": "cpu-tiny-m-worked"}
TEST_METRIC = "eval/arithmetic/accuracy"
VALIDATION_METRIC = "eval/arithmetic_val/accuracy"
FIRST_STEP_KEYS = ("train/accuracy", "reward/mean", "train/response_length")
ROLE_KEYS = ("selection/decision_share", "selection/decision_base_share")
SHOWN_ANSWERS = 6
SMOKE_OVERRIDES = ("warmup.enabled=false", "data.prompts_per_step=8", "learner.mini_batch_size=64",
                   "learner.micro_batch_size=64", "data.eval.arithmetic.limit=8", "data.eval.arithmetic_val.limit=8",
                   "evaluation.compare_to_base=false")
RL_STEPS = 40
LR_SEEDS = (0, 1, 2)
HEADLINE_SEEDS = (0, 1, 2, 3, 4)
CELL_SEEDS = (0, 1, 2)
# Each size's lr grid brackets the lr its preset learns at (a factor of 2 apart).
LR_GRID = {"tiny-s": (2.5e-5, 5e-5, 1e-4), "tiny-m": (1e-5, 2e-5, 4e-5)}

ARMS = {
    "none": Arm("none", "none", ("selection.ratio=null",)),
    "ets-release": Arm("ets-release", "ets-release"),
    "gmts-release": Arm("gmts-release", "gmts-release"),
    "gmts-paper": Arm("gmts-paper", "gmts-paper"),
    "random": Arm("random", "random", ("selection.scope=group",)),
}
HEADLINE_ARMS = ("none", "ets-release", "gmts-release", "gmts-paper", "random")
# (a, b): the paired differences a − b every cell reports when both ran there.
COMPARISONS = (("gmts-release", "ets-release"), ("gmts-paper", "ets-release"), ("gmts-release", "none"),
               ("ets-release", "none"), ("gmts-release", "random"), ("random", "none"),
               ("gmts-paper", "gmts-release"))


@dataclass(frozen=True)
class Cell:
    size: str
    algorithm: str
    ratio: float
    mode: str
    arms: tuple[str, ...]
    seeds: tuple[int, ...]

    @property
    def headline(self) -> bool:
        return (self.algorithm, self.ratio, self.mode) == ("grpo", 0.2, "top")

    @property
    def label(self) -> str:
        return f"{self.size} · {self.algorithm.upper()} · {self.mode} ρ = {self.ratio:g}"


CELLS = (
    Cell("tiny-s", "grpo", 0.2, "top", HEADLINE_ARMS, HEADLINE_SEEDS),
    Cell("tiny-m", "grpo", 0.2, "top", HEADLINE_ARMS, HEADLINE_SEEDS),
    *(Cell("tiny-s", "grpo", ratio, "top", ("ets-release", "gmts-release", "random"), CELL_SEEDS)
      for ratio in (0.1, 0.5, 0.8)),
    *(Cell("tiny-s", "grpo", ratio, "bottom", ("ets-release", "gmts-release"), CELL_SEEDS) for ratio in (0.2, 0.8)),
    Cell("tiny-s", "dapo", 0.2, "top", ("none", "ets-release", "gmts-release"), CELL_SEEDS),
)


@dataclass(frozen=True)
class PlannedRun:
    size: str
    arm: str
    algorithm: str
    ratio: float | None  # None: all tokens
    mode: str | None
    lr: float
    seed: int
    steps: int
    extra: tuple[str, ...] = ()  # --smoke's cuts (never in a journal)

    @property
    def preset(self) -> str:
        return SIZES[self.size]

    def overrides(self) -> list[str]:
        selection = [] if self.arm == "none" else [f"selection.ratio={self.ratio}", f"selection.mode={self.mode}"]
        return [*ARMS[self.arm].config_overrides(), *selection, f"algorithm.name={self.algorithm}",
                f"learner.lr={self.lr}", f"training.seed={self.seed}", *self.extra]

    def key(self) -> dict:
        return {"benchmark": "paper_grid", "preset": self.preset, "steps": self.steps, "arm": self.arm,
                "overrides": self.overrides()}

    def shard_of(self, n: int) -> int:
        return int(hashlib.sha256(json.dumps(self.key(), sort_keys=True).encode()).hexdigest(), 16) % n


def _run_of(cell: Cell, arm: str, lr: float, seed: int, steps: int) -> PlannedRun:
    if arm == "none":
        return PlannedRun(cell.size, arm, cell.algorithm, None, None, lr, seed, steps)
    return PlannedRun(cell.size, arm, cell.algorithm, cell.ratio, cell.mode, lr, seed, steps)


def lr_runs(size: str, steps: int = RL_STEPS) -> list[PlannedRun]:
    """Step 1: the headline cell's arms × the size's lr grid × LR_SEEDS."""
    cell = next(c for c in CELLS if c.size == size and c.headline)
    return [_run_of(cell, arm, lr, seed, steps) for seed in LR_SEEDS for arm in cell.arms for lr in LR_GRID[size]]


def choose_lrs(size: str, records: dict[PlannedRun, dict], steps: int = RL_STEPS) -> dict[str, float] | None:
    """Each headline arm's lr with the best mean validation accuracy over LR_SEEDS (ties: the smaller lr);
    None until every lr run of the size is in ``records``."""
    runs = lr_runs(size, steps)
    if any(run not in records for run in runs):
        return None
    cell = next(c for c in CELLS if c.size == size and c.headline)
    chosen = {}
    for arm in cell.arms:
        def validation(lr: float, arm: str = arm) -> float:
            values = [records[r]["final"][VALIDATION_METRIC] for r in runs if r.arm == arm and r.lr == lr]
            return sum(values) / len(values)
        chosen[arm] = max(LR_GRID[size], key=lambda lr: (validation(lr), -lr))
    return chosen


def cell_runs(cell: Cell, chosen: dict[str, float], steps: int = RL_STEPS) -> list[PlannedRun]:
    """Steps 2 and 3: every arm of ``cell`` at its chosen lr, every seed of the cell."""
    return [_run_of(cell, arm, chosen[arm], seed, steps) for seed in cell.seeds for arm in cell.arms]


def plan(records: dict[PlannedRun, dict], steps: int = RL_STEPS, sizes: tuple[str, ...] = tuple(SIZES),
         seeds: tuple[int, ...] | None = None) -> list[PlannedRun]:
    """Every run of ``sizes`` (and ``seeds``; None: all) still missing that can run now: step 1's, and each cell's
    once its size's lrs are chosen."""
    missing: list[PlannedRun] = []
    for size in sizes:
        missing += [run for run in lr_runs(size, steps) if run not in records and run not in missing]
        chosen = choose_lrs(size, records, steps)
        if chosen is None:
            continue
        for cell in CELLS:
            if cell.size == size:
                missing += [run for run in cell_runs(cell, chosen, steps) if run not in records and run not in missing]
    return [run for run in missing if seeds is None or run.seed in seeds]


def total_runs() -> int:
    """Runs in the whole protocol (step 3's lrs unknown until step 1 ran; their number is not)."""
    count = sum(len(lr_runs(size)) for size in SIZES)
    for cell in CELLS:
        extra_seeds = [s for s in cell.seeds if not (cell.headline and s in LR_SEEDS)]
        count += len(cell.arms) * len(extra_seeds)
    return count


# -- running -----------------------------------------------------------------------------------------------


def execute(run: PlannedRun) -> dict:
    """One training run (real Ray, vLLM, DeepSpeed learner) and its journal record."""
    from benchmarks.training_runs import run_loop

    result = run_loop(run.preset, run.overrides(), run.steps)
    history = result.history
    roles = {key: sum(step[key] for step in history if key in step) / max(1, sum(key in step for step in history))
             for key in ROLE_KEYS if any(key in step for step in history)}
    return {"final": result.final_metrics,
            "entry": {"size": run.size, "arm": run.arm, "algorithm": run.algorithm, "ratio": run.ratio,
                      "mode": run.mode, "lr": run.lr, "seed": run.seed, "steps": len(history), "host": cpu_kind(),
                      "wall_seconds": result.wall_seconds, "median_step_seconds": result.median("time/step"),
                      "base_accuracy": result.initial_metrics.get(TEST_METRIC),
                      "first_step": {key: history[0].get(key) for key in FIRST_STEP_KEYS} if history else {},
                      "roles": roles, "answers": _answers(result)}}


def _answers(result) -> list[dict]:
    """The first held-out test problems: the base's and the trained policy's completion and reward."""
    rows = []
    for index in range(SHOWN_ANSWERS):
        row = {}
        for when, evaluation in (("base", result.base_evaluation), ("trained", result.final_evaluation)):
            answers = evaluation.answers.get("arithmetic", []) if evaluation is not None else []
            if index >= len(answers):
                continue
            row[when] = answers[index]
            row[f"{when}_reward"] = evaluation.rewards["arithmetic"][index]
        rows.append(row)
    return rows


def load_records(journal: RunJournal, steps: int) -> dict[PlannedRun, dict]:
    """Every run of the protocol (at any lr of the grid) that the journal holds for this training code."""
    records: dict[PlannedRun, dict] = {}
    candidates = [run for size in SIZES for run in lr_runs(size, steps)]
    for cell in CELLS:
        for lr_choice in _every_lr_choice(cell.size):
            candidates += cell_runs(cell, lr_choice, steps)
    for run in candidates:
        record = journal.get(run.key())
        if record is not None:
            records[run] = record
    return records


def _every_lr_choice(size: str):
    for lr in LR_GRID[size]:
        yield dict.fromkeys(ARMS, lr)


def run_missing(journal: RunJournal, steps: int, shard: tuple[int, int] | None, limit: int | None,
                sizes: tuple[str, ...] = tuple(SIZES), seeds: tuple[int, ...] | None = None) -> int:
    from benchmarks.ray_session import start_local_ray

    import ray

    done = 0
    started = False
    try:
        while limit is None or done < limit:
            records = load_records(journal, steps)
            todo = [run for run in plan(records, steps, sizes, seeds)
                    if shard is None or run.shard_of(shard[1]) == shard[0]]
            if not todo:
                break
            if not started:
                start_local_ray()
                started = True
            run = todo[0]
            logger.info("paper_grid: %s %s lr %g seed %d (%d to go in this shard)", run.size, run.arm, run.lr,
                        run.seed, len(todo))
            journal.add(run.key(), execute(run))
            journal = RunJournal(journal.path)  # another shard may have added runs
            done += 1
    finally:
        if started:
            ray.shutdown()
    return done


# -- tables ------------------------------------------------------------------------------------------------


def tables(records: dict[PlannedRun, dict], steps: int = RL_STEPS) -> str:
    """The report, in Markdown, from the records alone (the journal rebuilds it in seconds)."""
    lines = [f"# paper_grid — {len(records)} of {total_runs()} runs in the journal, {steps} RL steps each", "",
             "CPU kinds of the runs: " + host_kinds(records), ""]
    for size in SIZES:
        chosen = choose_lrs(size, records, steps)
        lines += [f"## {size} ({SIZES[size]})", ""]
        by_seed = kinds_by_seed(records, size)
        if by_seed:
            lines += ["CPU kind of each seed's runs: " + "; ".join(
                f"seed {seed} {', '.join(sorted(kinds))}" for seed, kinds in sorted(by_seed.items())), ""]
        lines += _lr_table(size, records, steps, chosen)
        if chosen is None:
            lines += ["", "lrs not chosen yet: the cells wait for every lr run of this size.", ""]
            continue
        for cell in (c for c in CELLS if c.size == size):
            lines += _cell_table(cell, chosen, records, steps)
    return "\n".join(lines)


def _lr_table(size: str, records: dict, steps: int, chosen: dict | None) -> list[str]:
    lines = ["lr choice at GRPO top-20 %: mean validation / test accuracy (%) over seeds "
             f"{', '.join(map(str, LR_SEEDS))} (**bold**: chosen on validation)", "",
             "| arm | " + " | ".join(f"{lr:g}" for lr in LR_GRID[size]) + " |",
             "|---|" + "---|" * len(LR_GRID[size])]
    for arm in HEADLINE_ARMS:
        cells = []
        for lr in LR_GRID[size]:
            runs = [r for r in lr_runs(size, steps) if r.arm == arm and r.lr == lr and r in records]
            if not runs:
                cells.append("—")
                continue
            val = sum(records[r]["final"][VALIDATION_METRIC] for r in runs) / len(runs)
            test = sum(records[r]["final"][TEST_METRIC] for r in runs) / len(runs)
            text = f"{100 * val:.1f} / {100 * test:.1f}" + ("" if len(runs) == len(LR_SEEDS) else f" (n = {len(runs)})")
            cells.append(f"**{text}**" if chosen and chosen.get(arm) == lr else text)
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines + [""]


def _cell_table(cell: Cell, chosen: dict[str, float], records: dict, steps: int) -> list[str]:
    test: dict[str, dict[int, float]] = defaultdict(dict)
    roles: dict[str, list[dict]] = defaultdict(list)
    for run in cell_runs(cell, chosen, steps):
        if run in records:
            test[run.arm][run.seed] = records[run]["final"][TEST_METRIC]
            roles[run.arm].append(records[run]["entry"].get("roles", {}))
    lines = [f"### {cell.label}" + (" — the headline" if cell.headline else
                                     " (lrs chosen at GRPO top-20 %, not in this cell)"), "",
             "| arm | lr | test accuracy, mean [95 % t interval] | n | per seed "
             "| decisions among selected (base rate) |",
             "|---|---|---|---|---|---|"]
    for arm in cell.arms:
        values = test.get(arm, {})
        estimate = t_interval(list(values.values())) if values else None
        interval = "—" if estimate is None else (f"{100 * estimate.mean:.1f}" + (
            f" [{100 * estimate.low:.1f}, {100 * estimate.high:.1f}]" if estimate.low is not None else ""))
        per_seed = " / ".join(f"{100 * values[s]:.1f}" if s in values else "·" for s in cell.seeds)
        shares = [r for r in roles.get(arm, []) if ROLE_KEYS[0] in r]
        where = "—" if not shares else (f"{100 * sum(r[ROLE_KEYS[0]] for r in shares) / len(shares):.1f} % "
                                        f"({100 * sum(r[ROLE_KEYS[1]] for r in shares) / len(shares):.1f} %)")
        edge = " (grid edge)" if chosen[arm] in (min(LR_GRID[cell.size]), max(LR_GRID[cell.size])) else ""
        lines.append(f"| {arm} | {chosen[arm]:g}{edge} | {interval} | {len(values)}/{len(cell.seeds)} | {per_seed} "
                     f"| {where} |")
    lines += ["", "| difference, paired by seed | mean [95 % t interval] | n | per seed |", "|---|---|---|---|"]
    for pair in paired_comparisons(test, COMPARISONS):
        difference = pair.difference
        interval = f"{100 * difference.mean:+.1f}" + (
            f" [{100 * difference.low:+.1f}, {100 * difference.high:+.1f}]" if difference.low is not None else "")
        lines.append(f"| {pair.a} − {pair.b} | {interval} | {difference.n} | "
                     + " / ".join(f"{100 * value:+.1f}" for value in pair.per_seed.values()) + " |")
    return lines + [""]


def host_kinds(records: dict[PlannedRun, dict]) -> str:
    """Which CPU kinds made the runs, with counts (runs journalled before the kind was recorded: "not recorded").
    One kind per size and seed is what a table needs (the module docstring says why)."""
    counts = Counter(_host(record) for record in records.values())
    return ", ".join(f"{kind} ({n})" for kind, n in sorted(counts.items())) or "none yet"


def kinds_by_seed(records: dict[PlannedRun, dict], size: str) -> dict[int, set[str]]:
    """The CPU kinds that made each seed's runs of ``size`` (one each, when the grid ran as it should)."""
    kinds: dict[int, set[str]] = defaultdict(set)
    for run, record in records.items():
        if run.size == size:
            kinds[run.seed].add(_host(record))
    return dict(kinds)


def _host(record: dict) -> str:
    return record["entry"].get("host", "not recorded")


def seed_check(records: dict[PlannedRun, dict]) -> list[str]:
    """Within a size, algorithm and seed every arm's first-step rollouts score the same (no update yet), and
    within a size and seed every run came from one CPU kind (the arms a seed pairs share its base's bits)."""
    signatures: dict[tuple, set] = defaultdict(set)
    for run, record in records.items():
        first = record["entry"]["first_step"]
        signatures[(run.size, run.algorithm, run.seed)].add(tuple(first.get(k) for k in FIRST_STEP_KEYS))
    problems = [f"{size} {algorithm} seed {seed}: {len(found)} first-step signatures"
                for (size, algorithm, seed), found in sorted(signatures.items()) if len(found) != 1]
    for size in SIZES:
        problems += [f"{size} seed {seed}: runs from {len(kinds)} CPU kinds ({', '.join(sorted(kinds))})"
                     for seed, kinds in sorted(kinds_by_seed(records, size).items()) if len(kinds) > 1]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paper_grid", description=__doc__.splitlines()[0])
    parser.add_argument("--journal", type=Path, help="JSON-lines journal: reused and appended to (required but "
                        "with --smoke)")
    parser.add_argument("--steps", type=int, default=RL_STEPS, help=f"RL steps per run (default {RL_STEPS})")
    parser.add_argument("--shard", help="k/n with 0 <= k < n: run only the runs whose key hashes to k mod n")
    parser.add_argument("--limit", type=int, help="stop after this many new runs")
    parser.add_argument("--size", action="append", choices=tuple(SIZES), help="plan and run only this model size "
                        "(repeatable; default: every size): a size's runs are a grid of their own (its lr step, its "
                        "cells, its base), so one size can run in a journal of its own, e.g. on another CPU kind")
    parser.add_argument("--seed", type=int, action="append", help="plan and run only this seed's runs (repeatable; "
                        "default: every seed): all of a seed's runs of a size belong on one CPU kind, so one sitting "
                        "on one kind can finish a seed")
    parser.add_argument("--plan", action="store_true", help="print what is missing, run nothing")
    parser.add_argument("--tables-only", action="store_true", help="print the tables from the journal, run nothing")
    parser.add_argument("--code-version", help="with --plan or --tables-only: read the runs another checkout's training "
                        "code made (its version is printed by --plan there); runs are only ever made, and journalled, "
                        "with this checkout's")
    parser.add_argument("--smoke", action="store_true", help="one real run of the grid's first kind, cut to 2 steps "
                        "without the warm-up, its record printed (no journal written)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.smoke:
        return _smoke()
    if args.journal is None:
        parser.error("--journal is required (the runs are hours: they go to a journal)")
    if args.code_version and not (args.plan or args.tables_only):
        parser.error("--code-version reads a journal (--plan, --tables-only); a run is journalled under the code "
                     "that made it")
    try:
        shard = parse_shard(args.shard, "--shard")
    except ValueError as error:
        parser.error(str(error))
    journal = RunJournal(args.journal, args.code_version)
    sizes = tuple(args.size or SIZES)
    every_seed = sorted({seed for cell in CELLS for seed in cell.seeds})
    if args.seed and not set(args.seed) <= set(every_seed):
        parser.error(f"--seed: the grid's seeds are {', '.join(map(str, every_seed))}; got {args.seed}")
    seeds = tuple(args.seed) if args.seed else None
    if args.plan:
        records = load_records(journal, args.steps)
        todo = plan(records, args.steps, sizes, seeds)
        print(f"{len(records)} of {total_runs()} runs in {args.journal} (code version {journal.code_version}); "
              f"{len(todo)} can run now:")
        for run in todo:
            print(f"  {run.size} {run.algorithm} {run.arm} ρ={run.ratio} {run.mode} lr={run.lr:g} seed={run.seed}")
        return 0
    if not args.tables_only:
        run_missing(journal, args.steps, shard, args.limit, sizes, seeds)
        journal = RunJournal(args.journal)
    records = load_records(journal, args.steps)
    print(f"training code version {journal.code_version}")
    print(tables(records, args.steps))
    problems = seed_check(records)
    print("\nseed check: " + ("passed" if not problems else "; ".join(problems)))
    return 0


def _smoke() -> int:
    import dataclasses

    import ray

    from benchmarks.ray_session import start_local_ray

    run = next(r for r in lr_runs("tiny-s", 2) if r.arm == "gmts-release")
    run = dataclasses.replace(run, extra=SMOKE_OVERRIDES)
    start_local_ray()
    try:
        record = execute(run)
    finally:
        ray.shutdown()
    print(json.dumps(record, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
