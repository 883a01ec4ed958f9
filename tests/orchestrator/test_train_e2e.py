"""The RL training job end to end with the real parts: Ray actors, vLLM, DeepSpeed, verifiers, MLflow.

One small cpu-tiny-s configuration (a short warm-up, a few RL steps). Every training start-up costs tens of
seconds on 2 cores (Ray actors, vLLM, DeepSpeed, a fresh MLflow store), so the module shares what it can: one
Ray, one output folder and model cache (the warm-up base is trained once), and one uninterrupted 4-step run
that the resume test continues against and the reproducibility test repeats.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import psutil
import pytest
import ray
import torch
from mlflow.tracking import MlflowClient

from orchestrator.completion_table import COLUMNS, artifact_file
from orchestrator.config_loader import load_experiment
from orchestrator.train import StepReport, train

pytestmark = pytest.mark.slow

COMPARED = ("train/accuracy", "reward/mean", "loss/pg", "loss/kl", "selection/selected_fraction")


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    """The module's output folder and model cache: runs are told apart by name, the base is built once."""
    return tmp_path_factory.mktemp("train-e2e")


@pytest.fixture(scope="module")
def full_run(shared_dir, embedded_ray):
    """The uninterrupted 4-step run (checkpoints every 2 steps, evaluations at 0, 2, 4), its step reports and every
    address a process of this test's tree (Ray's servers, agents, actors, vLLM, the learners) listened on meanwhile."""
    reports: list[StepReport] = []
    with ListeningAddresses() as listened:
        result = train(_config(shared_dir, "full", 4), on_step=reports.append)
    return result, reports, listened.seen


class ListeningAddresses:
    """Samples, every 0.2 s until exit, the listening TCP sockets of this process and all its descendants."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}  # address → names of the processes that listened there
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ListeningAddresses:
        self._sample_once()  # Ray's servers already run (the module's cluster): seen before the first sleep
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self._sample_once()

    def _sample_once(self) -> None:
        me = psutil.Process()
        for process in [me, *me.children(recursive=True)]:
            try:
                for conn in process.net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN:
                        self.seen.setdefault(conn.laddr.ip, set()).add(process.name())
            except psutil.Error:  # gone between the listing and the look
                pass


def _config(root, name: str, steps: int, **extra: str):
    # The short warm-up's base earns no reward on these few problems (every advantage 0): the entropy bonus moves
    # the weights at every step all the same, so that resuming, repeating and lagging compare a changing policy.
    overrides = {
        "algorithm.loss.entropy_coef": "0.01", "learner.lr": "0.001", "learner.lr_warmup_steps": "0",
        "name": name, "output_dir": str(root / "runs"), "model.cache_dir": str(root / "models"),
        "warmup.steps": "40", "warmup.examples": "800", "training.steps": str(steps), "checkpoint.interval": "2",
        "data.prompts_per_step": "8", "rollout.n_samples": "4", "learner.mini_batch_size": "32",
        "learner.micro_batch_size": "32", "data.eval.arithmetic.limit": "24", "data.eval.arithmetic_val.limit": "16",
        "evaluation.interval": "2",
        "learner.gradient_norm_stats": "true", **extra,
    }
    return load_experiment("cpu-tiny-s", [f"{k}={v}" for k, v in overrides.items()])


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_train_logs_to_mlflow_and_resumes_exactly(tmp_path, shared_dir, full_run):
    full, reports, _ = full_run
    config = _config(shared_dir, "full", 4)
    client = MlflowClient(config.tracking_uri())
    run = client.get_run(full.run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (params["method"], params["ratio"], params["model_size"], params["algorithm"]) == (
        "gmts-release", "0.2", "tiny-s", "grpo")  # the preset's recipe, by name
    assert (params["scope"], params["denominator"], params["selection.method"]) == ("group", "all", "gmts")
    assert params["selection.scope"] == "group" and params["learner.zero_stage"] == "0"
    assert [r.step for r in reports] == [1, 2, 3, 4] and reports[1].checkpoint_dir is not None
    assert set(full.final_metrics) >= {"eval/arithmetic/accuracy", "eval/arithmetic/pass_at_1"}
    # Every step logged once; vLLM and the learner agree on log π after every in-place weight sync.
    assert sorted(_history(client, full.run_id, "reward/mean")) == [1, 2, 3, 4]
    assert min(_history(client, full.run_id, "optim/grad_norm").values()) > 0  # every step moves the weights
    assert max(_history(client, full.run_id, "rollout/logprob_diff").values()) < 1e-4
    assert sorted(_history(client, full.run_id, "eval/arithmetic/accuracy")) == [0, 2, 4]
    # The base is recorded on the run: its weights' checksum, its step-0 evaluation under base/, and later
    # evaluations measure the distance from it.
    assert len(run.data.tags["base/checksum"]) == 64
    assert _history(client, full.run_id, "base/accuracy") == {0: _history(client, full.run_id, "eval/arithmetic/accuracy")[0]}
    assert sorted(_history(client, full.run_id, "eval/arithmetic/kl_to_base")) == [2, 4]
    assert 0.0 <= _history(client, full.run_id, "eval/arithmetic/changed_vs_base")[4] <= 1.0
    artifact = client.download_artifacts(full.run_id, "diagnostics/token_stats.json", str(tmp_path))
    answers = json.loads(open(artifact).read())["answers"]
    assert answers and len(answers[0]["entropy"]) == len(answers[0]["grad_norm"]) == len(answers[0]["omega"]) > 0
    assert all(isinstance(a["group"], int) for a in answers)
    _assert_completion_tables(client, full.run_id, tmp_path)

    # The same run stopped after step 2, then resumed: steps 3 and 4 repeat the uninterrupted run. It takes
    # the collective weight-sync route (learner rank 0 broadcasts to the vLLM worker over gloo), the full
    # run the in-process one: the two routes must train identically.
    collective = {"rollout.weight_sync": "collective", "rollout.weight_sync_bucket_bytes": str(64 * 1024)}
    train(_config(shared_dir, "split", 2, **collective))
    resumed = train(_config(shared_dir, "split", 4, **collective), resume=True)
    assert max(_history(client, resumed.run_id, "rollout/logprob_diff").values()) < 1e-4
    runs = client.search_runs([run.info.experiment_id], "tags.`gmts.run_name` = 'split'")
    assert [r.info.run_id for r in runs] == [resumed.run_id]  # the same MLflow run was reopened
    for key in COMPARED:
        uninterrupted, continued = _history(client, full.run_id, key), _history(client, resumed.run_id, key)
        assert sorted(continued) == [1, 2, 3, 4], key  # no step logged twice, none lost
        for step in (3, 4):
            assert continued[step] == pytest.approx(uninterrupted[step], rel=1e-5, abs=1e-7), (key, step)


def _assert_completion_tables(client: MlflowClient, run_id: str, folder) -> None:
    """What the model says at each evaluation (0, 2, 4): 16 shown problems, the same ones every time, whose
    rewards make the logged accuracy where the set has no more than 16 problems (arithmetic_val)."""
    for name, size in (("arithmetic", 24), ("arithmetic_val", 16)):
        files = [a.path for a in client.list_artifacts(run_id, f"completions/{name}")]
        assert files == [artifact_file(name, step) for step in (0, 2, 4)]
        accuracy = _history(client, run_id, f"eval/{name}/accuracy")
        ids = None
        for step in (0, 2, 4):
            table = json.loads(open(client.download_artifacts(run_id, artifact_file(name, step), str(folder))).read())
            assert table["columns"] == list(COLUMNS)
            rows = [dict(zip(COLUMNS, row)) for row in table["data"]]
            assert len(rows) == 16 and {r["step"] for r in rows} == {step}
            ids = ids or [r["problem_id"] for r in rows]
            assert [r["problem_id"] for r in rows] == ids and [r["index"] for r in rows] == list(range(16))
            assert all(r["completion"] and r["reference"] for r in rows)
            correct = sum(r["reward"] for r in rows)
            if size == 16:
                assert correct / 16 == pytest.approx(accuracy[step])
            else:  # the 8 problems not shown can make up at most 8 more
                assert correct <= accuracy[step] * size + 1e-9 <= correct + size - 16 + 1e-9


def test_a_run_on_one_machine_listens_on_loopback_only(full_run):
    """The embedded cluster (orchestrator.cluster.start_embedded) and everything a run starts in it — GCS, raylet,
    dashboard and runtime-env agents, the rollout, learner and reward actors, the learners' rendezvous store —
    listen on 127.0.0.1 only: nothing of a run on one machine is reachable from another."""
    _, _, listened = full_run
    assert listened, "no listening socket seen"
    outside = {address: names for address, names in listened.items()
               if address not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")}
    assert not outside, outside


def test_the_same_config_and_seed_repeat_every_metric_exactly_under_load(shared_dir, full_run):
    """Deliverable of reproducibility: same config + seed → the same numbers to the last digit, even with the
    cores busy and another torch thread setting in the driver (timings aside). The first of the two runs is
    the module's uninterrupted run; the repeat differs from it in its name only."""
    first, _, _ = full_run
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy core while the repeat runs
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2 if previous == 1 else 1)
        again = train(_config(shared_dir, "again", 4))
    finally:
        torch.set_num_threads(previous)
        hog.kill()
        hog.wait()
    client = MlflowClient(_config(shared_dir, "full", 4).tracking_uri())
    runs = {name: client.get_run(result.run_id) for name, result in (("first", first), ("again", again))}
    assert runs["first"].data.tags["base/checksum"] == runs["again"].data.tags["base/checksum"]
    keys = sorted(k for k in runs["first"].data.metrics if not k.startswith("time/"))
    assert keys == sorted(k for k in runs["again"].data.metrics if not k.startswith("time/"))
    assert {"eval/arithmetic/accuracy", "loss/pg", "base/accuracy", "eval/arithmetic/kl_to_base"} <= set(keys)
    differing = {key: (_history(client, first.run_id, key), _history(client, again.run_id, key)) for key in keys
                 if _history(client, first.run_id, key) != _history(client, again.run_id, key)}
    assert not differing


def test_bad_config_fails_before_anything_starts(tmp_path):
    from orchestrator.config_loader import ConfigError
    from orchestrator.train import main

    assert main(["--config", "cpu-tiny-s", "--set", "selection.ratio=0"]) == 2
    with pytest.raises(ConfigError, match="selection.ratio"):
        _config(tmp_path, "bad", 2, **{"selection.ratio": "0"})
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def worked_colocated_run(shared_dir, embedded_ray):
    """A 2-step ETS run on cpu-tiny-worked, each engine and learner colocated, and the placement groups alive at
    each step. No warm-up: the untrained policy earns no reward, so ETS (which ranks entropy alone) is the method
    that selects."""
    seen: list[list[dict]] = []

    def live_groups(report: StepReport) -> None:
        seen.append([g["bundles"] for g in ray.util.placement_group_table().values() if g["state"] == "CREATED"])

    overrides = {
        "name": "worked", "output_dir": str(shared_dir / "runs"), "model.cache_dir": str(shared_dir / "models"),
        "warmup.enabled": "false", "training.steps": "2", "checkpoint.interval": "0", "evaluation.interval": "0",
        "evaluation.compare_to_base": "false", "data.prompts_per_step": "8", "learner.mini_batch_size": "64",
        "learner.micro_batch_size": "64", "data.eval.arithmetic.limit": "8", "data.eval.arithmetic_val.limit": "8",
        "selection.recipe": "null", "selection.method": "ets", "selection.ratio": "0.2", "resources.colocate": "true",
    }
    config = load_experiment("cpu-tiny-worked", [f"{k}={v}" for k, v in overrides.items()])
    result = train(config, on_step=live_groups)
    groups_after = [g["state"] for g in ray.util.placement_group_table().values()]
    return config, result, seen, groups_after


def test_colocated_run_reserves_one_bundle_per_engine_learner_pair_and_frees_it(worked_colocated_run):
    _, result, seen, groups_after = worked_colocated_run
    assert result.steps == 2
    # Outside a sweep the run reserved its own group: the driver's sliver, then the (engine 0, learner 0) pair.
    assert seen == [[{0: {"CPU": 0.01}, 1: {"CPU": 1.99}}]] * 2
    assert all(state == "REMOVED" for state in groups_after)


def test_a_worked_addition_run_logs_where_the_tokens_go(worked_colocated_run):
    """The roles reach the learner: ETS's selected tokens on cpu-tiny-worked, per role, every step."""
    config, result, _, _ = worked_colocated_run
    client = MlflowClient(config.tracking_uri())
    share = _history(client, result.run_id, "selection/decision_share")
    base = _history(client, result.run_id, "selection/decision_base_share")
    assert sorted(share) == sorted(base) == [1, 2]
    assert all(0.0 <= value <= 1.0 for value in (*share.values(), *base.values()))
    logged = client.get_run(result.run_id).data.metrics
    role_shares = [logged[f"selection/role_share/{role}"] for role in "ofcdax"]
    assert sum(role_shares) == pytest.approx(1.0)  # every selected token has one role
    assert {f"selection/decision_share_decile_{d}" for d in range(10)} & set(logged)


def test_rolling_out_a_step_ahead_trains_one_version_behind_and_resumes_exactly(shared_dir, embedded_ray):
    """rollout.max_staleness=1: the engines collect step t+1's batch while the learner trains step t. Every step
    records how many versions its batch lags (0 for the first, then exactly 1), the stale batches are trained
    off-policy (their ratio is not 1), and a run stopped after step 2 resumes with the batch it held ahead: steps
    3 and 4 repeat the uninterrupted run."""
    ahead = {"rollout.max_staleness": "1", "learner.old_logp_source": "rollout", "evaluation.interval": "0"}
    full = train(_config(shared_dir, "ahead", 4, **ahead))
    client = MlflowClient(_config(shared_dir, "ahead", 4).tracking_uri())
    assert _history(client, full.run_id, "rollout/staleness") == {1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0}
    ratio_gap = _history(client, full.run_id, "policy/ratio_abs_dev")
    assert ratio_gap[1] < 1e-4 < min(ratio_gap[step] for step in (2, 3, 4)), ratio_gap  # on-policy, then 1 behind
    assert sorted(_history(client, full.run_id, "rollout/logprob_diff")) == [1]  # numeric agreement: fresh batch

    train(_config(shared_dir, "ahead-split", 2, **ahead))
    resumed = train(_config(shared_dir, "ahead-split", 4, **ahead), resume=True)
    for key in (*COMPARED, "policy/ratio_abs_dev", "rollout/staleness"):
        uninterrupted, continued = _history(client, full.run_id, key), _history(client, resumed.run_id, key)
        assert sorted(continued) == [1, 2, 3, 4], key
        for step in (3, 4):
            assert continued[step] == pytest.approx(uninterrupted[step], rel=1e-5, abs=1e-7), (key, step)
