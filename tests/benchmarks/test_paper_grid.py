"""benchmarks/paper_grid's protocol: which runs it plans, how it chooses lrs (validation only), what its tables
say, and that every run it would start is a valid experiment config. Records here are synthetic numbers
(the runs themselves are hours); the journal is the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import paper_grid as grid
from benchmarks.learning_efficiency import RunJournal
from orchestrator.config_loader import load_experiment


def _record(run: grid.PlannedRun, validation: float, test: float, first: float = 0.3) -> dict:
    return {"final": {grid.VALIDATION_METRIC: validation, grid.TEST_METRIC: test},
            "entry": {"first_step": {"train/accuracy": first + run.seed / 100, "reward/mean": first,
                                     "train/response_length": 26.0},
                      "roles": {"selection/decision_share": 0.4, "selection/decision_base_share": 0.27}}}


def _lr_records(size: str, best: dict[str, float]) -> dict:
    """Step 1 done for ``size``: each arm's validation peaks at best[arm]; test is validation − 1 point."""
    records = {}
    for run in grid.lr_runs(size):
        validation = 0.5 - abs(run.lr - best[run.arm]) * 100 + run.seed / 1000
        records[run] = _record(run, validation, validation - 0.01)
    return records


def test_with_an_empty_journal_only_the_lr_choice_can_run() -> None:
    todo = grid.plan({})
    per_size = len(grid.HEADLINE_ARMS) * len(grid.LR_SEEDS) * 3
    assert len(todo) == 2 * per_size == sum(len(grid.lr_runs(size)) for size in grid.SIZES)
    assert {(r.algorithm, r.ratio, r.mode) for r in todo if r.arm != "none"} == {("grpo", 0.2, "top")}
    assert grid.choose_lrs("tiny-s", {}) is None


def test_lrs_are_chosen_on_validation_and_then_the_cells_are_planned() -> None:
    best = {"none": 2.5e-5, "ets-release": 2.5e-5, "gmts-release": 5e-5, "gmts-paper": 1e-4, "random": 2.5e-5}
    records = _lr_records("tiny-s", best)
    # Test prefers other lrs than validation for ETS: the choice must not look at it.
    for run in records:
        if run.arm == "ets-release":
            records[run]["final"][grid.TEST_METRIC] = run.lr * 1000
    assert grid.choose_lrs("tiny-s", records) == best
    todo = grid.plan(records)
    cells = [r for r in todo if r.size == "tiny-s"]
    # The headline's seeds 0-2 are step 1's runs at the chosen lr: only seeds 3 and 4 are new there.
    headline = [r for r in cells if (r.algorithm, r.ratio, r.mode) == ("grpo", 0.2, "top") or r.arm == "none"
                and r.algorithm == "grpo"]
    assert {r.seed for r in headline} == {3, 4} and all(r.lr == best[r.arm] for r in cells)
    assert any(r.mode == "bottom" for r in cells) and any(r.algorithm == "dapo" for r in cells)
    assert not [r for r in todo if r.size == "tiny-m" and r.seed > 2]  # tiny-m's lrs are not chosen yet
    assert len(records) + len([r for r in todo if r.size == "tiny-s"]) == \
        sum(len(c.arms) * len(c.seeds) for c in grid.CELLS if c.size == "tiny-s") + \
        len(grid.lr_runs("tiny-s")) - len(grid.HEADLINE_ARMS) * len(grid.LR_SEEDS)


def test_a_tie_on_validation_goes_to_the_smaller_lr_and_is_marked_as_the_grid_edge() -> None:
    records = {run: _record(run, 0.4, run.lr) for run in grid.lr_runs("tiny-m")}
    assert set(grid.choose_lrs("tiny-m", records).values()) == {min(grid.LR_GRID["tiny-m"])}
    headline = grid.tables(records).split("## tiny-m (")[1].split("— the headline")[1]
    assert f"| none | {min(grid.LR_GRID['tiny-m']):g} (grid edge) |" in headline


def test_tables_give_intervals_paired_differences_and_where_the_tokens_go() -> None:
    best = dict.fromkeys(grid.HEADLINE_ARMS, 5e-5)
    records = _lr_records("tiny-s", best)
    for run in [r for cell in grid.CELLS if cell.size == "tiny-s" for r in grid.cell_runs(cell, best)]:
        if run.size == "tiny-s":
            bonus = {"gmts-release": 0.02, "ets-release": 0.0}.get(run.arm, 0.01)
            records[run] = _record(run, 0.5, 0.5 + bonus + run.seed / 1000)
    text = grid.tables(records)
    assert "### tiny-s · GRPO · top ρ = 0.2 — the headline" in text
    headline = text.split("— the headline")[1].split("###")[0]
    assert "| gmts-release − ets-release | +2.0 [+2.0, +2.0] | 5 |" in headline
    # 5e-5 is inside tiny-s's grid: no edge mark; the run-mean share of decisions beside its base rate
    assert "| gmts-release | 5e-05 | 52.2 [" in headline and "| 40.0 % (27.0 %) |" in headline
    assert "(lrs chosen at GRPO top-20 %, not in this cell)" in text
    assert "lrs not chosen yet" in text.split("## tiny-m (")[1]
    assert grid.seed_check(records) == []
    assert f"CPU kinds of the runs: not recorded ({len(records)})" in text
    some = next(iter(records))
    records[some]["entry"]["host"] = "AMD EPYC (with AVX-512)"
    assert f"CPU kinds of the runs: AMD EPYC (with AVX-512) (1), not recorded ({len(records) - 1})" in \
        grid.tables(records)
    del records[some]["entry"]["host"]
    records[some]["entry"]["first_step"]["reward/mean"] = 0.99
    assert grid.seed_check(records) == [f"{some.size} {some.algorithm} seed {some.seed}: 2 first-step signatures"]


def test_the_journal_gives_back_what_was_added_under_the_same_code(tmp_path: Path) -> None:
    path = tmp_path / "grid.jsonl"
    run = grid.lr_runs("tiny-s")[0]
    RunJournal(path, code_version="v1").add(run.key(), _record(run, 0.5, 0.49))
    assert grid.load_records(RunJournal(path, code_version="v1"), grid.RL_STEPS)[run]["final"][grid.TEST_METRIC] == 0.49
    assert grid.load_records(RunJournal(path, code_version="v2"), grid.RL_STEPS) == {}
    assert {r.shard_of(2) for r in grid.lr_runs("tiny-s")} == {0, 1}


def test_another_checkouts_runs_are_read_only_when_named(tmp_path: Path, capsys) -> None:
    path = tmp_path / "grid.jsonl"
    run = grid.lr_runs("tiny-s")[0]
    RunJournal(path, code_version="frozen").add(run.key(), _record(run, 0.5, 0.49))
    grid.main(["--journal", str(path), "--plan", "--code-version", "frozen"])
    assert capsys.readouterr().out.startswith(f"1 of {grid.total_runs()} runs")
    grid.main(["--journal", str(path), "--plan"])  # this checkout's code did not make that run
    assert capsys.readouterr().out.startswith(f"0 of {grid.total_runs()} runs")
    grid.main(["--journal", str(path), "--tables-only", "--code-version", "frozen"])
    assert "training code version frozen" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a run is journalled under the code that made it, never a named one
        grid.main(["--journal", str(path), "--code-version", "frozen"])
    assert "--code-version reads a journal" in capsys.readouterr().err


def test_one_size_plans_and_runs_alone(tmp_path: Path, capsys) -> None:
    # tiny-s's lrs chosen: without --size its cells would be next; with --size tiny-m only tiny-m's lr step is.
    records = _lr_records("tiny-s", dict.fromkeys(grid.ARMS, 2.5e-5))
    todo = grid.plan(records, sizes=("tiny-m",))
    assert todo == grid.lr_runs("tiny-m")
    assert {r.size for r in grid.plan(records)} == {"tiny-s", "tiny-m"}
    grid.main(["--journal", str(tmp_path / "grid.jsonl"), "--plan", "--size", "tiny-m"])
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert len(listed) == len(grid.lr_runs("tiny-m")) and all(line.startswith("  tiny-m ") for line in listed)
    with pytest.raises(SystemExit):
        grid.main(["--journal", str(tmp_path / "grid.jsonl"), "--plan", "--size", "tiny-xl"])
    assert "--size" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # shards count from 0: the second of two is 1/2
        grid.main(["--journal", str(tmp_path / "grid.jsonl"), "--plan", "--size", "tiny-m", "--shard", "2/2"])
    assert "--shard: need 0 <= k < n" in capsys.readouterr().err


def test_one_seed_plans_and_runs_alone_and_a_seed_stays_on_one_cpu_kind(tmp_path: Path, capsys) -> None:
    records = _lr_records("tiny-m", dict.fromkeys(grid.ARMS, 2e-5))
    todo = grid.plan(records, sizes=("tiny-m",), seeds=(3,))
    assert todo and {r.seed for r in todo} == {3} and {r.size for r in todo} == {"tiny-m"}
    assert {r.seed for r in grid.plan(records, sizes=("tiny-m",))} == {3, 4}
    grid.main(["--journal", str(tmp_path / "grid.jsonl"), "--plan", "--size", "tiny-m", "--seed", "1"])
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert len(listed) == len(grid.lr_runs("tiny-m")) // len(grid.LR_SEEDS)
    assert all(line.endswith("seed=1") for line in listed)
    with pytest.raises(SystemExit):
        grid.main(["--journal", str(tmp_path / "grid.jsonl"), "--plan", "--seed", "7"])
    assert "--seed" in capsys.readouterr().err
    # Seeds on two kinds are fine; one seed's arms on two kinds are not (they no longer share a base's bits).
    for run, record in records.items():
        record["entry"]["host"] = "Intel Xeon (with AVX-512)" if run.seed == 0 else "AMD EPYC (without AVX-512)"
    assert grid.seed_check(records) == []
    assert ("CPU kind of each seed's runs: seed 0 Intel Xeon (with AVX-512); seed 1 AMD EPYC (without AVX-512); "
            "seed 2 AMD EPYC (without AVX-512)") in grid.tables(records)
    moved = next(run for run in records if run.seed == 1 and run.arm == "random")
    records[moved]["entry"]["host"] = "Intel Xeon (with AVX-512)"
    assert grid.seed_check(records) == [
        "tiny-m seed 1: runs from 2 CPU kinds (AMD EPYC (without AVX-512), Intel Xeon (with AVX-512))"]


@pytest.mark.parametrize("cell", grid.CELLS, ids=lambda c: c.label)
def test_every_run_the_grid_would_start_is_a_valid_config(cell: grid.Cell) -> None:
    for run in grid.cell_runs(cell, dict.fromkeys(grid.ARMS, 5e-5))[:len(cell.arms)]:
        config = load_experiment(run.preset, run.overrides())
        assert config.algorithm.name == run.algorithm and config.learner.lr == 5e-5
        assert config.data.train.arithmetic.style == "worked"
        if run.arm == "none":
            assert config.selection.method == "none" and config.selection.ratio is None
        else:
            assert (config.selection.ratio, config.selection.mode) == (cell.ratio, cell.mode)
