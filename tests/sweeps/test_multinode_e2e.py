"""End to end on a multi-node Ray cluster: a real 2-trial sweep whose actors are spread over several nodes, and
the same sweep again with a worker node lost mid-trial.

The cluster is Ray's own multi-node test harness (``ray.cluster_utils.Cluster``): a head and worker nodes, each
its own raylet, object store and workers, all on 127.0.0.1 of this machine. Each worker node holds one CPU, so a
trial's placement group (the trial's driver 0.01 CPU + the rollout engine 0.99, then one CPU per learner rank) can
only be placed across three nodes: the rollout engine and the two learner ranks never share one, so the learner
group's rendezvous and gradient all-reduce, and the weight sync from learner rank 0 to the engine, cross nodes.

1. The sweep runs undisturbed: where every actor ran is read from Ray's actor table.
2. Its first trial (ETS) runs again as a sweep of its own; after the trial's first checkpoint the node of one of
   its learner ranks is killed (``Cluster.remove_node`` without a graceful stop: its raylet and every process on it
   die at once) and a fresh node joins. Tune restarts the trial from that checkpoint on the nodes alive, each step
   is logged once, and the trial's metrics are those of the undisturbed sweep's ETS trial, to the bit.

Both sweeps use one cluster (started once for the module); the CLI runs in a subprocess attached to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import yaml
from mlflow import MlflowClient
from ray._private import state as ray_state
from ray.cluster_utils import Cluster

from orchestrator.cluster import loopback_only
from sweeps.tracking import PARENT_TAG, SWEEP_ID_TAG
from tests.sweeps.cli_process import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
STEPS, CHECKPOINT_EVERY = 4, 2
WORKER_NODES = 3
PRESET = {
    "extends": "cpu-tiny-s",
    "warmup": {"enabled": False},  # the plumbing is under test, not learning
    "rollout": {"n_samples": 4},
    "data": {"eval": {"arithmetic": {"source": "arithmetic", "split": "test", "limit": 8},
                      "arithmetic_val": {"source": "arithmetic", "split": "validation", "limit": 8}},
             "prompts_per_step": 8},
    # Two ranks, each one CPU of its own: on two different one-CPU nodes.
    "learner": {"num_actors": 2, "mini_batch_size": 32, "micro_batch_size": 16, "threads_per_actor": 1},
    "training": {"steps": STEPS},
    "evaluation": {"interval": 0},
    "checkpoint": {"interval": CHECKPOINT_EVERY, "keep_last": 2},
    "resources": {"cpus_per_rollout_actor": 0.99},  # with the trial's driver (0.01 CPU): one node's CPU
}
SPEC = {"name": "multinode", "max_failures": 2,
        "grid": {"method": ["ets", "gmts"], "ratio": [0.2], "mode": ["top"], "seed": [0]}}
# A lost node is declared dead after about a second (Ray's default waits tens of seconds).
FAST_FAILURE_DETECTION = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                          "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster():
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
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _start_sweep(cluster: Cluster, tmp: Path, name: str, methods: list[str]) -> tuple[subprocess.Popen, Path]:
    (tmp / "preset.yaml").write_text(yaml.safe_dump(PRESET))
    spec = {**SPEC, "base": {"preset": str(tmp / "preset.yaml")}, "grid": {**SPEC["grid"], "method": methods}}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    out = tmp / name
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200")
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115 (closed with the process: the child holds it)
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", str(tmp / f"{name}.yaml"), "--output-dir", str(out),
                             "--address", cluster.address], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, out


def _actors(class_name: str, alive_only: bool = False) -> list[dict]:
    """Ray's actor table (GCS): each actor of that class with its node and state."""
    found = [a for a in ray_state.actors().values() if a["ActorClassName"].endswith(class_name)]
    return [a for a in found if a["State"] == "ALIVE"] if alive_only else found


def _finished(proc: subprocess.Popen, tmp: Path, name: str, timeout: float = 900) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp / f"{name}.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    return log


@pytest.fixture(scope="module")
def sweeps(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("multinode")
    undisturbed, out = _start_sweep(cluster, tmp, "undisturbed", SPEC["grid"]["method"])
    undisturbed_log = _finished(undisturbed, tmp, "undisturbed")
    # In start order: the trials ran one after the other, so each trial's actors are consecutive.
    placed = {role: [(a["Address"]["NodeID"], a["ActorID"])
                     for a in sorted(_actors(role), key=lambda actor: actor["StartTime"])]
              for role in ("LearnerEngine", "RolloutEngine", "RewardWorker")}

    # Its first trial again (ETS), alone: what the undisturbed sweep's ETS trial did is the reference.
    faulted, faulted_out = _start_sweep(cluster, tmp, "faulted", SPEC["grid"]["method"][:1])
    sweep_dir = wait_for(lambda: next(iter(faulted_out.glob("multinode-*/sweep.json")), None), faulted, 120,
                          "sweep.json").parent
    checkpoint = sweep_dir / "multinode-t000" / "checkpoints" / f"step_{CHECKPOINT_EVERY:06d}" / "run_state.json"
    wait_for(checkpoint.is_file, faulted, 600, "trial 0's first checkpoint")
    before = {a["ActorID"] for a in _actors("LearnerEngine")} - {actor for _, actor in placed["LearnerEngine"]}
    learners = wait_for(lambda: [a for a in _actors("LearnerEngine", alive_only=True) if a["ActorID"] in before],
                         faulted, 60, "trial 0's learner ranks")
    victim_id = learners[-1]["Address"]["NodeID"]
    victim = next(node for node in cluster.worker_nodes if node.node_id == victim_id)
    cluster.remove_node(victim, allow_graceful=False)
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")  # the capacity a restarted trial needs
    faulted_log = _finished(faulted, tmp, "faulted")
    return {"out": (out, faulted_out), "logs": (undisturbed_log, faulted_log), "placed": placed,
            "victim": victim_id, "sweep_dir": sweep_dir}


def _children(out: Path) -> dict[str, object]:
    """The sweep's child runs by method."""
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    parents = [p for p in client.search_runs(ids, f"tags.`{SWEEP_ID_TAG}` != ''") if PARENT_TAG not in p.data.tags]
    assert len(parents) == 1
    children = client.search_runs(ids, f"tags.`{PARENT_TAG}` = '{parents[0].info.run_id}'")
    return {child.data.params["method"]: (client, child) for child in children}


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


def test_a_lost_node_restarts_the_trial_from_its_checkpoint(sweeps: dict) -> None:
    tune_dir = next((sweeps["out"][1] / "ray_results").iterdir())
    rows = [json.loads(line) for line in next(tune_dir.glob("*trial=multinode-t000*/result.json")).read_text()
            .splitlines() if line.strip()]
    starts = [row["step"] for row in rows if row["iterations_since_restore"] == 1]
    assert len(starts) == 2 and starts[0] == 1, starts
    assert starts[1] > 1 and (starts[1] - 1) % CHECKPOINT_EVERY == 0, starts  # right after a checkpoint
    assert "restarted by Tune after step" in sweeps["logs"][1]
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert sweeps["victim"] not in alive


def test_each_step_is_logged_once_and_the_faulted_trial_ends_as_the_undisturbed_one(sweeps: dict) -> None:
    undisturbed, faulted = (_children(out) for out in sweeps["out"])
    assert set(undisturbed) == {"ets", "gmts"} and set(faulted) == {"ets"}
    for method, (client, child) in faulted.items():
        for key in child.data.metrics:
            steps = [m.step for m in client.get_metric_history(child.info.run_id, key)]
            assert len(steps) == len(set(steps)), (method, key, sorted(steps))
        assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "reward/mean")) == \
            list(range(1, STEPS + 1))
        reference_client, reference = undisturbed[method]
        for key in ("reward/mean", "loss/total", "eval/arithmetic/accuracy"):
            ours = [(m.step, m.value) for m in client.get_metric_history(child.info.run_id, key)]
            theirs = [(m.step, m.value) for m in reference_client.get_metric_history(reference.info.run_id, key)]
            assert sorted(ours) == sorted(theirs), (method, key)
