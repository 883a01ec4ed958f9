"""Fast checks of the benchmark helpers that decide what is compared with what (no engines, no Ray)."""

from __future__ import annotations

import pytest

from benchmarks.learning_efficiency import seed_check_figures
from benchmarks.training_runs import LoopRun, rl_step_shape, step_breakdown
from orchestrator.config_loader import load_experiment

vs_trl = pytest.importorskip("benchmarks.vs_trl")


@pytest.mark.parametrize("preset", ["cpu-tiny-s", "cpu-smollm2"])
def test_trl_layout_is_our_rl_step(preset):
    """One TRL iteration = one generation batch of prompts × n, in the optimiser steps our learner takes."""
    config = load_experiment(preset, list(vs_trl.PARITY_OVERRIDES))
    layout = vs_trl._batch_layout(config)
    shape = rl_step_shape(preset, list(vs_trl.PARITY_OVERRIDES))
    generation_batch = layout["per_device_train_batch_size"] * layout["steps_per_generation"]
    assert generation_batch == shape["prompts"] * shape["samples_per_prompt"]
    assert layout["per_device_train_batch_size"] * layout["gradient_accumulation_steps"] == shape["mini_batch_size"]
    assert layout["optimiser_steps_per_iteration"] == shape["optimiser_steps"]
    assert config.learner.lr_warmup_steps == 0  # TRL runs a constant learning rate


def test_vs_trl_runs_the_scales_named_and_refuses_unknown_ones(monkeypatch):
    monkeypatch.setenv("GMTS_VS_TRL_SCALES", "smollm2-135m")
    assert [scale.label for scale in vs_trl.selected_scales(False)] == ["smollm2-135m"]
    monkeypatch.setenv("GMTS_VS_TRL_SCALES", "tiny-s,smollm2")
    with pytest.raises(ValueError, match=r"GMTS_VS_TRL_SCALES.*'smollm2'"):
        vs_trl.selected_scales(False)
    monkeypatch.delenv("GMTS_VS_TRL_SCALES")
    assert [scale.label for scale in vs_trl.selected_scales(False)] == ["tiny-s", "smollm2-135m"]


def test_trl_iteration_clock_groups_optimiser_steps():
    clock = vs_trl._StepClock()
    clock.begin = 0.0
    clock.ends = [1.0, 1.5, 2.0, 2.5, 4.0, 4.5, 5.0, 5.5]  # 2 iterations of 4 optimiser steps
    assert clock.iteration_seconds(4) == [2.5, 3.0]
    assert clock.iteration_seconds(1) == [1.0, 0.5, 0.5, 0.5, 1.5, 0.5, 0.5, 0.5]


def test_step_breakdown_takes_the_rest_step_by_step():
    steps = [{"time/step": 1.0, "time/rollout": 0.5, "time/train_step_s": 0.4},
             {"time/step": 3.0, "time/rollout": 0.5, "time/train_step_s": 2.0},
             {"time/step": 2.0, "time/rollout": 1.5, "time/train_step_s": 0.4}]
    out = step_breakdown(steps)
    assert out["step"] == 2.0 and out["rollout"] == 0.5 and out["learner"] == 0.4
    assert out["overhead"] == pytest.approx(0.1)  # rests 0.1, 0.5, 0.1 (median step − medians would be 1.1)
    assert out["sync"] is None


def test_loop_run_rl_seconds_sums_the_steps():
    run = LoopRun(overrides=[], history=[{"time/step": 1.5}, {"time/step": 2.0}], final_metrics={}, wall_seconds=9.0)
    assert run.rl_seconds == 3.5


def test_seed_check():
    def entry(seed, method, acc):
        return {"seed": seed, "method": method,
                "first_step": {"train/accuracy": acc, "reward/mean": acc, "train/response_length": 3.5}}

    good = [entry(0, "none", 0.25), entry(0, "gmts", 0.25), entry(1, "none", 0.3), entry(1, "gmts", 0.3)]
    assert [f.value for f in seed_check_figures(good)] == ["True", "True"]
    same_seeds = [entry(0, "none", 0.25), entry(1, "none", 0.25)]
    assert [f.value for f in seed_check_figures(same_seeds)] == ["True", "False"]
    drift = [entry(0, "none", 0.25), entry(0, "gmts", 0.26)]
    assert seed_check_figures(drift)[0].value == "False"


def test_run_journal_reuses_runs_of_the_same_code_and_key_only(tmp_path):
    from benchmarks.learning_efficiency import RunJournal

    path = tmp_path / "runs.jsonl"
    key = {"preset": "cpu-tiny-s", "steps": 3, "arm": "gmts", "overrides": ["learner.lr=0.0001"]}
    record = {"final": {"eval/arithmetic/accuracy": 0.1 + 0.2}, "entry": {"seed": 0}}
    RunJournal(path, code_version="abc").add(key, record)
    again = RunJournal(path, code_version="abc")
    assert again.get(key) == record  # floats come back to the last bit
    assert again.get({**key, "steps": 4}) is None
    assert RunJournal(path, code_version="def").get(key) is None  # other training code's numbers are never reused


def test_run_journal_survives_a_writer_killed_mid_line(tmp_path):
    from benchmarks.learning_efficiency import RunJournal

    path = tmp_path / "runs.jsonl"
    first, second = {"arm": "a"}, {"arm": "b"}
    journal = RunJournal(path, code_version="abc")
    journal.add(first, {"final": {}, "entry": {}})
    with open(path, "a") as handle:
        handle.write('{"key": {"arm": "c"}, "code')  # killed here
    RunJournal(path, code_version="abc").add(second, {"final": {"x": 1.0}, "entry": {}})
    reread = RunJournal(path, code_version="abc")
    assert reread.get(first) is not None and reread.get(second) == {"final": {"x": 1.0}, "entry": {}}
    assert reread.get({"arm": "c"}) is None


def test_shard_parsing_names_the_variable():
    from benchmarks.learning_efficiency import parse_shard

    assert parse_shard(None) is None and parse_shard("1/2") == (1, 2)
    for bad in ("2/2", "x", "1/0", "-1/2"):
        with pytest.raises(ValueError, match="GMTS_LE_SHARD"):
            parse_shard(bad)
    refused = r"^--shard: need 0 <= k < n \(shards count from 0: two shards are 0/2 and 1/2\), got '2/2'$"
    with pytest.raises(ValueError, match=refused):
        parse_shard("2/2", "--shard")


def test_arm_lrs_give_the_named_arms_their_own_grid():
    from benchmarks.learning_efficiency import _grid, ARMS, lrs_of, parse_arm_lrs

    arm_lrs = parse_arm_lrs("random=1e-4 ets@group=1e-4,3e-4", ["none", "random", "ets@group"])
    assert arm_lrs == {"random": [1e-4], "ets@group": [1e-4, 3e-4]}
    cfg = {"seeds": [0, 1], "lrs": [1e-4, 2e-4], "arm_lrs": arm_lrs}
    arms = [a for a in ARMS if a.name in ("none", "random", "ets@group")]
    runs = list(_grid(cfg, arms))
    assert len(runs) == 2 * (2 + 1 + 2) and lrs_of(cfg, "none") == [1e-4, 2e-4]
    assert {lr for arm, lr, _ in runs if arm.name == "random"} == {1e-4}
    with pytest.raises(ValueError, match="GMTS_LE_ARM_LRS"):
        parse_arm_lrs("gmts=1e-4", ["none"])


def test_code_version_ignores_the_report_code_but_not_the_training_code():
    from benchmarks.learning_efficiency import TRAINING_CODE

    assert "orchestrator" in TRAINING_CODE and "workers" in TRAINING_CODE
    assert not any(path.startswith(("docs", "tests", "benchmarks/learning_efficiency")) for path in TRAINING_CODE)


def test_jail_cost_times_both_paths_on_every_task() -> None:
    from benchmarks.reward_integrity import jail_cost

    report = jail_cost(("basic_arithmetic",), problems=3)
    row = report["basic_arithmetic"]
    assert row["checks"] == 3
    assert {"jail_wall_ms", "jail_cpu_ms", "in_process_wall_ms", "in_process_cpu_ms"} <= set(row)
    assert row["jail_wall_ms"] > 0 and row["in_process_wall_ms"] >= 0


def test_cpu_kind_names_the_model_and_avx512_as_the_cpuinfo_flags_say() -> None:
    from pathlib import Path

    from benchmarks.report import cpu_kind, machine_info

    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = next(line for line in cpuinfo.splitlines() if line.startswith("flags")).split(":", 1)[1].split()
    model = next(line for line in cpuinfo.splitlines() if line.startswith("model name")).split(":", 1)[1].strip()
    assert cpu_kind() == f"{model} ({'with' if 'avx512f' in flags else 'without'} AVX-512)"
    assert machine_info()["cpu_kind"] == cpu_kind()
