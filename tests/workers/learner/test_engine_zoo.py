"""The zoo's methods in the real learner (DeepSpeed on CPU, a tiny Qwen2): each trains, logs its diagnostics,
and a covariance population over the optimiser step does not depend on how the step is cut."""

import pytest
import torch

from tests.workers.learner.test_engine import (first_step_gradients, make_batch, make_engine, mixed_length_batch,
                                               model_dir, weights)
from workers.learner.losses import PolicyLossConfig
from workers.learner.selection import SelectionConfig

pytestmark = pytest.mark.slow
__all__ = ["model_dir"]  # the shared module fixture

ZOO = [("clip_cov", 0.1, "micro_batch"), ("kl_cov", 0.1, "micro_batch"), ("entropy_adv", None, "group"),
       ("archer", 0.2, "micro_batch"), ("archer", 0.2, "response"), ("h_abs_adv", 0.3, "group"),
       ("abs_omega", 0.3, "group")]


@pytest.mark.parametrize("method,ratio,scope", ZOO)
def test_zoo_method_trains_and_logs_its_diagnostics(model_dir, method, ratio, scope):
    loss = PolicyLossConfig(kl_coef=0.01 if method == "archer" else 0.0)
    # A random tiny model's covariances are small: a wide band, so that Clip-Cov has candidates (paper: (1, 5)).
    band = {"covariance": {"clip_lower": 0.0, "clip_upper": 100.0}} if method == "clip_cov" else {}
    selection = SelectionConfig(method=method, ratio=ratio, scope=scope, **band)
    engine = make_engine(model_dir, loss=loss, selection=selection,
                         use_reference=method == "archer", ppo_epochs=2)
    before = weights(engine)
    metrics = engine.train_step(make_batch(), step=0)
    after = weights(engine)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    for key in ("selection/zero_advantage_share", "selection/net_signed_weight", "selection/entropy_selected"):
        assert key in metrics, key
    if method in ("clip_cov", "kl_cov", "archer"):
        assert metrics["selection/treated_fraction"] > 0
    if method == "kl_cov":  # no clip: KL-Cov's surrogate is −A·r everywhere
        assert metrics["loss/clip_fraction_high"] == metrics["loss/clip_fraction_low"] == 0.0


def test_kl_cov_over_the_mini_batch_is_exact_however_the_step_is_cut(model_dir):
    batch = mixed_length_batch()
    selection = SelectionConfig(method="kl_cov", ratio=0.05, scope="mini_batch")
    results = []
    for micro in (24, 8):
        engine = make_engine(model_dir, selection=selection, mini_batch_size=24, micro_batch_size=micro, grad_clip=0.0)
        results.append(first_step_gradients(engine, engine.compute_reference_stats(batch)))
    (whole, _), (cut, _) = results
    for name, gradient in whole.items():
        torch.testing.assert_close(cut[name], gradient, atol=1e-5, rtol=1e-4, msg=name)
