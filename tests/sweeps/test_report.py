"""The ablation report from a real SQLite MLflow store, populated by real MlflowClient calls the way
``orchestrator.train`` logs a trial (short grid params, per-step metrics, final eval metrics)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib.image
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from orchestrator.completion_table import COLUMNS, artifact_file
from orchestrator.run_tracking import log_table
from sweeps import report as report_cli
from sweeps.report import TokenStats, ablation_results, build_report, token_diagnostics
from sweeps.ablation import AblationResults
from sweeps.results import find_parent, read_sweep
from sweeps.table_views import wide_tables
from sweeps.parent_run import LR_SOURCE_TAG, PARENT_TAG, SPEC_NAME_TAG, SWEEP_ID_TAG, TRIAL_TAG, ensure_experiment

SWEEP_ID = "unit-sweep-20260101-000000"
FINAL_STEP = 3
# (method, ratio, mode, seed) → final eval/arithmetic/accuracy, eval/gsm8k/accuracy
FINALS = {
    ("none", None, "top", 0): (0.25, 0.10),
    ("none", None, "top", 1): (0.35, 0.20),
    ("ets", 0.2, "top", 0): (0.30, 0.12),
    ("ets", 0.2, "top", 1): (0.40, 0.18),
    ("gmts", 0.2, "top", 0): (0.40, 0.16),
    ("gmts", 0.2, "top", 1): (0.50, 0.30),
    ("gmts", 0.5, "top", 0): (0.45, 0.20),  # no ETS at 0.5: no Δ
    ("ets", 0.2, "bottom", 0): (0.05, 0.01),
}
# One diagnostic batch of two answers of one group: Spearman 1.0 and 0.8, mean 0.9; ω = A/8 (token-mean).
# (No ties among the |ω|·G of the group: the core's ranks are ordinal, SciPy's average tied ranks.)
TOKEN_STATS = {"answers": [{"entropy": [0.1, 0.2, 0.3, 0.4], "grad_norm": [0.5, 0.6, 0.7, 0.8], "advantage": 0.9,
                            "omega": [0.9 / 8] * 4, "group": 0},
                           {"entropy": [1.0, 2.0, 3.0, 4.0], "grad_norm": [1.0, 3.0, 2.0, 4.0], "advantage": -0.5,
                            "omega": [-0.5 / 8] * 4, "group": 0}]}


def expected_diagnostics(stats: dict) -> dict[str, float]:
    """The three numbers computed independently with NumPy/SciPy."""
    import numpy as np
    from scipy import stats as scipy_stats

    answers = stats["answers"]
    pearson = np.mean([np.corrcoef(np.log(a["entropy"]), np.log(a["grad_norm"]))[0, 1] for a in answers])
    spearman = np.mean([scipy_stats.spearmanr(a["entropy"], a["grad_norm"]).statistic for a in answers])
    out = {"diagnostics/pearson_log_entropy_log_gradnorm": float(pearson),
           "diagnostics/spearman_entropy_gradnorm": float(spearman)}
    if "omega" in answers[0]:  # one group: its tokens pooled
        score = [h * abs(w) for a in answers for h, w in zip(a["entropy"], a["omega"])]
        true_norm = [g * abs(w) for a in answers for g, w in zip(a["grad_norm"], a["omega"])]
        out["diagnostics/spearman_gmts_score_true_gradnorm"] = float(scipy_stats.spearmanr(score, true_norm).statistic)
    return out


def _role_metrics(method: str, seed: int) -> list[Metric]:
    """What the learner logs on a task with token roles: a selective method's decision share grows with the step,
    the full-token baseline's is the base rate; the role shares of the last step depend on the seed."""
    metrics = []
    for step in range(1, FINAL_STEP + 1):
        base = 0.25 + 0.01 * seed
        share = base if method == "none" else 0.3 + 0.1 * step + 0.02 * seed
        metrics += [Metric("selection/decision_share", share, 0, step),
                    Metric("selection/decision_base_share", base, 0, step)]
        roles = {"o": 0.3, "f": 0.2, "c": 0.1 + 0.02 * seed, "d": 0.3 - 0.02 * seed + 0.01 * (FINAL_STEP - step),
                 "a": 0.1, "x": 0.0}
        metrics += [Metric(f"selection/role_share/{role}", value, 0, step) for role, value in roles.items()]
    return metrics


def _child(client: MlflowClient, experiment_id: str, parent_id: str, trial: str, point: tuple, finals: tuple | None,
           status: str = "FINISHED", roles: bool = True) -> str:
    method, ratio, mode, seed = point
    run = client.create_run(experiment_id, run_name=trial, tags={PARENT_TAG: parent_id, TRIAL_TAG: trial})
    run_id = run.info.run_id
    params = {"method": method, "ratio": "" if ratio is None else str(ratio), "mode": mode, "model_size": "tiny-s",
              "algorithm": "grpo", "seed": str(seed), "selection.method": method}
    metrics = [Metric("reward/mean", 0.1 * step + 0.01 * seed, 0, step) for step in range(1, FINAL_STEP + 1)]
    metrics += [Metric("train/accuracy", 0.05 * step, 0, step) for step in range(1, FINAL_STEP + 1)]
    metrics += [Metric("eval/arithmetic/accuracy", 0.01, 0, 0)]  # the evaluation before training
    metrics += [Metric("base/arithmetic/accuracy", 0.2, 0, 0)]  # the same, under the base row's name
    metrics += _role_metrics(method, seed) if roles else []
    if finals is not None:
        metrics += [Metric("eval/arithmetic/accuracy", finals[0], 0, FINAL_STEP),
                    Metric("eval/gsm8k/accuracy", finals[1], 0, FINAL_STEP),
                    Metric("eval/arithmetic/pass_at_1", finals[0], 0, FINAL_STEP)]
    client.log_batch(run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
    client.set_tag(run_id, "base/checksum", "sha-of-the-one-base")
    for step in (0, FINAL_STEP):  # what the model says, as orchestrator.train logs it at each evaluation
        row = {"prompt": "1+1=", "completion": f"{step}<eos>", "answer": str(step), "reference": "2",
               "reward": float(step == 2), "problem_id": "add-0", "index": 0, "step": step, "set": "arithmetic"}
        log_table(client, run_id, artifact_file("arithmetic", step), COLUMNS, [[row[c] for c in COLUMNS]],
                  pinned=step == 0)
    client.set_terminated(run_id, status=status)
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One store for the module (creating the SQLite schema takes seconds); the tests only add to it."""
    tmp_path = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = ensure_experiment(client, "unit", tmp_path / "mlartifacts")
    parent = client.create_run(experiment_id, run_name=SWEEP_ID, tags={SWEEP_ID_TAG: SWEEP_ID, SPEC_NAME_TAG: "unit"})
    parent_id = parent.info.run_id
    run_ids = {}
    for index, (point, finals) in enumerate(FINALS.items()):
        trial = f"unit-t{index:03d}"
        if point == ("gmts", 0.2, "top", 1):  # restarted before its first checkpoint: an orphaned first run
            _child(client, experiment_id, parent_id, trial, point, (0.99, 0.99), status="FAILED")
        run_ids[point] = _child(client, experiment_id, parent_id, trial, point, finals)
    failed = _child(client, experiment_id, parent_id, "unit-t099", ("gmts", 0.8, "top", 0), None, status="FAILED")
    gmts_run = run_ids[("gmts", 0.2, "top", 0)]
    stats_file = tmp_path / "token_stats.json"
    stats_file.write_text(json.dumps(TOKEN_STATS))
    client.log_artifact(gmts_run, str(stats_file), "diagnostics")
    return {"uri": uri, "client": client, "parent_id": parent_id, "failed": failed, "tmp": tmp_path}


def _cell(results: dict, **where) -> dict:
    matches = [c for c in results["cells"] if all(c[k] == v for k, v in where.items())]
    assert len(matches) == 1, (where, matches)
    return matches[0]


@pytest.mark.slow
def test_table_numbers_mean_std_and_delta(store: dict) -> None:
    results = ablation_results(store["uri"], store["parent_id"])
    assert results["sweep_id"] == SWEEP_ID
    assert results["benchmarks"] == ["arithmetic", "gsm8k"]
    assert results["metrics"] == ["accuracy", "pass_at_1"]
    assert results["finished"] == 8
    assert [t["name"] for t in results["unfinished"]] == ["unit-t099"]

    common = {"metric": "accuracy", "model_size": "tiny-s", "algorithm": "grpo"}
    ets = _cell(results, method="ets", mode="top", ratio=0.2, benchmark="arithmetic", **common)
    gmts = _cell(results, method="gmts", mode="top", ratio=0.2, benchmark="arithmetic", **common)
    assert ets["mean"] == pytest.approx(0.35, abs=1e-12)
    assert ets["std"] == pytest.approx(statistics.stdev([0.30, 0.40]), abs=1e-12)
    assert ets["n"] == 2 and ets["seeds"] == [0, 1]
    # The finished run of the restarted trial counts, not its orphaned FAILED run (0.99).
    assert gmts["mean"] == pytest.approx(0.45, abs=1e-12)
    assert gmts["delta_vs_ets"] == pytest.approx(0.10, abs=1e-12)
    gsm8k = _cell(results, method="gmts", mode="top", ratio=0.2, benchmark="gsm8k", **common)
    assert gsm8k["delta_vs_ets"] == pytest.approx((0.16 + 0.30) / 2 - (0.12 + 0.18) / 2, abs=1e-12)

    assert ets["ci_low"] == pytest.approx(0.35 - 12.7062047 * statistics.stdev([0.30, 0.40]) / 2**0.5, abs=1e-6)
    assert gmts["delta_n"] == 2 and gmts["delta_ci_low"] == pytest.approx(0.10, abs=1e-9)
    base = _cell(results, method="base", benchmark="arithmetic", **common)
    assert base["mean"] == pytest.approx(0.2) and base["n"] == 1 and base["ci_low"] is None

    baseline = _cell(results, method="none", benchmark="arithmetic", **common)
    assert baseline["mode"] is None and baseline["ratio"] is None
    assert baseline["mean"] == pytest.approx(0.30, abs=1e-12) and baseline["delta_vs_ets"] is None
    lone = _cell(results, method="gmts", ratio=0.5, benchmark="arithmetic", **common)
    assert lone["std"] is None and lone["n"] == 1 and lone["delta_vs_ets"] is None
    bottom = _cell(results, method="ets", mode="bottom", benchmark="arithmetic", **common)
    assert bottom["mean"] == pytest.approx(0.05, abs=1e-12)


def test_a_table_of_one_lr_per_arm_says_nothing_chose_it(store: dict) -> None:
    """A sweep that set one lr never chose it on validation: the table's title must not say it did."""
    tables = wide_tables(AblationResults.model_validate(ablation_results(store["uri"], store["parent_id"])))
    assert tables and all("not chosen on validation" in t.title and "lr chosen on validation" not in t.title
                          for t in tables), [t.title for t in tables]


def test_a_table_of_fixed_lrs_cites_the_source_the_spec_names(store: dict) -> None:
    """A spec that fixes one lr per arm names who chose them (``lr_source``): the title cites it."""
    client = store["client"]
    client.set_tag(store["parent_id"], LR_SOURCE_TAG, "benchmarks/RESULTS.md, learning_efficiency")
    try:
        results = AblationResults.model_validate(ablation_results(store["uri"], store["parent_id"]))
    finally:
        client.delete_tag(store["parent_id"], LR_SOURCE_TAG)
    assert results.lr_source == "benchmarks/RESULTS.md, learning_efficiency"
    titles = [t.title for t in wide_tables(results)]
    assert titles and all("every arm at its config's lr, from benchmarks/RESULTS.md, learning_efficiency" in t
                          and "chosen on validation" not in t for t in titles), titles


@pytest.mark.slow
def test_report_files_and_parent_artifacts(store: dict) -> None:
    client = store["client"]
    folder = store["tmp"] / "report"
    report = build_report(client, client.get_run(store["parent_id"]), folder)
    assert len(report.notes) == 1 and report.notes[0].startswith("token diagnostics of unit-t004 (2 answers")
    assert "per-group Spearman ρ(H·|ω|, |ω|·G) = " in report.notes[0]

    markdown = (folder / "ablation.md").read_text()
    gmts_row = next(line for line in markdown.splitlines() if line.startswith("| gmts | top |"))
    # columns: ρ=0.2 arithmetic, ρ=0.2 gsm8k, ρ=0.5 arithmetic, ρ=0.5 gsm8k
    # Two seeds: half-width t(0.975, 1) · s/√2 = 12.706 · 0.0707/1.414 = 63.5 points; Δ is +10.0 on both
    # seeds, so its paired interval has no width; gsm8k's per-seed Δs are +4 and +12: 12.706 · 5.657/1.414.
    assert gmts_row.split(" | ")[2:4] == ["45.0 ± 63.5 (Δ +10.0 ± 0.0)", "23.0 ± 88.9 (Δ +8.0 ± 50.8)"]
    none_row = next(line for line in markdown.splitlines() if line.startswith("| none | — |"))
    assert none_row.count("30.0 ± 63.5") == 2  # the baseline repeated under both ratios
    base_row = next(line for line in markdown.splitlines() if line.startswith("| base | — |"))
    assert base_row.count("20.0") == 2  # one base measurement (8 trials, one checksum), no interval
    assert "n = 1–2 seeds per cell" in markdown
    assert "unit-t099 (FAILED)" in markdown

    rows = (folder / "ablation.csv").read_text().splitlines()
    assert rows[0].startswith("model_size,algorithm,method,scope,denominator,mode,ratio,lr,selected,benchmark,split,"
                              "metric,mean,std,n,ci_low,ci_high,delta_vs_ets")
    assert len(rows) == 1 + len(read_json(folder / "ablation.json")["cells"])
    assert "<th colspan='2'>ρ = 0.2</th>" in (folder / "ablation.html").read_text()

    listed = {a.path for a in client.list_artifacts(store["parent_id"], "ablation")}
    expected = {"ablation.csv", "ablation.md", "ablation.html", "ablation.json", "accuracy_vs_ratio.png",
                "eval_curves.png", "learning_curves.png", "entropy_vs_gradnorm.png", "notes.txt",
                "top_vs_bottom.png", "where_tokens_go.png"}  # ETS ran top and bottom at ρ = 0.2
    assert listed == {f"ablation/{name}" for name in expected}
    # The table is the parent's first artifact (the UI lists them in name order).
    root = [a.path for a in client.list_artifacts(store["parent_id"])]
    assert root[0] == "Ablation.html" and sorted(root) == root

    # Each arm links the last completions table of its lowest-seed trial, in every view and the parent's note.
    shown = {t.arm: (t.trial, t.seed, t.path) for t in report.completion_tables}
    last = artifact_file("arithmetic", FINAL_STEP)
    assert shown == {"All tokens": ("unit-t000", 0, last), "ETS top-20 %": ("unit-t002", 0, last),
                     "GMTS top-20 %": ("unit-t004", 0, last), "GMTS top-50 %": ("unit-t006", 0, last),
                     "ETS bottom-20 %": ("unit-t007", 0, last)}
    gmts = next(t for t in report.completion_tables if t.arm == "GMTS top-20 %")
    url = gmts.url(store["uri"], report.experiment_id)
    assert url == (f"http://127.0.0.1:5000/#/experiments/{report.experiment_id}/runs/{gmts.run_id}/artifacts/"
                   f"{last}?workflowType=machine_learning")
    assert f"[arithmetic at step {FINAL_STEP} (unit-t004, seed 0)]({url})" in markdown
    assert url.replace("&", "&amp;") in (folder / "ablation.html").read_text()
    assert url in client.get_run(store["parent_id"]).data.tags["mlflow.note.content"]
    assert "<th colspan='2'>ρ = 0.2</th>" in Path(client.download_artifacts(store["parent_id"], "Ablation.html",
                                                                            str(store["tmp"]))).read_text()
    for png in ("accuracy_vs_ratio.png", "eval_curves.png", "learning_curves.png", "entropy_vs_gradnorm.png",
                "top_vs_bottom.png", "where_tokens_go.png"):
        image = matplotlib.image.imread(folder / png)
        assert image.shape[0] > 200 and image.shape[1] > 200


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow
def test_parent_run_carries_the_answer(store: dict) -> None:
    """The summary metrics are the ablation cells' own numbers, and the run's note holds the table."""
    client = store["client"]
    build_report(client, client.get_run(store["parent_id"]), store["tmp"] / "answer")
    parent = client.get_run(store["parent_id"])
    metrics, cells = parent.data.metrics, ablation_results(store["uri"], store["parent_id"])
    gmts = _cell(cells, method="gmts", mode="top", ratio=0.2, benchmark="arithmetic", metric="accuracy")
    prefix = "accuracy/arithmetic/gmts_top0.2"
    assert metrics[f"{prefix}/mean"] == pytest.approx(0.45, abs=1e-12)
    assert metrics[f"{prefix}/n"] == 2
    assert (metrics[f"{prefix}/ci_low"], metrics[f"{prefix}/ci_high"]) == pytest.approx((gmts["ci_low"], gmts["ci_high"]))
    assert metrics[f"{prefix}/delta_vs_ets"] == pytest.approx(0.10, abs=1e-12)
    assert metrics[f"{prefix}/delta_ci_low"] == pytest.approx(gmts["delta_ci_low"])
    assert metrics["accuracy/arithmetic/ets_top0.2/mean"] == pytest.approx(0.35, abs=1e-12)
    assert metrics["accuracy/arithmetic/ets_bottom0.2/mean"] == pytest.approx(0.05, abs=1e-12)
    assert metrics["accuracy/arithmetic/none/mean"] == pytest.approx(0.30, abs=1e-12)
    assert "accuracy/arithmetic/none/ci_low" in metrics and "accuracy/arithmetic/none/delta_vs_ets" not in metrics
    assert metrics["accuracy/arithmetic/base/mean"] == pytest.approx(0.2)
    assert "accuracy/arithmetic/gmts_top0.5/ci_low" not in metrics  # one seed: no interval, none invented
    assert not any(key.startswith("pass_at_1/") for key in metrics)  # the report's metric only
    note = parent.data.tags["mlflow.note.content"]
    assert "| gmts | top | 45.0 ± 63.5 (Δ +10.0 ± 0.0) |" in note


def test_eval_curves_mean_and_band_over_seeds(store: dict) -> None:
    client = store["client"]
    curves = report_cli.eval_curves(client, read_sweep(client, client.get_run(store["parent_id"])))
    ets = next(c for c in curves if (c.benchmark, c.label) == ("arithmetic", "ETS top-20 %"))
    assert ets.steps == [0, FINAL_STEP]
    assert ets.mean == pytest.approx([0.01, 0.35], abs=1e-12)
    assert ets.low[1] == pytest.approx(0.35 - 12.7062047 * statistics.stdev([0.30, 0.40]) / 2**0.5, abs=1e-6)
    lone = next(c for c in curves if c.label == "GMTS top-50 %")
    assert lone.low == [None, None]  # one seed: no band
    assert {c.label for c in curves if c.benchmark == "gsm8k"} == {c.label for c in curves if c.benchmark == "arithmetic"}


def test_learning_curves_average_seeds(store: dict) -> None:
    client = store["client"]
    curves = report_cli.learning_curves(client, read_sweep(client, client.get_run(store["parent_id"])))
    assert {c.metric for c in curves} == {"reward/mean"}  # train/accuracy repeats it for a 0/1 reward
    ets = next(c for c in curves if (c.method, c.mode, c.ratio, c.metric) == ("ets", "top", 0.2, "reward/mean"))
    assert ets.steps == [1, 2, 3]
    assert ets.values == pytest.approx([0.1 * s + 0.005 for s in (1, 2, 3)], abs=1e-12)  # seeds 0 and 1


def test_where_the_tokens_go_per_arm_mean_over_seeds(store: dict) -> None:
    client = store["client"]
    routes = report_cli.token_routes(client, read_sweep(client, client.get_run(store["parent_id"])))
    assert {r.label for r in routes} == {"All tokens", "ETS top-20 %", "GMTS top-20 %", "GMTS top-50 %",
                                         "ETS bottom-20 %"}
    ets = next(r for r in routes if r.label == "ETS top-20 %")  # seeds 0 and 1
    assert ets.steps == [1, 2, 3]
    assert ets.decision_share == pytest.approx([0.3 + 0.1 * s + 0.01 for s in (1, 2, 3)], abs=1e-12)
    assert ets.base_share == pytest.approx([0.255] * 3, abs=1e-12)
    # The last step's shares (d was 0.01 higher at every earlier step), in the grammar's order.
    assert list(ets.role_share) == ["o", "f", "c", "d", "a", "x"]
    assert ets.role_share["c"] == pytest.approx(0.11, abs=1e-12) and ets.role_share["d"] == pytest.approx(0.29)
    everything = next(r for r in routes if r.label == "All tokens")
    assert everything.decision_share == pytest.approx(everything.base_share, abs=1e-12)


@pytest.mark.slow
def test_where_the_tokens_go_skipped_with_a_note_without_role_metrics(store: dict) -> None:
    client = store["client"]
    experiment_id = client.get_run(store["parent_id"]).info.experiment_id
    plain = client.create_run(experiment_id, run_name="plain", tags={SWEEP_ID_TAG: "plain-sweep"})
    _child(client, experiment_id, plain.info.run_id, "plain-t000", ("ets", 0.2, "top", 0), (0.3, 0.1), roles=False)
    report = build_report(client, client.get_run(plain.info.run_id), store["tmp"] / "plain", upload=False)
    assert any(note.startswith("where the tokens go: no finished trial logged selection/decision_share")
               for note in report.notes)
    assert not (store["tmp"] / "plain" / "where_tokens_go.png").exists()


def test_token_diagnostics_of_the_batch_match_numpy_and_scipy() -> None:
    numbers = token_diagnostics(TokenStats.model_validate(TOKEN_STATS))
    assert numbers["diagnostics/spearman_entropy_gradnorm"] == pytest.approx(0.9, abs=1e-12)
    assert numbers == pytest.approx(expected_diagnostics(TOKEN_STATS), abs=1e-12)
    # The GMTS score orders the group across its answers, not only within each one.
    assert numbers["diagnostics/spearman_gmts_score_true_gradnorm"] != pytest.approx(0.9)


@pytest.mark.slow
def test_the_parent_run_gets_the_diagnostic_numbers(store: dict) -> None:
    client = store["client"]
    report = build_report(client, client.get_run(store["parent_id"]), store["tmp"] / "diagnostics")
    metrics = client.get_run(store["parent_id"]).data.metrics
    expected = expected_diagnostics(TOKEN_STATS)
    assert {key: metrics[key] for key in expected} == pytest.approx(expected, abs=1e-12)
    assert {key: report.summary[key] for key in expected} == pytest.approx(expected, abs=1e-12)


@pytest.mark.slow
def test_an_artifact_without_omega_gets_the_figure_and_a_note(store: dict) -> None:
    """Runs from before ω was saved: the figure and the H–G numbers, and a note instead of the GMTS check."""
    client = store["client"]
    experiment_id = client.get_run(store["parent_id"]).info.experiment_id
    old = client.create_run(experiment_id, run_name="old", tags={SWEEP_ID_TAG: "old-sweep"})
    child = _child(client, experiment_id, old.info.run_id, "old-t000", ("gmts", 0.2, "top", 0), (0.3, 0.1))
    without = {"answers": [{k: v for k, v in a.items() if k not in ("omega", "group")} for a in TOKEN_STATS["answers"]]}
    stats_file = store["tmp"] / "old" / "token_stats.json"
    stats_file.parent.mkdir()
    stats_file.write_text(json.dumps(without))
    client.log_artifact(child, str(stats_file), "diagnostics")
    report = build_report(client, client.get_run(old.info.run_id), store["tmp"] / "old" / "report")
    assert (store["tmp"] / "old" / "report" / "entropy_vs_gradnorm.png").is_file()
    assert any("predates the per-token ω" in note for note in report.notes)
    metrics = client.get_run(old.info.run_id).data.metrics
    assert metrics["diagnostics/spearman_entropy_gradnorm"] == pytest.approx(0.9, abs=1e-12)
    assert "diagnostics/spearman_gmts_score_true_gradnorm" not in metrics


@pytest.mark.slow
def test_scatter_skipped_with_a_note_without_diagnostics(store: dict) -> None:
    client = store["client"]
    experiment_id = client.get_run(store["parent_id"]).info.experiment_id
    # A second sweep whose only trial logged no diagnostics batch.
    bare = client.create_run(experiment_id, run_name="bare", tags={SWEEP_ID_TAG: "bare-sweep"})
    _child(client, experiment_id, bare.info.run_id, "bare-t000", ("ets", 0.2, "top", 0), (0.3, 0.1))
    report = build_report(client, client.get_run(bare.info.run_id), store["tmp"] / "bare", upload=False)
    assert any("scatter skipped" in note for note in report.notes)
    assert not (store["tmp"] / "bare" / "entropy_vs_gradnorm.png").exists()


def test_find_parent_by_sweep_id_spec_name_and_run_id(store: dict) -> None:
    client = store["client"]
    for key in (SWEEP_ID, "unit", store["parent_id"]):
        assert find_parent(client, key).info.run_id == store["parent_id"]


@pytest.mark.slow
def test_report_cli_prints_the_table(store: dict, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert report_cli.main([SWEEP_ID, "--tracking-uri", store["uri"], "--no-upload"]) == 0
    out = capsys.readouterr().out
    assert "45.0 ± 63.5 (Δ +10.0 ± 0.0)" in out
    assert f"mlflow ui --backend-store-uri {store['uri']}" in out
    experiment_id = store["client"].get_run(store["parent_id"]).info.experiment_id
    assert f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{store['parent_id']}?workflowType=machine_learning" in out
    compare = next(line for line in out.splitlines() if "compare the trials:" in line).split()[-1]
    children = read_sweep(store["client"], store["client"].get_run(store["parent_id"])).trials
    assert compare.startswith("http://127.0.0.1:5000/#/compare-runs?runs=")
    assert all(child.run_id in compare for child in children) and len(children) == 8
    assert report_cli.main(["no-such-sweep", "--tracking-uri", store["uri"]]) == 2


def test_token_stats_with_mismatched_lengths_are_rejected() -> None:
    bad = {"answers": [{"entropy": [0.1, 0.2], "grad_norm": [0.5]}]}
    with pytest.raises(ValueError, match="grad_norm: 1 values for 2 entropies"):
        TokenStats.model_validate(bad)


@pytest.mark.slow
def test_each_arm_gets_the_lr_its_validation_score_chose_not_its_test_score(store: dict) -> None:
    client = store["client"]
    experiment_id = client.get_run(store["parent_id"]).info.experiment_id
    parent = client.create_run(experiment_id, run_name="lrs", tags={SWEEP_ID_TAG: "lr-sweep"})
    # (method, lr, seed) → (validation, test): ETS's validation prefers 3e-4, its test would prefer 1e-4.
    finals = {("ets", 1e-4, 0): (0.50, 0.40), ("ets", 1e-4, 1): (0.52, 0.42),
              ("ets", 3e-4, 0): (0.60, 0.30), ("ets", 3e-4, 1): (0.62, 0.32),
              ("gmts", 1e-4, 0): (0.70, 0.45), ("gmts", 1e-4, 1): (0.72, 0.49),
              ("gmts", 3e-4, 0): (0.10, 0.90), ("gmts", 3e-4, 1): (0.12, 0.92)}
    for index, ((method, lr, seed), (validation, test)) in enumerate(finals.items()):
        run = client.create_run(experiment_id, tags={PARENT_TAG: parent.info.run_id, TRIAL_TAG: f"lr-t{index:03d}"})
        params = {"method": method, "ratio": "0.2", "mode": "top", "model_size": "tiny-s", "algorithm": "grpo",
                  "seed": str(seed), "learner.lr": str(lr), "data.eval.arith_val.split": "validation",
                  "data.eval.arith.split": "test"}
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()],
                         metrics=[Metric("eval/arith_val/accuracy", validation, 0, 3),
                                  Metric("eval/arith/accuracy", test, 0, 3)])
        client.set_terminated(run.info.run_id)
    report = build_report(client, client.get_run(parent.info.run_id), store["tmp"] / "lrs", upload=False)
    shown = [c for c in report.results.cells if c.selected and c.split == "test"]
    assert {(c.method, c.lr) for c in shown} == {("ets", 3e-4), ("gmts", 1e-4)}
    gmts = next(c for c in shown if c.method == "gmts")
    # Δ pairs each arm at its own lr, by seed: (0.45 − 0.30, 0.49 − 0.32) = (0.15, 0.17).
    assert gmts.delta_vs_ets == pytest.approx(0.16) and gmts.delta_n == 2
    markdown = (store["tmp"] / "lrs" / "ablation.md").read_text()
    assert "arith_val" not in markdown and "| ρ=0.2 arith |" in markdown  # validation is no table column
    assert "each arm at its lr chosen on validation" in markdown
    assert (store["tmp"] / "lrs" / "accuracy_vs_lr.png").is_file()


def test_the_terminal_table_keeps_scope_labels_and_an_unbroken_title_at_80_columns() -> None:
    from rich.console import Console

    from sweeps.table_views import WideTable, to_rich

    table = WideTable("tiny-s", "grpo", "accuracy", [("0.2", "arithmetic")],
                      [("base", "—", ["21.7"]), ("gmts-release [group, ÷all]", "top", ["34.8 (Δ +11.8)"])],
                      "1 seed, no interval", "every arm at lr 0.0001, one lr set by the spec (not chosen on validation)")
    console = Console(width=80, record=True, color_system=None)
    for view in to_rich(None, [table]):
        console.print(view)
    text = console.export_text()
    assert "gmts-release [group, ÷all]" in text  # a row label is text, never rich markup
    title_lines = text.split("┏")[0].strip().splitlines()
    assert len(title_lines) == 2 and title_lines[0].startswith("model tiny-s · grpo"), title_lines
