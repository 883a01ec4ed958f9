import pytest
import torch

from workers.learner.losses import PolicyLossConfig, aggregate, aggregation_weights, clip_masks, kl_penalty, ppo_clip_loss


def test_aggregation_modes_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token-mean") == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-mean") == pytest.approx((6 / 3 + 4 / 1) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum") == pytest.approx((6 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm") == pytest.approx((6 / 3 + 4 / 3) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm", norm_length=10) == pytest.approx((0.6 + 0.4) / 2)


def test_fully_padded_rows_do_not_count_as_sequences():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert aggregation_weights(mask, "seq-mean-token-sum").sum() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="loss_agg"):
        aggregation_weights(mask, "mean-of-nothing")


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(torch.exp(torch.tensor(-0.5)).item() - 1 + 0.5)


def test_clip_masks_follow_the_advantage_sign():
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5, 4.0]))
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0])
    masks = clip_masks(logp, torch.zeros(5), adv, PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0))
    assert masks.clipped_high.tolist() == [True, False, False, False, False]
    assert masks.clipped_low.tolist() == [False, False, True, False, False]
    assert masks.dual_clipped.tolist() == [False, False, False, False, True]


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(4, 5, generator=g)).requires_grad_(True)
    return dict(logp=logp, old_logp=logp.detach() + 0.05 * torch.randn(4, 5, generator=g),
                advantages=torch.randn(4, 5, generator=g), response_mask=torch.ones(4, 5),
                ref_logp=logp.detach() - 0.2)


def test_apply_to_advantage_keeps_kl_on_every_token_and_the_full_denominator():
    x = _inputs()
    sel = torch.zeros(4, 5)
    sel[:, :2] = 1
    cfg = PolicyLossConfig(kl_coef=0.1)
    out = ppo_clip_loss(**x, config=cfg, pg_mask=sel)
    (grad,) = torch.autograd.grad(out.loss, x["logp"])
    kl_only = 0.1 * (1 - torch.exp(x["ref_logp"] - x["logp"].detach())) / 20  # k3' / N for every token
    torch.testing.assert_close(grad[:, 2:], kl_only[:, 2:])


def test_apply_to_loss_normalises_over_selected_tokens():
    x = _inputs(1)
    sel = torch.zeros(4, 5)
    sel[:, :2] = 1
    cfg = PolicyLossConfig()
    masked = ppo_clip_loss(**x, config=cfg, loss_mask=sel)
    sub = {k: (v[:, :2] if k != "ref_logp" else v[:, :2]) for k, v in x.items()}
    direct = ppo_clip_loss(**sub, config=cfg)
    torch.testing.assert_close(masked.loss, direct.loss)
    (grad,) = torch.autograd.grad(masked.loss, x["logp"])
    assert (grad[:, 2:] == 0).all()
