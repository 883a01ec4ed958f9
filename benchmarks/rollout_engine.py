"""Measure a rollout engine: start time, sampling throughput, weight-update time.

python -m benchmarks.rollout_engine --source tiny      # the numbers in workers/rollout/README.md
python -m benchmarks.rollout_engine --source smollm2
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import torch
from transformers import AutoModelForCausalLM

from workers.models.config import ModelConfig, ModelSource
from workers.models.materialize import materialize_model
from workers.rollout.config import RolloutConfig
from workers.rollout.engine import RolloutEngine
from workers.weights.vllm_reload import send_weights_via_rpc

logger = logging.getLogger(__name__)


def benchmark(source: ModelSource, num_prompts: int, n: int, max_new_tokens: int) -> dict[str, float]:
    folder = materialize_model(ModelConfig(source=source))
    engine = RolloutEngine(folder, RolloutConfig(max_new_tokens=max_new_tokens, max_prompt_tokens=16))
    try:
        prompt = [1, 2, 3, 4, 5, 6] if source == "tiny" else [17, 1044, 28, 1044]
        engine.generate([prompt], n=1)  # the first call pays one-off setup costs
        started = time.perf_counter()
        samples = engine.generate([prompt] * num_prompts, n=n)
        sampling_seconds = time.perf_counter() - started
        new_tokens = sum(len(s.response_ids) for s in samples)

        state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
        direct = [engine.update_weights(state) for _ in range(3)]
        started = time.perf_counter()
        send_weights_via_rpc(engine.llm, list(state.items()))
        rpc_seconds = time.perf_counter() - started
        return {
            "engine_start_s": round(engine.start_seconds, 2),
            "sequences": len(samples),
            "new_tokens": new_tokens,
            "sampling_s": round(sampling_seconds, 2),
            "new_tokens_per_s": round(new_tokens / sampling_seconds, 1),
            "update_weights_direct_s": round(min(direct), 4),
            "update_weights_rpc_bytes_s": round(rpc_seconds, 4),
        }
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    result = benchmark(args.source, args.num_prompts, args.n, args.max_new_tokens)
    logger.info("%s", json.dumps({"source": args.source, **result}))


if __name__ == "__main__":
    main()
