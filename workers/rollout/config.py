"""How rollouts are sampled and how the vLLM engines that sample them are sized."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WeightSyncRoute = Literal["auto", "in_process", "bytes", "collective"]
CpuLinear = Literal["vllm", "torch"]


class RolloutConfig(BaseModel):
    """Sampling settings (the behaviour policy) and engine resources.

    The learner computes log π at ``temperature`` over the full vocabulary; rollout logprobs match that
    exactly only while ``top_p == 1`` and ``top_k == 0`` (see ``workers/rollout/README.md``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_actors: int = Field(default=1, ge=1, description="vLLM engines (Ray actors) that share the prompts.")
    n_samples: int = Field(default=8, ge=1, description="Responses per prompt: the GRPO group size.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature (greedy is a flag).")
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k.")
    max_new_tokens: int = Field(default=32, ge=1)
    max_prompt_tokens: int = Field(default=64, ge=1)
    kv_cache_memory_bytes: int | None = Field(
        default=256 * 1024**2,
        gt=0,
        description="KV cache size on CPU, where it is required (vLLM's default reservation fails on small "
        "machines). Ignored on CUDA, where gpu_memory_utilization sizes the cache.",
    )
    threads_per_actor: int | None = Field(
        default=None,
        ge=1,
        description="torch intra-op threads of each CPU engine (None: Ray's default, the actor's num_cpus). The "
        "loop runs rollout and learner one after the other, so on a small CPU machine each may use every core.",
    )
    gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per engine (CUDA only).")
    enforce_eager: bool = Field(
        default=True, description="Skip torch.compile/CUDA graphs: no gain at tiny scale, a minute to build."
    )
    cpu_linear: CpuLinear = Field(
        default="vllm",
        description="The dense GEMM of a CPU engine. 'vllm': vLLM's own dispatch, which packs every linear weight "
        "for oneDNN when the engine loads and again at every weight sync, after which each new batch shape builds "
        "its oneDNN kernels anew. 'torch': torch.nn.functional.linear on the weights as loaded (the learner's "
        "GEMM), no packing: faster when weights change every step and the model is small (cpu-tiny-s on an AMD EPYC "
        "without AVX-512: 0.24 s less per rollout). Other bits than 'vllm', hence other runs. Ignored on CUDA.",
    )
    weight_sync: WeightSyncRoute = Field(
        default="auto",
        description="How new weights reach the engines: 'in_process' (tensors handed to an in-process CPU "
        "worker), 'bytes' (bucketed raw bytes through collective_rpc), 'collective' (learner rank 0 "
        "broadcasts buckets to every vLLM worker over a process group of their own: NCCL, or gloo on CPU "
        "and on a shared GPU). 'auto': collective on CUDA, in_process for in-process CPU engines, else bytes.",
    )
    weight_sync_bucket_bytes: int = Field(
        default=256 * 1024**2, gt=0, description="Bucket size of the bytes and collective weight-sync routes."
    )
    max_staleness: int = Field(
        default=0, ge=0,
        description="Policy versions a batch may lag behind the learner (PRIME-RL's async_level). 0: the synchronous "
        "loop, each step rolls out with the weights of the step before. k > 0: the engines roll out the batches of "
        "the next k steps while the learners train, so a step costs about max(rollout, learner) + sync instead of "
        "their sum; a batch is trained on exactly k versions after the weights that sampled it (fewer for the first "
        "k steps), π_old being the engine's sampling logprobs (needs learner.old_logp_source='rollout').",
    )
    seed: int = 0

    @property
    def max_model_len(self) -> int:
        # +1: sequence_logprobs scores prompt + response as one prompt, and vLLM still wants room for
        # one output token after it.
        return self.max_prompt_tokens + self.max_new_tokens + 1
