"""End to end: real 2-trial sweeps (Ray Tune, the tiny model, a real SQLite MLflow store) on a multi-node Ray
cluster, undisturbed and then with every fault a sweep must survive.

The cluster is Ray's own multi-node test harness (``ray.cluster_utils.Cluster``): a head and three worker nodes,
each its own raylet, object store and workers, all on 127.0.0.1 of this machine. Each worker node holds one CPU, so
a trial's placement group (the trial's driver 0.01 CPU + the rollout engine 0.99, then one CPU per learner rank) can
only be placed across three nodes: the learner group's rendezvous and gradient all-reduce, and the weight sync from
learner rank 0 to the engine, cross nodes. The CLI runs in a subprocess attached to the cluster.

1. The undisturbed sweep: where every actor ran is read from Ray's actor table; its metrics are the reference.
2. The same sweep again, with faults:
   - after trial 0's first checkpoint the node of one of its learner ranks is lost (``Cluster.remove_node`` without
     a graceful stop: its raylet and every process on it die at once) and a fresh node joins: Tune restarts the
     trial from that checkpoint on the nodes alive;
   - after trial 1's first checkpoint its rollout actor's process (the vLLM engine) is killed (SIGKILL);
   - as Tune restarts trial 1, the sweep itself is interrupted (SIGINT, as Ctrl-C); the whole cluster is then
     recreated and the sweep's local folder deleted (as with the driver's node lost), and ``--resume`` on the new
     cluster reruns only trial 1, from the checkpoint Tune's restart began from, and finishes the sweep.
   This sweep keeps its durable state in an S3-compatible object store (``--storage s3://…``: moto's server on
   loopback, ``tests/sweeps/s3_server.py``): the record, Tune's state, each trial's real checkpoint and MLflow's
   artifacts; ``--resume`` finds all of it there. Each step is logged once, and both trials end with the
   undisturbed sweep's metrics, to the bit.

Both sweeps roll out one step ahead of their learners (``rollout.max_staleness: 1``), so each fault strikes while a
batch is being collected beside the update: the resumed trial continues from the batch its checkpoint held, and the
collection in flight is collected again by the same weights (nothing trained twice, nothing skipped).

The faults come from the test harness watching the sweep's files, its log and Ray's actor table: production code
has no test hook.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray
import yaml
from mlflow import MlflowClient
from ray._private import state as ray_state
from ray.cluster_utils import Cluster

from orchestrator.cluster import loopback_only
from sweeps.parent_run import PARENT_TAG, SWEEP_ID_TAG
from tests.sweeps.cli_process import wait_for
from tests.sweeps.s3_server import environment, object_keys, s3_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
STEPS, CHECKPOINT_EVERY = 4, 2
WORKER_NODES = 3
METHODS = ("ets", "gmts")
RESTARTED = "{}: restarted by Tune after step"  # sweeps.trainable logs it as a restarted attempt begins
BUCKET = "gmts-e2e"
STORAGE = f"s3://{BUCKET}/sweeps"
PRESET = {
    "extends": "cpu-tiny-s",
    "warmup": {"enabled": False},  # the plumbing is under test, not learning: skip the supervised warm-up
    "rollout": {"n_samples": 4, "max_staleness": 1},
    # Both of the preset's held-out sets cut to 8 problems: left out here, the validation set keeps all its
    # 1,246, evaluated (with a learner forward for kl_to_base) at step 0 and at the end of every attempt.
    "data": {"eval": {"arithmetic": {"source": "arithmetic", "split": "test", "limit": 8},
                      "arithmetic_val": {"source": "arithmetic", "split": "validation", "limit": 8}},
             "prompts_per_step": 8},
    # Two ranks, each one CPU of its own: on two different one-CPU nodes.
    "learner": {"num_actors": 2, "mini_batch_size": 32, "micro_batch_size": 16, "threads_per_actor": 1,
                "old_logp_source": "rollout"},
    "training": {"steps": STEPS},
    "evaluation": {"interval": 0},
    "checkpoint": {"interval": CHECKPOINT_EVERY, "keep_last": 2},
    "resources": {"cpus_per_rollout_actor": 0.99},  # with the trial's driver (0.01 CPU): one node's CPU
}
# A lost node is declared dead after about a second (Ray's default waits tens of seconds).
FAST_FAILURE_DETECTION = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                          "health_check_failure_threshold": 3}


def _start_cluster() -> Cluster:
    # Every node of it on loopback, as the embedded cluster (orchestrator.cluster.start_embedded): the switch binds
    # each raylet's servers to 127.0.0.1; Ray's test harness adds nodes under it all the same.
    loopback_only()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "_system_config": FAST_FAILURE_DETECTION})
    try:
        for _ in range(WORKER_NODES):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def _stop_cluster(cluster: Cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


def _cli(cluster: Cluster, spec: Path, out: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "sweeps.run", str(spec), "--output-dir", str(out), "--address", cluster.address,
            *more]


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "GMTS_STORAGE")}
    return {**env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **more}


def _actors(class_name: str, alive_only: bool = False) -> list[dict]:
    """Ray's actor table (GCS): each actor of that class with its node, process and state."""
    found = [a for a in ray_state.actors().values() if a["ActorClassName"].endswith(class_name)]
    return [a for a in found if a["State"] == "ALIVE"] if alive_only else found


def _checkpoint(sweep_dir: Path, trial: str, step: int) -> Path:
    return sweep_dir / trial / "checkpoints" / f"step_{step:06d}" / "run_state.json"


def _new_alive(class_name: str, known: set[str]) -> list[dict]:
    return [a for a in _actors(class_name, alive_only=True) if a["ActorID"] not in known]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory):
    ray.shutdown()  # the suite's shared embedded Ray (tests/conftest.py), were it up: this module needs its own
    # The store's environment before any node starts: the trials' processes inherit it from their raylets.
    with s3_server(BUCKET) as s3_env, environment(s3_env):
        cluster = _start_cluster()
        try:
            yield {**_run_sweeps(cluster, tmp_path_factory.mktemp("e2e")), "s3_env": s3_env}
        finally:
            _stop_cluster(cluster)


def _run_sweeps(cluster: Cluster, tmp: Path) -> dict:
    (tmp / "preset.yaml").write_text(yaml.safe_dump(PRESET))
    spec = tmp / "e2e.yaml"
    spec.write_text(yaml.safe_dump({"name": "e2e", "base": {"preset": str(tmp / "preset.yaml")}, "max_failures": 2,
                                    "grid": {"method": list(METHODS), "ratio": [0.2], "mode": ["top"], "seed": [0]}}))

    # Neither --output-dir nor --storage on a cluster of several nodes: refused before anything is written.
    refused = subprocess.run([sys.executable, "-m", "sweeps.run", str(spec), "--address", cluster.address], cwd=tmp,
                             env=_env(), check=False, capture_output=True, text=True, timeout=300)
    undisturbed = subprocess.run(_cli(cluster, spec, tmp / "undisturbed"), cwd=REPO, env=_env(), check=False,
                                 capture_output=True, text=True, timeout=900)
    assert undisturbed.returncode == 0, (undisturbed.stdout + undisturbed.stderr)[-5000:]
    # In start order: the trials ran one after the other, so each trial's actors are consecutive.
    placed = {role: [(a["Address"]["NodeID"], a["ActorID"])
                     for a in sorted(_actors(role), key=lambda actor: actor["StartTime"])]
              for role in ("LearnerEngine", "RolloutEngine", "RewardWorker")}
    known = {role: {actor for _, actor in actors} for role, actors in placed.items()}

    # The faulted sweep's MLflow store is its own (a new experiment, whose artifacts go to the object store), outside
    # its output folder, which is deleted before --resume.
    out, log_file, tracking_uri = tmp / "faulted", tmp / "first.log", f"sqlite:///{tmp / 'faulted-mlflow.db'}"
    faulted_env = _env(MLFLOW_TRACKING_URI=tracking_uri)
    with open(log_file, "w") as log:
        proc = subprocess.Popen(_cli(cluster, spec, out, "--storage", STORAGE), cwd=REPO, env=faulted_env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            sweep_dir = wait_for(lambda: next(iter(out.glob("e2e-*/sweep.json")), None), proc, 120,
                                 "sweep.json").parent
            # Trial 0: the node of one of its learner ranks is lost, and a fresh node brings the capacity back.
            wait_for(_checkpoint(sweep_dir, "e2e-t000", CHECKPOINT_EVERY).is_file, proc, 600,
                     "trial 0's first checkpoint")
            learners = wait_for(lambda: _new_alive("LearnerEngine", known["LearnerEngine"]), proc, 60,
                                "trial 0's learner ranks")
            victim_id = learners[-1]["Address"]["NodeID"]
            cluster.remove_node(next(node for node in cluster.worker_nodes if node.node_id == victim_id),
                                allow_graceful=False)
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            # Trial 1: its engine's process is killed.
            wait_for(_checkpoint(sweep_dir, "e2e-t001", CHECKPOINT_EVERY).is_file, proc, 600,
                     "trial 1's first checkpoint")
            # One trial at a time (each fills the three nodes): trial 0's engines are gone by now.
            engines = wait_for(lambda: _new_alive("RolloutEngine", known["RolloutEngine"]), proc, 60,
                               "trial 1's rollout engine")
            for engine in engines:
                os.kill(engine["Pid"], signal.SIGKILL)
            # Ctrl-C as Tune restarts the trial: the restarted attempt logs its restart before it starts its actors
            # (seconds), so the sweep stops with trial 1 unfinished whatever step the 0.1 s steps had reached when
            # the engine died.
            wait_for(lambda: RESTARTED.format("e2e-t001") in log_file.read_text(), proc, 600,
                     "trial 1's restart by Tune")
            proc.send_signal(signal.SIGINT)
            first_rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    # The latest checkpoint of trial 1 when the sweep stopped, the one --resume must continue from: Tune's restart
    # began from it (or, had Ctrl-C taken effect only after the restarted attempt's first steps, from one before).
    interrupted_at = max(step for step in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)
                         if _checkpoint(sweep_dir, "e2e-t001", step).is_file())
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    # The whole cluster recreated, as after losing its head, and the local folder gone with the driver's node:
    # --resume continues from the object store alone.
    _stop_cluster(cluster)  # stopping it again at the fixture's end does nothing
    shutil.rmtree(out)
    fresh = _start_cluster()
    try:
        resumed = subprocess.run(_cli(fresh, spec, out, "--storage", STORAGE, "--resume"), cwd=REPO, env=faulted_env,
                                 check=False, capture_output=True, text=True, timeout=900)
    finally:
        _stop_cluster(fresh)
    return {
        "placed": placed, "victim": victim_id, "alive": alive, "killed": {"learner": learners, "rollout": engines},
        "out": out, "sweep_dir": sweep_dir, "sweep_id": sweep_dir.name, "undisturbed_out": tmp / "undisturbed",
        "first_rc": first_rc, "first_log": log_file.read_text(), "interrupted_at": interrupted_at,
        "resume_rc": resumed.returncode, "resume_log": resumed.stdout + resumed.stderr,
        "tracking_uri": tracking_uri, "reference_tracking_uri": f"sqlite:///{tmp / 'undisturbed' / 'mlflow.db'}",
        "refused": refused, "refused_wrote": (tmp / "runs").exists(),
    }


def _children(tracking_uri: str) -> tuple[MlflowClient, object, list]:
    """The sweep's MLflow client, parent run and child runs."""
    client = MlflowClient(tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    parents = [p for p in client.search_runs(ids, f"tags.`{SWEEP_ID_TAG}` != ''") if PARENT_TAG not in p.data.tags]
    assert len(parents) == 1
    return client, parents[0], client.search_runs(ids, f"tags.`{PARENT_TAG}` = '{parents[0].info.run_id}'")


def _attempt_starts(sweep: dict, trial: str) -> tuple[list[int], list[dict]]:
    """The first step of each attempt of ``trial``, from Tune's own record of its reports (the first report of
    an attempt has iterations_since_restore == 1), and those reports."""
    filesystem, tune_dir = pafs.FileSystem.from_uri(f"{STORAGE}/ray_results/{sweep['sweep_id']}")
    trial_dir = next(info.path for info in filesystem.get_file_info(pafs.FileSelector(tune_dir))
                     if f"trial={trial}" in info.base_name)
    with filesystem.open_input_stream(f"{trial_dir}/result.json") as stream:
        rows = [json.loads(line) for line in stream.read().decode().splitlines() if line.strip()]
    return [row["step"] for row in rows if row["iterations_since_restore"] == 1], rows


def test_actors_of_a_trial_are_spread_over_nodes(sweeps: dict) -> None:
    placed = sweeps["placed"]
    learner_nodes = [node for node, _ in placed["LearnerEngine"]]
    rollout_nodes = [node for node, _ in placed["RolloutEngine"]]
    assert len(learner_nodes) == 4 and len(rollout_nodes) == 2  # 2 trials × (2 ranks, 1 engine)
    for trial in range(2):  # one trial at a time (max_concurrent_trials 1): each trial's actors are consecutive
        ranks = learner_nodes[2 * trial: 2 * trial + 2]
        assert len(set(ranks)) == 2, "the two learner ranks shared a node"
        assert rollout_nodes[trial] not in ranks, "the rollout engine shared a node with a learner rank"
    assert len(set(learner_nodes) | set(rollout_nodes)) == WORKER_NODES


def test_a_cluster_sweep_without_chosen_storage_is_refused(sweeps: dict) -> None:
    refused = sweeps["refused"]
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2, said[-3000:]
    assert f"the cluster has {WORKER_NODES + 1} nodes" in said and "pass --storage s3://bucket/prefix" in said
    assert not sweeps["refused_wrote"]


def test_interrupted_sweep_resumes_and_finishes(sweeps: dict) -> None:
    assert sweeps["first_rc"] == 3, sweeps["first_log"][-3000:]  # interrupted, trial 1 unfinished
    assert sweeps["resume_rc"] == 0, sweeps["resume_log"][-5000:]
    assert "e2e-t001" in sweeps["first_log"].split("unfinished:")[-1]
    # Only the unfinished trial ran again: the driver's progress lines name trials as Tune's table does.
    assert "(t001) step " in sweeps["resume_log"]
    assert "(t000) step " not in sweeps["resume_log"]
    assert "gmts" in sweeps["resume_log"] and "mlflow ui --backend-store-uri" in sweeps["resume_log"]


def test_a_lost_node_restarts_the_trial_from_its_checkpoint(sweeps: dict) -> None:
    assert sweeps["killed"]["learner"], "no learner rank was found"
    attempt_starts, rows = _attempt_starts(sweeps, "e2e-t000")
    assert len(attempt_starts) == 2 and attempt_starts[0] == 1, attempt_starts
    assert attempt_starts[1] > 1 and (attempt_starts[1] - 1) % CHECKPOINT_EVERY == 0, attempt_starts
    assert rows[-1]["step"] == STEPS and rows[-1]["final"] == 1
    assert RESTARTED.format("e2e-t000") in sweeps["first_log"]
    assert sweeps["victim"] not in sweeps["alive"]


def test_killed_rollout_trial_resumed_from_its_checkpoint(sweeps: dict) -> None:
    assert sweeps["killed"]["rollout"], "no rollout process was killed"
    # Tune restarted the trial after the engine died, from the checkpoint saved last before that (the first, or a
    # later one when the 0.1 s steps outran the kill); the sweep was interrupted while that attempt started.
    restarts = [int(line.rsplit(" ", 1)[-1]) for line in sweeps["first_log"].splitlines()
                if RESTARTED.format("e2e-t001") in line]
    assert len(restarts) == 1 and restarts[0] >= CHECKPOINT_EVERY and restarts[0] % CHECKPOINT_EVERY == 0, restarts
    interrupted_at = sweeps["interrupted_at"]
    assert interrupted_at >= restarts[0]
    # Tune's record: the first attempt from step 1, every later one (an interrupted start reports nothing) right
    # after a checkpoint; the last, --resume's, after the latest saved before the sweep stopped.
    attempt_starts, rows = _attempt_starts(sweeps, "e2e-t001")
    assert attempt_starts[0] == 1 and len(attempt_starts) >= 2, attempt_starts
    assert all(start > 1 and (start - 1) % CHECKPOINT_EVERY == 0 for start in attempt_starts[1:]), attempt_starts
    last_attempt = rows[max(i for i, row in enumerate(rows) if row["iterations_since_restore"] == 1):]
    if interrupted_at < STEPS:  # the resumed attempt trains every step after that checkpoint, once
        assert [row["step"] for row in last_attempt] == [*range(interrupted_at + 1, STEPS + 1), STEPS]
    else:  # every step was trained before the sweep stopped: the resumed attempt only evaluates and reports
        assert [row["step"] for row in last_attempt] == [STEPS]
    assert rows[-1]["step"] == STEPS and rows[-1]["final"] == 1


def test_parent_and_children_in_mlflow(sweeps: dict) -> None:
    client, parent, children = _children(sweeps["tracking_uri"])
    assert parent.info.status == "FINISHED"
    params = parent.data.params
    assert params["spec_name"] == "e2e" and params["grid_size"] == "2" and len(params["spec_hash"]) == 12
    assert params["code_version"]
    assert "spec.yaml" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    # One run per trial: each fault came after a checkpoint, so each trial reopened its own run.
    assert sorted(c.data.params["method"] for c in children) == list(METHODS)
    for child in children:
        assert child.info.status == "FINISHED"
        p = child.data.params
        assert (p["ratio"], p["mode"], p["algorithm"], p["seed"], p["model_size"]) == ("0.2", "top", "grpo", "0",
                                                                                      "tiny-s")
        assert "eval/arithmetic/accuracy" in child.data.metrics


def test_each_step_once_and_the_faulted_trials_end_as_the_undisturbed_ones(sweeps: dict) -> None:
    client, _, children = _children(sweeps["tracking_uri"])
    reference_client, _, reference_children = _children(sweeps["reference_tracking_uri"])
    reference = {child.data.params["method"]: child for child in reference_children}
    for child in children:
        method = child.data.params["method"]
        for key in child.data.metrics:
            steps = [m.step for m in client.get_metric_history(child.info.run_id, key)]
            assert len(steps) == len(set(steps)), (method, key, sorted(steps))
        reward_steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "reward/mean"))
        assert reward_steps == list(range(1, STEPS + 1))
        # Across the faults too, each step trained the batch collected one step before it (its checkpoint held it).
        lag = {m.step: m.value for m in client.get_metric_history(child.info.run_id, "rollout/staleness")}
        assert lag == {1: 0.0, **{step: 1.0 for step in range(2, STEPS + 1)}}
        # Same seed, same metrics: a lost node, a killed engine, Ctrl-C and --resume change no number.
        for key in ("reward/mean", "loss/total", "policy/ratio_abs_dev", "eval/arithmetic/accuracy"):
            ours = {m.step: m.value for m in client.get_metric_history(child.info.run_id, key)}
            theirs = {m.step: m.value for m in reference_client.get_metric_history(reference[method].info.run_id, key)}
            assert ours == theirs, (method, key)


def test_report_artifacts_on_the_parent(sweeps: dict) -> None:
    client, parent, _ = _children(sweeps["tracking_uri"])
    listed = {a.path for a in client.list_artifacts(parent.info.run_id, "ablation")}
    for name in ("ablation.csv", "ablation.md", "ablation.html", "ablation.json", "accuracy_vs_ratio.png",
                 "learning_curves.png"):
        assert f"ablation/{name}" in listed
    table = json.loads((sweeps["sweep_dir"] / "report" / "ablation.json").read_text())
    # One test cell (the validation set's cell only chooses lrs), with its Δ over ETS at the same scope.
    gmts = [c for c in table["cells"] if c["method"] == "gmts" and c["metric"] == "accuracy" and c["split"] == "test"]
    assert len(gmts) == 1 and gmts[0]["delta_vs_ets"] is not None


def test_each_arm_links_what_its_model_says(sweeps: dict, tmp_path: Path) -> None:
    """Both trials were restarted (one by Tune, one by --resume): each still holds one completions table per eval
    set for step 0 and the last step, rows not doubled, and the report links the last one per arm."""
    client, parent, children = _children(sweeps["tracking_uri"])
    finished = [run for run in children if run.info.status == "FINISHED"]
    assert len(finished) == 2
    for run in finished:
        for name in ("arithmetic", "arithmetic_val"):
            files = [a.path for a in client.list_artifacts(run.info.run_id, f"completions/{name}")]
            assert files == [f"completions/{name}/step_{step:06d}.json" for step in (0, STEPS)]
            table = json.loads(Path(client.download_artifacts(run.info.run_id, files[-1], str(tmp_path))).read_text())
            rows = [dict(zip(table["columns"], row)) for row in table["data"]]
            assert [row["index"] for row in rows] == list(range(8))  # the set's 8 problems, each once
            assert sum(row["reward"] for row in rows) / 8 == pytest.approx(run.data.metrics[f"eval/{name}/accuracy"])
    markdown = (sweeps["sweep_dir"] / "report" / "ablation.md").read_text()
    links = [line for line in markdown.splitlines() if line.startswith("- ") and "/artifacts/completions/" in line]
    assert len(links) == 2 and all(f"step_{STEPS:06d}.json" in line for line in links)
    assert f"/artifacts/completions/arithmetic/step_{STEPS:06d}.json" in parent.data.tags["mlflow.note.content"]


def test_the_object_store_holds_what_resume_needs(sweeps: dict) -> None:
    """The faulted sweep's durable state is in the store (its local folder was deleted before --resume): the
    record, Tune's state with each trial's real checkpoint, the MLflow runs' artifacts."""
    keys = [key for key in object_keys(sweeps["s3_env"], BUCKET) if not key.endswith("/")]  # "/": pyarrow's folders
    sweep_id = sweeps["sweep_id"]
    assert {f"sweeps/{sweep_id}/sweep.json", f"sweeps/{sweep_id}/spec.yaml"} <= set(keys)
    tune = [key for key in keys if key.startswith(f"sweeps/ray_results/{sweep_id}/")]
    assert any(key.rsplit("/", 1)[-1].startswith("experiment_state") for key in tune)
    for trial in ("e2e-t000", "e2e-t001"):  # the last checkpoint Tune kept of each: the learner's and the loop's state
        files = {key.rsplit("/", 1)[-1] for key in tune if f"trial={trial}" in key and "/checkpoint_" in key}
        assert {"run_state.json", "mp_rank_00_model_states.pt", "base_reference.pt"} <= files, (trial, files)
    _, parent, children = _children(sweeps["tracking_uri"])
    for run in (parent, *children):
        assert run.info.artifact_uri.startswith(f"{STORAGE}/mlartifacts/"), run.info.artifact_uri
    assert any(key.startswith("sweeps/mlartifacts/") and key.endswith("/ablation/ablation.json") for key in keys)
    assert any(key.startswith("sweeps/mlartifacts/") and key.endswith(f"/completions/arithmetic/step_{STEPS:06d}.json")
               for key in keys)
