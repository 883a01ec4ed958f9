"""The intervals of the tables against hand calculations (t quantiles from a printed t table)."""

import pytest

from sweeps.statistics import paired_comparisons, paired_difference, t_interval


def test_t_interval_of_five_seeds_matches_the_hand_calculation() -> None:
    # mean 0.6; s² = (0.01 + 0.0025 + 0 + 0.0025 + 0.01) / 4 = 0.00625; t(0.975, 4) = 2.7764
    estimate = t_interval([0.50, 0.55, 0.60, 0.65, 0.70])
    half = 2.7764 * 0.00625**0.5 / 5**0.5  # = 0.09816
    assert estimate.mean == pytest.approx(0.6, abs=1e-12) and estimate.n == 5
    assert estimate.std == pytest.approx(0.0790569, abs=1e-7)
    assert (estimate.low, estimate.high) == (pytest.approx(0.6 - half, abs=1e-5), pytest.approx(0.6 + half, abs=1e-5))


def test_one_seed_has_no_interval() -> None:
    estimate = t_interval([0.4])
    assert (estimate.mean, estimate.n, estimate.std, estimate.low, estimate.high) == (0.4, 1, None, None, None)
    with pytest.raises(ValueError, match="no values"):
        t_interval([])


def test_paired_difference_uses_the_seeds_both_arms_have() -> None:
    # seeds 0–2 in both: differences 0.05, 0.10, 0.05; seed 3 of b has no partner.
    # mean 0.0667, s = 0.02887, t(0.975, 2) = 4.3027 → half-width 4.3027 · 0.02887 / √3 = 0.07171
    difference = paired_difference({0: 0.50, 1: 0.60, 2: 0.70}, {0: 0.45, 1: 0.50, 2: 0.65, 3: 0.90})
    assert difference.n == 3 and difference.mean == pytest.approx(0.2 / 3, abs=1e-12)
    assert difference.high - difference.mean == pytest.approx(0.07171, abs=1e-5)
    assert paired_difference({0: 0.5}, {1: 0.4}) is None


def test_paired_comparisons_skip_arms_that_did_not_run_or_share_no_seed() -> None:
    by_arm = {"gmts": {0: 0.30, 1: 0.32, 2: 0.31}, "ets": {0: 0.28, 1: 0.29}, "none": {5: 0.1}}
    pairs = paired_comparisons(by_arm, [("gmts", "ets"), ("gmts", "random"), ("gmts", "none")])
    assert [(p.a, p.b) for p in pairs] == [("gmts", "ets")]
    assert pairs[0].per_seed == pytest.approx({0: 0.02, 1: 0.03}) and pairs[0].difference.n == 2
