"""LearnerEngine on a tiny Qwen2 with real DeepSpeed (one process, gloo)."""

import itertools
import socket

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2ForCausalLM

from tests.workers.learner.tiny_learner import VOCAB, make_batch, write_model
from workers.learner.batch import TrainBatch
from workers.learner.config import LearnerConfig
from workers.learner.engine import LearnerEngine, init_process_group
from workers.learner.losses import PolicyLossConfig
from workers.learner.selection import SelectionConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        init_process_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=port)
    return write_model(tmp_path_factory.mktemp("tiny_qwen2"), seed=0)


def make_engine(model_dir, loss=None, selection=None, use_reference=False, **learner) -> LearnerEngine:
    learner = {"lr": 1e-2, "mini_batch_size": 8, "micro_batch_size": 4} | learner
    return LearnerEngine(model_dir, LearnerConfig(**learner), loss or PolicyLossConfig(),
                         selection or SelectionConfig(method="ets", ratio=0.5), temperature=1.0,
                         use_reference=use_reference)


def weights(engine: LearnerEngine) -> dict[str, torch.Tensor]:
    return engine.state_dict_for_inference()


@pytest.mark.parametrize("zero_stage,bf16", [(0, False), (3, False), (0, True)])
def test_train_step_changes_weights_and_lowers_the_loss_on_a_fixed_batch(model_dir, zero_stage, bf16):
    # One mini-batch per step: each step's loss/total is the loss at the weights before its update.
    # Every token selected: a fixed objective (a selection would change with the entropy each step).
    engine = make_engine(model_dir, zero_stage=zero_stage, bf16=bf16, lr=1e-3, mini_batch_size=16,
                         loss=PolicyLossConfig(clip_low=0.5, clip_high=0.5), selection=SelectionConfig())
    batch = engine.compute_reference_stats(make_batch())  # π_old stays fixed: the surrogate can go down
    before = weights(engine)
    assert set(before) == {name for name, _ in Qwen2ForCausalLM.from_pretrained(model_dir).named_parameters()}
    losses = [engine.train_step(batch, step=s)["loss/total"] for s in range(5)]
    after = weights(engine)
    assert all(not torch.equal(before[name], after[name]) for name in before)
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses


def test_zero_stages_and_gradient_checkpointing_take_the_same_step(model_dir):
    batch = make_batch()
    results = []
    for options in ({"zero_stage": 0}, {"zero_stage": 3}, {"zero_stage": 0, "gradient_checkpointing": True}):
        engine = make_engine(model_dir, ppo_epochs=2, **options)
        prepared = engine.compute_reference_stats(batch)
        activations = []  # an MLP activation inside a layer: it runs again in backward when checkpointed
        engine.model.get_decoder().layers[0].mlp.act_fn.register_forward_hook(lambda *_, seen=activations: seen.append(1))
        metrics = engine.train_step(prepared, step=0)
        forwards = 2 * 2 * 2  # epochs × mini-batches × micro-batches
        assert len(activations) == forwards * (2 if options.get("gradient_checkpointing") else 1)
        results.append((metrics, weights(engine)))
    (m0, w0) = results[0]
    for metrics, state in results[1:]:
        assert metrics["optim/grad_norm"] == pytest.approx(m0["optim/grad_norm"], rel=1e-4)
        assert metrics["loss/total"] == pytest.approx(m0["loss/total"], rel=1e-4, abs=1e-6)
        for name in w0:
            # Adam's first steps are ≈ lr·sign(g): float noise can flip a near-zero gradient's sign
            torch.testing.assert_close(state[name], w0[name], atol=1e-4, rtol=0)


def test_logprobs_match_a_plain_full_forward(model_dir):
    """The response-positions-only forward reads the same log π as HF's full logits, shifted by one."""
    engine = make_engine(model_dir, loss=PolicyLossConfig(kl_coef=0.1), use_reference=True)
    batch = make_batch(groups=2)
    prepared = engine.compute_reference_stats(batch)
    reference = Qwen2ForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        full = torch.log_softmax(reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, -1)
    expected = torch.zeros_like(batch.response_mask)
    for b in range(batch.batch_size):
        start = int(batch.prompt_lengths[b])
        for j in range(int(batch.response_mask[b].sum())):
            expected[b, j] = full[b, start - 1 + j, batch.input_ids[b, start + j]]
    torch.testing.assert_close(prepared.old_logp, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(prepared.ref_logp, expected, atol=1e-5, rtol=0)


def test_one_forward_per_micro_batch_and_lm_head_only_at_response_tokens(model_dir):
    engine = make_engine(model_dir, ppo_epochs=2, selection=SelectionConfig(method="gmts_exact", ratio=0.3),
                         gradient_norm_stats=True)
    batch = engine.compute_reference_stats(make_batch())  # 16 sequences: 2 mini-batches × 2 micro-batches
    decoder_calls, head_rows = [], []
    hooks = [
        engine.model.get_decoder().register_forward_hook(lambda module, args, kwargs, out: decoder_calls.append(1),
                                                         with_kwargs=True),
        engine.model.get_output_embeddings().register_forward_hook(
            lambda module, args, out: head_rows.append(args[0].shape[0])),
    ]
    try:
        metrics = engine.train_step(batch, step=0)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(decoder_calls) == 2 * 2 * 2  # epochs × mini-batches × micro-batches
    assert sum(head_rows) == 2 * int(batch.response_mask.sum())  # every response token, once per epoch
    assert metrics["optim/steps"] == 4
    assert 0 < metrics["selection/selected_fraction"] <= 0.5
    assert -1 <= metrics["selection/spearman_entropy_gradnorm"] <= 1


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_token_statistics_carry_omega_and_the_group_of_each_answer(model_dir, loss_agg):
    """On-policy, without KL, ω_t = w_t·A_i: A/N for token-mean, A/(|o_i|·B) for seq-mean-token-mean."""
    engine = make_engine(model_dir, loss=PolicyLossConfig(loss_agg=loss_agg))
    batch = make_batch(groups=3)
    answers = engine.token_statistics(batch)
    lengths = batch.response_mask.sum(-1).tolist()
    assert [len(a["entropy"]) for a in answers] == [len(a["grad_norm"]) for a in answers] == lengths
    assert [a["group"] for a in answers] == batch.group_ids.tolist()
    total = sum(lengths)
    for answer, advantage, length in zip(answers, batch.advantages.tolist(), lengths, strict=True):
        weight = 1 / total if loss_agg == "token-mean" else 1 / (length * batch.batch_size)
        assert answer["omega"] == pytest.approx([advantage * weight] * int(length), rel=1e-5)
        assert all(h > 0 for h in answer["entropy"]) and all(0 < g < 2 ** 0.5 for g in answer["grad_norm"])


def test_on_policy_batch_needs_no_old_logp_and_several_mini_batches_compute_their_own(model_dir):
    sampled = make_batch()
    engine = make_engine(model_dir, mini_batch_size=16)
    metrics = engine.train_step(sampled, step=0)  # one epoch, one mini-batch: π_old = π, no extra pass
    assert metrics["policy/approx_kl_old"] == 0.0
    assert metrics["loss/clip_fraction_high"] == 0.0
    assert "rollout/logprob_diff" not in metrics
    # Two mini-batches: train_step scores π_old itself before the first update, and compares it with
    # the sampling logprobs the batch carries (here the learner's own, shifted by 0.1 on every token).
    engine = make_engine(model_dir, mini_batch_size=8)
    own = engine.compute_reference_stats(sampled).old_logp
    sampled = sampled.replace(sampling_logp=own + 0.1 * sampled.response_mask)
    metrics = engine.train_step(sampled, step=0)
    assert metrics["optim/steps"] == 2
    assert metrics["rollout/logprob_diff"] == pytest.approx(0.1, abs=1e-5)


def test_old_logp_from_the_rollout_replaces_the_learners_own_pass(model_dir):
    """learner.old_logp_source='rollout': the sampling logprobs are π_old (no no-grad pass); with the learner's
    own π as sampling logprobs the update is the default one bit for bit, shifted ones change it, and the
    agreement is read off the first mini-batch's forwards."""
    sampled = make_batch()
    own = make_engine(model_dir, mini_batch_size=8).compute_reference_stats(sampled).old_logp
    updates = {}
    for source, shift in (("learner", 0.0), ("rollout", 0.0), ("rollout", 0.1)):
        engine = make_engine(model_dir, mini_batch_size=8, old_logp_source=source)
        if source == "rollout":
            engine.compute_reference_stats = lambda *args, **kwargs: pytest.fail("π_old pass ran")
        batch = sampled.replace(sampling_logp=own + shift * sampled.response_mask)
        metrics = engine.train_step(batch, step=0)
        assert metrics["optim/steps"] == 2
        assert metrics["rollout/logprob_diff"] == pytest.approx(shift, abs=1e-5)
        updates[(source, shift)] = weights(engine)
    same = updates[("learner", 0.0)]
    assert all(torch.equal(same[name], updates[("rollout", 0.0)][name]) for name in same)
    assert not all(torch.equal(same[name], updates[("rollout", 0.1)][name]) for name in same)
    with pytest.raises(ValueError, match="no rollout logprobs"):
        make_engine(model_dir, mini_batch_size=8, old_logp_source="rollout").train_step(sampled, step=0)


def test_a_stale_batch_takes_pi_old_from_its_sampler_even_in_one_mini_batch(model_dir):
    """rollout.max_staleness: a batch sampled by older weights has the engine's logprobs as π_old even where an
    on-policy batch would take π_old = π at the first forward (one epoch, one mini-batch): the ratio then measures
    the lag (policy/ratio_abs_dev), clips where it leaves the trust region, and GMTS's H·|ω| ranks apart from
    H·|A| — exactly as on-policy otherwise."""
    sampled = make_batch()
    own = make_engine(model_dir, mini_batch_size=16).compute_reference_stats(sampled).old_logp
    lagging = sampled.replace(sampling_logp=own - 0.5 * sampled.response_mask * torch.rand(own.shape,
                              generator=torch.Generator().manual_seed(0)))
    metrics, updates = {}, {}
    for name, batch in (("on-policy", lagging), ("stale", lagging.replace(staleness=torch.ones(16, dtype=torch.long))),
                        ("stale, own logprobs", sampled.replace(sampling_logp=own,
                                                                staleness=torch.ones(16, dtype=torch.long)))):
        engine = make_engine(model_dir, mini_batch_size=16, old_logp_source="rollout")
        engine.compute_reference_stats = lambda *args, **kwargs: pytest.fail("π_old pass ran")
        metrics[name] = engine.train_step(batch, step=0)
        updates[name] = weights(engine)
    assert metrics["on-policy"]["policy/ratio_abs_dev"] == 0.0 and metrics["on-policy"]["loss/clip_fraction_high"] == 0
    assert metrics["on-policy"]["selection/gmts_vs_h_abs_a_spearman"] == pytest.approx(1.0)
    assert metrics["on-policy"]["selection/gmts_vs_h_abs_a_overlap"] == 1.0
    stale = metrics["stale"]
    assert stale["policy/ratio_abs_dev"] > 0.1 and stale["loss/clip_fraction_high"] > 0.05
    assert stale["selection/gmts_vs_h_abs_a_spearman"] < 0.99 and stale["selection/gmts_vs_h_abs_a_overlap"] < 1.0
    assert "rollout/logprob_diff" not in stale  # the gap is the lag here, not the engines' numeric agreement
    assert not all(torch.equal(updates["on-policy"][k], updates["stale"][k]) for k in updates["stale"])
    # A stale batch whose recorded sampler is the learner's own π shows no lag.
    assert metrics["stale, own logprobs"]["policy/ratio_abs_dev"] < 1e-5
    with pytest.raises(ValueError, match="old_logp_source='rollout'"):
        make_engine(model_dir, mini_batch_size=16).train_step(lagging.replace(staleness=torch.ones(16, dtype=torch.long)),
                                                              step=0)


def test_apply_to_advantage_and_loss_give_different_updates(model_dir):
    batch = make_batch()
    results = {}
    for apply_to in ("advantage", "loss"):
        engine = make_engine(model_dir, loss=PolicyLossConfig(loss_agg="seq-mean-token-mean"),
                             selection=SelectionConfig(method="ets", ratio=0.3, apply_to=apply_to))
        prepared = engine.compute_reference_stats(batch)
        metrics = [engine.train_step(prepared, step=s) for s in range(2)]
        results[apply_to] = (metrics, weights(engine))
    (m_adv, w_adv), (m_loss, w_loss) = results["advantage"], results["loss"]
    # Same tokens selected, but 'loss' averages each answer over its selected tokens only.
    assert abs(m_loss[0]["loss/pg"] - m_adv[0]["loss/pg"]) > 1e-3
    assert m_adv[0]["selection/selected_fraction"] == m_loss[0]["selection/selected_fraction"]
    assert max((w_adv[n] - w_loss[n]).abs().max() for n in w_adv) > 1e-4


def test_kl_needs_a_reference(model_dir):
    with pytest.raises(ValueError, match="use_reference"):
        make_engine(model_dir, loss=PolicyLossConfig(kl_coef=0.1))


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_checkpoint_round_trip_resumes_exactly(model_dir, tmp_path, zero_stage):
    batch = make_batch()
    engine = make_engine(model_dir, zero_stage=zero_stage)
    prepared = engine.compute_reference_stats(batch)
    engine.train_step(prepared, step=0)
    saved = weights(engine)
    engine.save_checkpoint(tmp_path / "ckpt", client_state={"step": 1, "note": "after step 0"})
    first = engine.train_step(prepared, step=1)
    continued = weights(engine)

    fresh = make_engine(model_dir, zero_stage=zero_stage)  # a new process would start like this
    assert fresh.load_checkpoint(tmp_path / "ckpt") == {"step": 1, "note": "after step 0"}
    for name, tensor in weights(fresh).items():
        assert torch.equal(tensor, saved[name]), name
    second = fresh.train_step(prepared, step=1)  # Adam moments restored ⇒ the same update
    for name, tensor in weights(fresh).items():
        assert torch.equal(tensor, continued[name]), name
    assert second["loss/total"] == first["loss/total"]
    with pytest.raises(FileNotFoundError):
        fresh.load_checkpoint(tmp_path / "nothing_here")


def test_lr_warmup_ramps_per_optimiser_step_and_resumes_from_a_checkpoint(model_dir, tmp_path):
    engine = make_engine(model_dir, lr=1e-2, lr_warmup_steps=4)  # 16 sequences, mini 8: 2 optimiser steps a call
    prepared = engine.compute_reference_stats(make_batch())
    lr_now = lambda e: e.optimizer.param_groups[0]["lr"]
    seen = [lr_now(engine)]
    engine.train_step(prepared, step=0)
    seen.append(lr_now(engine))
    engine.save_checkpoint(tmp_path / "ckpt")
    engine.train_step(prepared, step=1)
    seen.append(lr_now(engine))
    assert seen == pytest.approx([1e-2 / 4, 3e-2 / 4, 1e-2])  # (k + 1) / 4 at optimiser step k, then flat
    fresh = make_engine(model_dir, lr=1e-2, lr_warmup_steps=4)
    fresh.load_checkpoint(tmp_path / "ckpt")
    assert lr_now(fresh) == pytest.approx(3e-2 / 4)  # the schedule continues where it stopped
    fresh.train_step(prepared, step=1)
    assert lr_now(fresh) == pytest.approx(1e-2)


def mixed_length_batch(seed=0) -> TrainBatch:
    """Six groups of 4; long (≈20-token) and short (≈3-token) responses in alternate groups."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, group_ids = [], [], []
    for group, length in enumerate((20, 3, 22, 2, 19, 3)):
        prompt = torch.randint(1, VOCAB, (3,), generator=g).tolist()
        for row in range(4):
            prompts.append(prompt)
            responses.append(torch.randint(1, VOCAB, (length + row % 3,), generator=g).tolist())
            group_ids.append(group)
    return TrainBatch.from_lists(prompts, responses, torch.randn(len(prompts), generator=g), group_ids, pad_id=0)


def first_step_gradients(engine: LearnerEngine, batch: TrainBatch) -> tuple[dict[str, torch.Tensor], dict]:
    """The accumulated gradient at the first optimiser step of ``train_step`` (before it is applied)."""
    captured: dict[str, torch.Tensor] = {}
    step = engine.engine.step

    def capturing_step():
        if engine.engine.is_gradient_accumulation_boundary() and not captured:
            captured.update({n: p.grad.detach().clone() for n, p in engine.model.named_parameters()})
        step()

    engine.engine.step = capturing_step
    metrics = engine.train_step(batch, step=0)
    return captured, metrics


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_token_budget_micro_batches_give_the_same_gradient_with_less_padding(model_dir, loss_agg):
    """Dynamic batch size changes how the mini-batch is cut, not the loss: the gradient is the same."""
    batch = mixed_length_batch()
    loss = PolicyLossConfig(loss_agg=loss_agg, kl_coef=0.0)
    selection = SelectionConfig(method="gmts", ratio=0.5)  # scope='group': groups stay whole either way
    results = []
    for options in ({"micro_batch_size": 8}, {"micro_batch_size": 8, "max_tokens_per_micro_batch": 8 * 26}):
        engine = make_engine(model_dir, loss=loss, selection=selection, mini_batch_size=24, grad_clip=0.0,
                             **options)
        results.append(first_step_gradients(engine, batch))
    (fixed, fixed_metrics), (packed, packed_metrics) = results
    for name, gradient in fixed.items():
        torch.testing.assert_close(packed[name], gradient, atol=1e-5, rtol=1e-5, msg=name)
    assert packed_metrics["loss/pg"] == pytest.approx(fixed_metrics["loss/pg"], rel=1e-4, abs=1e-6)
    assert packed_metrics["learner/padding_fraction"] < fixed_metrics["learner/padding_fraction"] - 0.15
    assert (fixed_metrics["learner/micro_batches"], packed_metrics["learner/micro_batches"]) == (3, 3)


@pytest.mark.parametrize("recipe", ["ets-release", "gmts-paper"])
def test_mini_batch_scope_is_exact_however_the_step_is_cut(model_dir, recipe):
    """scope mini_batch/global ranks every token of the optimiser step: cutting the mini-batch into three
    micro-batches (one no-grad scoring pass first) gives the gradient of one micro-batch of all of it
    (no scoring pass), including gmts-paper's selected-token denominator (apply_to='loss') with KL on."""
    batch = mixed_length_batch()
    loss = PolicyLossConfig(loss_agg="token-mean", kl_coef=0.05)
    selection = SelectionConfig(recipe=recipe, ratio=0.3)
    results, forwards = [], []
    for micro in (24, 8):
        engine = make_engine(model_dir, loss=loss, selection=selection, mini_batch_size=24, micro_batch_size=micro,
                             grad_clip=0.0, use_reference=True)
        prepared = engine.compute_reference_stats(batch)
        calls = []
        hook = engine.model.get_decoder().register_forward_hook(lambda *a: calls.append(1))
        try:
            results.append(first_step_gradients(engine, prepared))
        finally:
            hook.remove()
        forwards.append(len(calls))
    (whole, whole_metrics), (cut, cut_metrics) = results
    for name, gradient in whole.items():
        torch.testing.assert_close(cut[name], gradient, atol=1e-5, rtol=1e-4, msg=name)
    assert forwards == [1, 3 + 3]  # one micro-batch: no scoring pass; three: one scoring forward each
    assert cut_metrics["loss/total"] == pytest.approx(whole_metrics["loss/total"], rel=1e-4)
    assert "time/selection_scoring_s" in cut_metrics and "time/selection_scoring_s" not in whole_metrics
