"""What an exact mini-batch population costs: the learner update with scope mini_batch vs micro_batch.

``scope: mini_batch`` (the GMTS release's ETS, recipe ``ets-release``) and ``global`` rank every token
of an optimiser step; when the step has more than one micro-batch the learner scores it in one no-grad
pass before its first backward (``workers/learner/schedule.needs_scoring_pass``). This benchmark runs
``LearnerEngine.train_step`` (real DeepSpeed, one gloo rank) on the cpu-tiny-s model and RL-step shape
(one mini-batch of 256 sequences) cut into 4 micro-batches of 64, ETS ρ = 0.2 with
``scope=micro_batch`` (no pass) against ``scope=mini_batch`` (the pass), interleaved round by round,
and also ``mini_batch`` with one micro-batch of 256 (no pass by construction). Figures are ratios of
the median ``time/train_step_s``, and the pass's share of the update (``time/selection_scoring_s``).
"""

from __future__ import annotations

import socket
import statistics
import time

import torch

from benchmarks.report import BenchmarkResult, Figure

PRESET = "cpu-tiny-s"
SETTINGS = {  # name → (scope, micro_batch_size)
    "micro_batch, 4 micro-batches": ("micro_batch", 64),
    "mini_batch, 4 micro-batches": ("mini_batch", 64),
    "mini_batch, 1 micro-batch": ("mini_batch", 256),
}


def _batch(vocab: int, rows: int, generator: torch.Generator):
    from workers.learner.batch import TrainBatch

    prompts, responses, groups = [], [], []
    for group in range(rows // 8):  # cpu-tiny-s: 8 samples per prompt, ≤ 8 prompt and ≤ 5 response tokens
        prompt = torch.randint(1, vocab, (7,), generator=generator).tolist()
        for _ in range(8):
            prompts.append(prompt)
            responses.append(torch.randint(1, vocab, (int(torch.randint(2, 6, (1,), generator=generator)),),
                                           generator=generator).tolist())
            groups.append(group)
    return TrainBatch.from_lists(prompts, responses, torch.randn(rows, generator=generator), groups, pad_id=0)


def run(smoke: bool) -> dict:
    from orchestrator.config_loader import load_experiment
    from workers.learner.config import LearnerConfig
    from workers.learner.engine import LearnerEngine, init_process_group
    from workers.learner.losses import PolicyLossConfig
    from workers.learner.selection import SelectionConfig
    from workers.models.materialize import materialize_model

    rounds, steps = (1, 2) if smoke else (3, 6)
    config = load_experiment(PRESET)
    model_dir = materialize_model(config.model)  # the preset's architecture; timing needs no warm-up
    torch.set_num_threads(1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    init_process_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=port)
    from transformers import AutoConfig

    batch = _batch(AutoConfig.from_pretrained(model_dir).vocab_size, 256, torch.Generator().manual_seed(0))
    engines = {}
    for name, (scope, micro) in SETTINGS.items():
        learner = LearnerConfig(lr=1e-4, mini_batch_size=256, micro_batch_size=micro, grad_clip=1.0)
        engine = LearnerEngine(model_dir, learner, PolicyLossConfig(),
                               SelectionConfig(method="ets", ratio=0.2, scope=scope))
        engine.train_step(batch, step=0)  # one-time costs
        engines[name] = engine
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    scoring: dict[str, list[float]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            for step in range(steps):
                started = time.perf_counter()
                metrics = engines[name].train_step(batch, step=1 + step)
                times[name].append(time.perf_counter() - started)
                scoring[name].append(metrics.get("time/selection_scoring_s", 0.0))
    median = {name: statistics.median(values) for name, values in times.items()}
    base = median["micro_batch, 4 micro-batches"]
    figures = [
        Figure("learner update, mini_batch / micro_batch scope (4 micro-batches)",
               median["mini_batch, 4 micro-batches"] / base, "×", "the scoring pass: one no-grad forward per micro-batch"),
        Figure("scoring pass share of the mini_batch update (4 micro-batches)",
               100 * statistics.median(scoring["mini_batch, 4 micro-batches"]) / median["mini_batch, 4 micro-batches"],
               "%", "time/selection_scoring_s ÷ train_step"),
        Figure("learner update, mini_batch scope with 1 micro-batch / micro_batch scope with 4",
               median["mini_batch, 1 micro-batch"] / base, "×", "no scoring pass when a mini-batch is one micro-batch"),
    ]
    return BenchmarkResult(
        title="cost of an exact mini-batch population (cpu-tiny-s learner update)",
        settings={"preset": PRESET, "rounds": rounds, "steps_per_round": steps, "sequences": 256,
                  "settings": {k: list(v) for k, v in SETTINGS.items()}},
        figures=figures,
        measurements={"median_train_step_s": median, "train_step_s": times},
        notes=["one warm-up train_step per engine; settings interleaved and rotated each round"],
    ).as_dict()
