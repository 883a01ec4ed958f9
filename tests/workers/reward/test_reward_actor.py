import gc
import multiprocessing

import pytest

from workers.problem import Problem
from workers.reward.actor import RewardWorker
from workers.reward.config import RewardConfig
from workers.reward.results import RewardResult, VerifierBroken

CONFIG = RewardConfig(num_workers=1)


def _batch():
    problems = [Problem(id=f"add-{i}", prompt=f"{i}+{i}=", answer=str(2 * i), domain="arithmetic") for i in range(6)]
    completions = [str(2 * i) if i % 2 == 0 else "0" for i in range(6)]
    problems.append(Problem(id="m", prompt="What is 36 + 22?", answer="58", domain="math"))
    completions.append("36 + 22 = 58")  # math-verify inside the actor's worker process
    return completions, problems


def _verifiers() -> set:
    return {p for p in multiprocessing.active_children() if p.name == "reward-verifier"}


@pytest.mark.slow
def test_plain_class_scores_without_ray_and_its_verifiers_end_with_it():
    before = _verifiers()
    worker = RewardWorker(CONFIG)
    completions, problems = _batch()
    assert [r.score for r in worker.score(completions, problems)] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    own = _verifiers() - before
    assert len(own) == CONFIG.num_workers
    del worker  # no close(): as for a killed actor, the verifiers see EOF on their pipes and exit
    gc.collect()
    for process in own:
        process.join(timeout=10)
        assert not process.is_alive()


@pytest.mark.slow
def test_ray_actors_score_a_batch_whole_and_split(embedded_ray):
    import ray

    remote_worker = ray.remote(num_cpus=0)(RewardWorker)
    workers = [remote_worker.remote(CONFIG) for _ in range(2)]
    try:
        _score_whole_and_split(ray, workers)
    finally:  # the cluster is shared with other modules
        for worker in workers:
            ray.kill(worker)


def _score_whole_and_split(ray, workers) -> None:
    completions, problems = _batch()
    whole = ray.get(workers[0].score.remote(completions, problems))
    assert all(isinstance(result, RewardResult) for result in whole)
    assert [r.score for r in whole] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    # Split across the two actors, as the actor module's docstring shows: same results, same order.
    chunk = -(-len(completions) // len(workers))
    futures = [w.score.remote(completions[i * chunk:(i + 1) * chunk], problems[i * chunk:(i + 1) * chunk])
               for i, w in enumerate(workers)]
    assert [r for part in ray.get(futures) for r in part] == whole
    # A broken verifier stops the caller (the training loop's ray.get) with its name and first error.
    broken = [Problem(id=f"mc{i}", prompt="Pick", answer="?", domain="choice") for i in range(8)]
    with pytest.raises(VerifierBroken, match="verify_choice.*one letter"):
        ray.get(workers[0].score.remote(["A"] * 8, broken))
