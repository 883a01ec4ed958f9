"""Is the base policy on a plateau? Test accuracy of each tiny preset's warm-up at 90, 95, 100, 105 and 110 % of
its steps.

Every absolute number of a toy table moves with the base it starts from. A warm-up that sits on a learning
transition turns a thread count's worth of floating-point difference into ten points of base accuracy (the old
600-step base did). The preset's warm-up must be converged: its test accuracy (as the preset evaluates) should change by
≤ 2 points when the warm-up is up to 10 % shorter or longer. The ±5 % points are there because ±10 % alone
can miss a base that jumps between them (cpu-tiny-s's lr-1e-3 warm-up did: benchmarks/RESULTS.md, base_sensitivity). Each warm-up is the one a run would train
(``orchestrator.base_policy.prepare_policy``, cached and checksummed). It is scored with HF ``generate`` on the preset's
test split, with the task's own verifier, the way the preset evaluates: greedily, or (``evaluation.greedy: false``)
avg@k over k samples at the rollout temperature, seeded. A run's step-0 vLLM evaluation reports the same base under
``base/accuracy`` (sampled: the same expectation, other random draws).

``--smoke`` scores a 50-step warm-up of ``cpu-tiny-s`` on 50 problems: the same path (warm-up, cache, scoring) at a
size that proves it runs, not the preset's base (which would cost a full warm-up in every fresh test cache).
"""

from __future__ import annotations

from benchmarks.report import BenchmarkResult, Figure

PRESETS = ("cpu-tiny-s", "cpu-tiny-m", "cpu-tiny-worked", "cpu-tiny-m-worked")
FACTORS = (0.9, 0.95, 1.0, 1.05, 1.1)
TOLERANCE_POINTS = 2.0
TEST_SET = "arithmetic"
SHOWN_ANSWERS = 4


def run(smoke: bool) -> dict:
    presets = PRESETS[:1] if smoke else PRESETS
    factors = (1.0,) if smoke else FACTORS
    limit = 50 if smoke else None
    overrides = ("warmup.steps=50",) if smoke else ()
    figures: list[Figure] = []
    measurements: dict[str, dict] = {}
    for preset in presets:
        scores = {factor: _score(preset, factor, limit, overrides) for factor in factors}
        measurements[preset] = {str(factor): score for factor, score in scores.items()}
        for factor, score in scores.items():
            figures.append(Figure(f"{preset}: test accuracy, warm-up {score['steps']} steps ({factor:.0%})",
                                  round(100 * score["accuracy"], 2), "%",
                                  f"{score['correct']}/{score['problems'] * score['samples']}; "
                                  f"sha256 {score['checksum'][:16]}; {score['mixed_problems']} problems whose "
                                  f"{score['samples']} samples disagree"))
        verdict = plateau_verdict({factor: 100 * score["accuracy"] for factor, score in scores.items()})
        if verdict["plateau"] is not None:
            figures.append(Figure(f"{preset}: largest change within ±10 % warm-up steps",
                                  verdict["largest_difference_points"], "points",
                                  f"plateau (≤ {TOLERANCE_POINTS:g} points): {verdict['plateau']}"))
    return BenchmarkResult(
        title="base policy: test accuracy (as each preset evaluates) of each tiny preset's warm-up at 90–110 % of its steps",
        settings={"presets": list(presets), "factors": list(factors), "test_set": TEST_SET, "limit": limit,
                  "overrides": list(overrides),
                  "tolerance_points": TOLERANCE_POINTS, "decoding": "HF generate, the preset's evaluation (greedy, or avg@k at the "
                  "rollout temperature) and max_new_tokens"},
        figures=figures, measurements=measurements,
    ).as_dict()


def _score(preset: str, factor: float, limit: int | None, overrides: tuple[str, ...] = ()) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from orchestrator.base_policy import base_checksum, prepare_policy
    from orchestrator.config_loader import load_experiment
    from orchestrator.data import load_dataset, prompt_token_ids
    from workers.models.char_tokenizer import load_tokenizer
    from workers.reward.arithmetic_verifier import verify_arithmetic

    config = load_experiment(preset, list(overrides))
    steps = round(config.warmup.steps * factor)
    config = load_experiment(preset, [*overrides, f"warmup.steps={steps}"])
    policy = prepare_policy(config)
    tokenizer = load_tokenizer(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    spec = config.data.eval[TEST_SET]
    problems = load_dataset(spec if limit is None else spec.model_copy(update={"limit": limit}))
    samples = 1 if config.evaluation.greedy else config.evaluation.k
    decoding = {"do_sample": False} if config.evaluation.greedy else {
        "do_sample": True, "temperature": config.rollout.temperature, "top_k": 0, "top_p": 1.0,
        "num_return_sequences": samples}
    torch.manual_seed(config.evaluation.seed)
    correct = 0
    # Problems whose samples disagree: where a GRPO group of this base gets a non-zero advantage. A base can score
    # 90 % with every problem all-right or all-wrong, and then RL from it learns nothing.
    mixed = 0
    shown: dict[int, dict] = {}  # the first test problems' sampled answers: what the accuracy counts
    with torch.inference_mode():
        for start in range(0, len(problems), 256):
            chunk = problems[start:start + 256]
            # Prompts of one length at a time: no padding, so nothing about the batch changes a prompt's logits.
            by_length: dict[int, list] = {}
            for index, problem in enumerate(chunk, start):
                ids = prompt_token_ids(problem, tokenizer, config.data.prompt_template)
                by_length.setdefault(len(ids), []).append((ids, index, problem))
            for items in by_length.values():
                inputs = torch.tensor([ids for ids, _, _ in items])
                out = model.generate(inputs, attention_mask=torch.ones_like(inputs),
                                     max_new_tokens=config.rollout.max_new_tokens, pad_token_id=tokenizer.eos_token_id,
                                     **decoding)
                rows = out[:, inputs.shape[1]:].reshape(len(items), samples, -1)
                for answers, (_, index, problem) in zip(rows, items):
                    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in answers]
                    rewards = [verify_arithmetic(text, problem) for text in texts]
                    correct += sum(reward == 1.0 for reward in rewards)
                    mixed += samples_disagree(rewards)
                    if index < SHOWN_ANSWERS:
                        shown[index] = {"id": problem.id, "prompt": problem.prompt, "answers": texts,
                                        "rewards": rewards}
    return {"steps": steps, "problems": len(problems), "samples": samples, "correct": int(correct),
            "accuracy": correct / (samples * len(problems)), "mixed_problems": int(mixed),
            "checksum": base_checksum(policy),
            "answers": [shown[index] for index in sorted(shown)]}


def samples_disagree(rewards: list[float]) -> bool:
    """Some of a problem's samples are paid and some are not (a GRPO group of them has a non-zero advantage)."""
    return 0 < sum(reward == 1.0 for reward in rewards) < len(rewards)


def plateau_verdict(accuracies: dict[float, float]) -> dict:
    """Whether test accuracy (in %) stays within ``TOLERANCE_POINTS`` of the preset's own warm-up (factor 1.0) at the
    other factors. One score has no spread to judge, and without 1.0 there is nothing to measure the change from, so
    both give ``plateau: None`` with the reason instead of a verdict the data cannot support."""
    if 1.0 not in accuracies or len(accuracies) < 2:
        return {"largest_difference_points": None, "plateau": None,
                "reason": "a plateau needs the preset's own warm-up (factor 1.0) and at least one other factor"}
    own = accuracies[1.0]
    spread = max(abs(accuracy - own) for accuracy in accuracies.values())
    return {"largest_difference_points": round(spread, 2), "plateau": spread <= TOLERANCE_POINTS}


def main(argv: list[str] | None = None) -> int:
    """One preset's warm-up at the given factors of its steps, each scored as ``run`` scores it, one JSON line each
    (the first test problems' sampled answers with their rewards included), then the plateau verdict over them."""
    import argparse
    import contextlib
    import json
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.base_sensitivity",
        description="Score one preset's warm-up at some factors of its steps (a plateau check), or probe another "
                    "warm-up with --set (e.g. --set warmup.examples=850), as the preset evaluates.")
    parser.add_argument("--preset", required=True, help="a preset name or YAML file")
    parser.add_argument("--factors", type=float, nargs="+", default=list(FACTORS), metavar="F",
                        help="factors of the preset's warm-up steps (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as the CLI's --set (repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N test problems")
    args = parser.parse_args(argv)
    if any(factor <= 0 for factor in args.factors):
        parser.error("--factors: each factor must be > 0")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit: must be ≥ 1")
    scores = {}
    for factor in args.factors:
        # stdout carries only the JSON lines: what the warm-up imports (DeepSpeed's logger) writes there goes to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            scores[factor] = _score(args.preset, factor, args.limit, tuple(args.overrides))
        print(json.dumps({"preset": args.preset, "overrides": args.overrides, "factor": factor, **scores[factor]}),
              flush=True)
    verdict = plateau_verdict({factor: 100 * score["accuracy"] for factor, score in scores.items()})
    print(json.dumps({"preset": args.preset, "overrides": args.overrides, **verdict}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
