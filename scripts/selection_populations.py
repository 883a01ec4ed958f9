"""One real batch on the cpu-tiny-s base policy: what each ETS population keeps, and why ETS and GMTS differ.

    PYTHONPATH=. .venv/bin/python scripts/selection_populations.py [--prompts 128] [--seed 0]

Samples the preset's RL step (``data.prompts_per_step`` prompts × ``rollout.n_samples``, temperature 1,
HF ``generate``) from the base policy (the supervised warm-up, cached under the model cache dir), scores it
with the arithmetic verifier, takes GRPO advantages, and runs one forward for the token entropies. Then it
selects ρ = 0.2 with: ETS per prompt group (the old default, no public convention), ``ets-release``
(the mini-batch: the preset's ``learner.mini_batch_size`` sequences), ``gmts-release``; and prints the
kept tokens per prompt and the selection diagnostics (workers/learner/diagnostics.py) side by side.
On-policy (π_old = π at the base), so ω = A (token-mean) or A/|o| (seq-mean-token-mean).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from orchestrator.base_policy import prepare_policy
from orchestrator.config_loader import load_experiment
from orchestrator.data import load_dataset, prompt_token_ids
from orchestrator.advantages import compute_advantages
from workers.learner.batch import TrainBatch
from workers.learner.diagnostics import selection_diagnostics
from workers.learner.schedule import stack_rows
from workers.learner.selection import SelectionConfig, select_tokens
from workers.learner.token_stats import token_stats_from_logits
from workers.reward.arithmetic_verifier import verify_arithmetic

KEYS = ("selection/selected_fraction", "selection/zero_advantage_share", "selection/net_signed_weight",
        "selection/mean_abs_advantage", "selection/entropy_selected", "selection/entropy_all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=None, help="default: the preset's prompts_per_step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = load_experiment("cpu-tiny-s")
    prompts, samples = args.prompts or config.data.prompts_per_step, config.rollout.n_samples
    policy_dir = prepare_policy(config)
    print(f"base policy: {policy_dir} (warm-up {config.warmup.model_dump()})")
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    problems = load_dataset(config.data.train.model_copy(update={"limit": prompts}))

    torch.manual_seed(args.seed)
    prompt_ids, response_ids, rewards, group_ids = _sample(config, model, tokenizer, problems, samples)
    rewards_t, groups_t = torch.tensor(rewards), torch.tensor(group_ids)
    advantages = compute_advantages(config.algorithm.advantage_estimator, rewards_t, groups_t)
    batch = TrainBatch.from_lists(prompt_ids, response_ids, advantages, group_ids, pad_id=tokenizer.pad_token_id or 0)
    index = batch.response_index()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[index.rows, index.positions]
    stats = token_stats_from_logits(logits[None], index.tokens[None], config.rollout.temperature)
    layout = lambda flat: torch.zeros(batch.response_mask.shape).index_put((index.rows, index.cols), flat[0])
    entropy, logp = layout(stats.entropy), layout(stats.logp)
    mask = batch.response_mask
    print(f"batch: {prompts} prompts × {samples} samples, {int(mask.sum())} response tokens; "
          f"train accuracy {rewards_t.mean():.3f}; groups with all rewards equal: "
          f"{sum(len(set(rewards_t[groups_t == g].tolist())) == 1 for g in range(prompts))} of {prompts}")
    loss = config.algorithm.loss
    common = dict(entropy=entropy, logp=logp, old_logp=logp, ref_logp=logp, loss_config=loss)

    def select(config_: SelectionConfig, rows: torch.Tensor):
        return select_tokens(response_mask=mask[rows], advantages=advantages[rows], group_ids=groups_t[rows],
                             config=config_, **{k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in common.items()})

    everything = torch.arange(batch.batch_size)
    minis = everything.split(config.learner.mini_batch_size)  # consecutive whole groups, as TrainBatch.split packs them
    settings = {
        "ets @ group (old default)": SelectionConfig(method="ets", ratio=0.2, scope="group"),
        "ets-release (mini-batch)": SelectionConfig(recipe="ets-release", ratio=0.2),
        "gmts-release (group)": SelectionConfig(recipe="gmts-release", ratio=0.2),
    }
    masks, diagnostics = {}, {}
    for name, selection_config in settings.items():
        pieces = [select(selection_config, rows) for rows in minis]  # per mini-batch population
        chosen = stack_rows([p.mask for p in pieces])
        masks[name] = chosen
        per_mini = [selection_diagnostics(p, mask[rows].bool(), entropy[rows], advantages=advantages[rows],
                                          loss_agg=loss.loss_agg, apply_to=selection_config.apply_to)
                    for p, rows in zip(pieces, minis)]
        diagnostics[name] = {key: statistics.fmean(d[key] for d in per_mini if key in d) for key in
                             sorted({k for d in per_mini for k in d})}

    _print_comparison(masks, diagnostics, mask, entropy, groups_t, prompts)


def _sample(config, model, tokenizer, problems, samples: int) -> tuple[list, list, list, list]:
    """``samples`` answers per problem from the base policy (HF generate, the preset's temperature), scored."""
    prompt_ids, response_ids, rewards, group_ids = [], [], [], []
    with torch.no_grad():
        for group, problem in enumerate(problems):
            ids = prompt_token_ids(problem, tokenizer, config.data.prompt_template)
            out = model.generate(torch.tensor([ids] * samples),
                                 attention_mask=torch.ones(samples, len(ids), dtype=torch.long),
                                 do_sample=True, temperature=config.rollout.temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=config.rollout.max_new_tokens, pad_token_id=tokenizer.eos_token_id)
            for row in out[:, len(ids):].tolist():
                response = row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row
                prompt_ids.append(ids)
                response_ids.append(response)
                rewards.append(verify_arithmetic(tokenizer.decode(response, skip_special_tokens=True), problem))
                group_ids.append(group)
    return prompt_ids, response_ids, rewards, group_ids


def _print_comparison(masks: dict, diagnostics: dict, mask: torch.Tensor, entropy: torch.Tensor,
                      groups_t: torch.Tensor, prompts: int) -> None:
    print("\nkept tokens per prompt (first 16 prompts), ρ = 0.2:")
    per_prompt = {name: [int(m[groups_t == g].sum()) for g in range(prompts)] for name, m in masks.items()}
    for name, counts in per_prompt.items():
        zero = sum(c == 0 for c in counts)
        print(f"  {name:28s} {counts[:16]}  … min {min(counts)} max {max(counts)}, prompts with none kept: {zero}")
    print(f"  {'response tokens':28s} {[int(mask[groups_t == g].sum()) for g in range(16)]}")
    print(f"  mean group entropy          {[round(float(entropy[groups_t == g][mask[groups_t == g].bool()].mean()), 2) for g in range(16)]}")

    print("\nselection diagnostics (mean over the mini-batches):")
    names = list(masks)
    print(f"  {'metric':36s}" + "".join(f"{n:>28s}" for n in names))
    for key in KEYS + tuple(f"selection/decile_{d}" for d in range(10)):
        print(f"  {key:36s}" + "".join(f"{diagnostics[n].get(key, float('nan')):28.3f}" for n in names))


if __name__ == "__main__":
    main()
