"""Which verifiable task gives SmolLM2-135M-Instruct a learning signal? Its base accuracy on candidate tasks.

GRPO learns only from groups whose rewards differ: a task the base model never (or always) solves gives every
group advantage 0. This measures, for each candidate, the base model's accuracy sampled at T = 1 (what the
rollouts see) and greedy (what the held-out evaluation reports), with the candidate's chat prompt, answer
length and the project's own verifier (``workers.reward.dispatch.verify_completion``, the function every
reward worker calls). A good RL task sits at about 15-60 % sampled accuracy with answers of at most ~32
tokens.

    python -m benchmarks.real_model_tasks [--problems 200] [--samples 4] [--only NAME …] [--out FILE.json]

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the materialised SmolLM2 folder; every
candidate's prompts go to the engine in one call, so decoding is batched. Intervals are 95 % normal intervals
over problems (for sampled accuracy: over each problem's mean of its samples, so the samples of one problem
are not counted as independent).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.data import DatasetSpec, PromptTemplateConfig, load_dataset, prompt_token_ids

logger = logging.getLogger("benchmarks.real_model_tasks")

MAX_NEW_TOKENS = 32
# Replaces SmolLM2's default system message ("You are a helpful AI assistant named SmolLM, …"), which its chat
# template inserts when a conversation has none.
TERSE_SYSTEM = "You are a calculator. Reply with the result only."


@dataclass(frozen=True)
class Candidate:
    name: str
    spec: DatasetSpec
    template: PromptTemplateConfig
    note: str


def _question(digits: int, operations: list[str], split: str = "test") -> DatasetSpec:
    return DatasetSpec(source="arithmetic", split=split,
                       arithmetic={"digits": digits, "operations": operations, "style": "question"})


# The user message is the problem's prompt plus the template's instruction for its domain.
_NO_INSTRUCTION = PromptTemplateConfig(kind="chat", instructions={"math": "", "reasoning_gym": ""})
_NUMBER_ONLY = PromptTemplateConfig(kind="chat", instructions={"math": "Answer with the number only."})
_TERSE = PromptTemplateConfig(kind="chat", system_prompt=TERSE_SYSTEM, instructions={"math": ""})
_BOXED = PromptTemplateConfig(kind="chat")  # the default: "Please reason step by step, … \\boxed{}."

# In the order they are measured: the task of the cpu-smollm2-arith preset first.
CANDIDATES = (
    Candidate("add-2digit-terse-system", _question(2, ["+"]), _TERSE, f"system message {TERSE_SYSTEM!r}"),
    Candidate("add-1digit", _question(1, ["+", "-", "*"], "train"), _NO_INSTRUCTION,
              "1-digit + - *: the 175 problems of the default train split (all 1-digit splits hold 231)"),
    Candidate("add-2digit", _question(2, ["+"]), _NO_INSTRUCTION, "What is a + b? with 2-digit operands"),
    Candidate("add-2digit-number-only", _question(2, ["+"]), _NUMBER_ONLY, "… + 'Answer with the number only.'"),
    Candidate("add-2digit-boxed", _question(2, ["+"]), _BOXED, "the default step-by-step + \\boxed{} instruction"),
    Candidate("addsub-2digit-terse-system", _question(2, ["+", "-"]), _TERSE, "2-digit + and -, terse system"),
    Candidate("rg-basic-arithmetic", DatasetSpec(
        source="reasoning_gym", split="test", limit=400,
        reasoning_gym={"dataset": "basic_arithmetic",
                       "kwargs": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}),
        _NO_INSTRUCTION, "reasoning-gym basic_arithmetic, 2 terms of 1-2 digits, its own prompt and scorer"),
    Candidate("gsm8k", DatasetSpec(source="gsm8k"), _BOXED, "GSM8K test (the old cpu-smollm2 task), 32 tokens"),
)


@dataclass
class TaskAccuracy:
    name: str
    note: str
    problems: int
    samples_per_problem: int
    sampled_accuracy: float
    sampled_ci95: float
    greedy_accuracy: float
    greedy_ci95: float
    sampled_mean_tokens: float
    sampled_truncated: float  # share of samples that hit MAX_NEW_TOKENS
    greedy_mean_tokens: float
    prompt_tokens: float
    seconds: float
    examples: list[str]


def measure(candidate: Candidate, engine, tokenizer, problems_per_task: int, samples: int) -> TaskAccuracy:
    from workers.reward.config import RewardConfig
    from workers.reward.dispatch import verify_completion
    from workers.reward.results import CheckError

    started = time.perf_counter()
    problems = load_dataset(candidate.spec)[:problems_per_task]
    prompts = [prompt_token_ids(problem, tokenizer, candidate.template) for problem in problems]
    reward_config = RewardConfig()

    def scores(drawn) -> list[float]:
        texts = tokenizer.batch_decode([s.response_ids for s in drawn], skip_special_tokens=True)
        out = []
        for sample, text in zip(drawn, texts, strict=True):
            try:
                out.append(float(verify_completion(text, problems[sample.prompt_index], reward_config) >= 1.0))
            except CheckError:
                out.append(0.0)
        return out

    # No per-request seeds: with a whole task in one batch vLLM splits prefills into chunks, and its CPU sampler
    # cannot rewind a seeded request's generator after a partial prefill ("CPU Generator does not use offset").
    # The engine's own seed (RolloutConfig.seed) still makes the run reproducible.
    sampled = engine.generate(prompts, n=samples)
    greedy = engine.generate(prompts, n=1, greedy=True)
    sampled_scores, greedy_scores = scores(sampled), scores(greedy)
    per_problem = [statistics.fmean(sampled_scores[i * samples:(i + 1) * samples]) for i in range(len(problems))]
    examples = [f"{problems[s.prompt_index].prompt!r} → {tokenizer.decode(s.response_ids, skip_special_tokens=True)!r}"
                f" ({'✓' if score else '✗'})" for s, score in list(zip(sampled, sampled_scores))[:6 * samples:samples]]
    return TaskAccuracy(
        name=candidate.name, note=candidate.note, problems=len(problems), samples_per_problem=samples,
        sampled_accuracy=statistics.fmean(per_problem), sampled_ci95=_ci95(per_problem),
        greedy_accuracy=statistics.fmean(greedy_scores), greedy_ci95=_ci95(greedy_scores),
        sampled_mean_tokens=statistics.fmean(len(s.response_ids) for s in sampled),
        sampled_truncated=statistics.fmean(s.finish_reason == "length" for s in sampled),
        greedy_mean_tokens=statistics.fmean(len(s.response_ids) for s in greedy),
        prompt_tokens=statistics.fmean(len(p) for p in prompts),
        seconds=time.perf_counter() - started, examples=examples,
    )


def _ci95(values: list[float]) -> float:
    """Half-width of the 95 % normal interval of the mean of ``values``."""
    return 1.96 * statistics.pstdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def markdown_table(rows: list[TaskAccuracy]) -> str:
    lines = ["| task | problems × samples | sampled acc. (T = 1) | greedy acc. | tokens (sampled / greedy) | "
             "truncated | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r.name}` | {r.problems} × {r.samples_per_problem} | "
                     f"{100 * r.sampled_accuracy:.1f} ± {100 * r.sampled_ci95:.1f} % | "
                     f"{100 * r.greedy_accuracy:.1f} ± {100 * r.greedy_ci95:.1f} % | "
                     f"{r.sampled_mean_tokens:.1f} / {r.greedy_mean_tokens:.1f} | {100 * r.sampled_truncated:.0f} % | "
                     f"{r.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model_tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=200, help="problems per task (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=4, help="T = 1 samples per problem (default: %(default)s)")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CANDIDATES], metavar="NAME")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the vLLM engine")
    parser.add_argument("--out", type=Path, default=None, help="write the measurements as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from transformers import AutoTokenizer

    from workers.models.config import ModelConfig
    from workers.models.materialize import materialize_model
    from workers.rollout.config import RolloutConfig
    from workers.rollout.engine import RolloutEngine

    folder = materialize_model(ModelConfig(source="smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # 1 GiB of KV cache holds ~22k fp32 tokens of SmolLM2 (30 layers × 3 KV heads × 64 × 2 × 4 B ≈ 46 KB each):
    # a whole candidate's samples decode as one batch.
    engine = RolloutEngine(folder, RolloutConfig(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS, max_prompt_tokens=320,
                                                 kv_cache_memory_bytes=1024**3, threads_per_actor=args.threads))
    rows = []
    try:
        for candidate in CANDIDATES:
            if args.only and candidate.name not in args.only:
                continue
            row = measure(candidate, engine, tokenizer, args.problems, args.samples)
            logger.info("%s: sampled %.1f %%, greedy %.1f %% (%.0f s)", row.name, 100 * row.sampled_accuracy,
                        100 * row.greedy_accuracy, row.seconds)
            for example in row.examples:
                logger.info("  %s", example)
            rows.append(row)
            if args.out:  # rewritten after every task: a run stopped half-way keeps what it measured
                args.out.write_text(json.dumps([asdict(r) for r in rows], indent=1, ensure_ascii=False))
    finally:
        engine.shutdown()
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
