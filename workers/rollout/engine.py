"""A vLLM engine that samples response groups with their logprobs and takes new weights in place.

What the logprobs mean. vLLM's default ``logprobs_mode="raw_logprobs"`` returns log_softmax of the raw
logits, i.e. the model at temperature 1, whatever temperature the token was sampled at. The learner
computes log π(o_t) = log_softmax(z_t / T)[o_t] at the rollout temperature T, so the engine runs with
``logprobs_mode="processed_logprobs"``: the log-probability under the distribution the token was actually
drawn from, after temperature (and after top-k/top-p, which renormalise over the kept tokens — so the two
agree exactly only with ``top_p=1, top_k=0``, the usual RLVR setting). Greedy requests skip the
temperature, so their logprobs are at T = 1. Prompt logprobs (``sequence_logprobs``) never go through the
sampler and are always raw, i.e. at T = 1.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from workers.rollout.config import RolloutConfig
from workers.weights.vllm_reload import WORKER_EXTENSION_CLASS, send_weights_via_rpc

ResolvedWeightSync = Literal["in_process", "bytes", "collective"]

logger = logging.getLogger(__name__)

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class RolloutSample:
    """One sampled response. Samples of the same prompt are adjacent, in ``generate``'s output order."""

    prompt_index: int
    prompt_ids: list[int]
    response_ids: list[int]  # ends with EOS when finish_reason == "stop"
    response_logprobs: list[float]  # log π(o_t) of each response token at the sampling temperature
    finish_reason: FinishReason  # "stop": the model emitted EOS; "length": max_new_tokens reached


class RolloutEngine:
    """A real vLLM ``LLM``: in-process on CPU, the usual worker processes (tensor parallel) on CUDA."""

    def __init__(self, model_dir: str | Path, config: RolloutConfig, dtype: str | None = None) -> None:
        """``dtype``: what vLLM computes in (the learner's precision); None = the folder's own dtype."""
        from vllm import LLM
        from vllm.platforms import current_platform

        self.config = config
        self.model_dir = Path(model_dir)
        self.on_cpu = current_platform.is_cpu()
        self._in_process = False  # vLLM's engine core and worker in this process (set below, CPU only)
        self._torch_linear = self.on_cpu and config.cpu_linear == "torch"
        engine_args: dict[str, Any] = {
            "model": str(self.model_dir),
            "dtype": dtype or _folder_dtype(self.model_dir),
            "seed": config.seed,
            "max_model_len": config.max_model_len,
            "enforce_eager": config.enforce_eager,
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "logprobs_mode": "processed_logprobs",  # see the module docstring
            "worker_extension_cls": WORKER_EXTENSION_CLASS,
        }
        if self.on_cpu:
            if config.threads_per_actor is not None:
                # Before vLLM starts: its CPU worker then disables torch.set_num_threads for the process,
                # so in a process where an engine already started (not a rollout actor) this cannot apply.
                torch.set_num_threads(config.threads_per_actor)
                if torch.get_num_threads() != config.threads_per_actor:
                    logger.warning("rollout.threads_per_actor=%d not applied (another vLLM engine started in "
                                   "this process first); computing at %d threads", config.threads_per_actor,
                                   torch.get_num_threads())
            if config.kv_cache_memory_bytes is None:
                raise ValueError(
                    "kv_cache_memory_bytes: required on CPU (vLLM's default reservation fails there)"
                )
            # In-process engine core and worker: starts in ≈4.5 s instead of ≈31 s, and lets
            # update_weights hand tensors to the worker directly. setdefault: an explicit "1" still wins.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            engine_args["distributed_executor_backend"] = "uni"
            self._in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
            if self._in_process:
                # vLLM's engine core freezes the heap once it has started (and unfreezes it at its shutdown); frozen
                # already here, after the imports, the heap so far (vLLM, torch, transformers: millions of objects)
                # is out of the collector's view while the engine starts, so the start's gc.collect() calls scan
                # only what the start allocates: ≈ 1.3 s less per start on 2 cores.
                gc.freeze()
            engine_args["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
        else:
            # On CUDA the KV cache is sized from gpu_memory_utilization, as vLLM normally does.
            engine_args["tensor_parallel_size"] = config.tensor_parallel_size
        started = time.perf_counter()
        with _context_proxies_hidden(), self._gemm_dispatch(), self._eager():
            self._llm = LLM(**engine_args)
        self.start_seconds = time.perf_counter() - started
        if self._torch_linear:
            self._check_torch_linear()
        _drop_per_sync_log_lines()
        self._weight_sync = self._resolve_weight_sync()
        logger.info("vLLM engine for %s started in %.1f s (weight sync: %s)", self.model_dir, self.start_seconds,
                    self._weight_sync)

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM``, for what this class does not wrap."""
        return self._llm

    def generate(
        self, prompt_token_ids: list[list[int]], n: int, greedy: bool = False, seed: int | None = None
    ) -> list[RolloutSample]:
        """Sample ``n`` responses per prompt; the result lists prompt 0's samples, then prompt 1's, …

        ``greedy`` decodes the argmax (evaluation); its logprobs are at temperature 1. ``seed`` makes
        the draw a function of (seed, prompt position) alone — prompt i uses seed + i — not of the
        engine's history, so a resumed run samples exactly what an uninterrupted one did.
        """
        from vllm import SamplingParams

        self._check_prompt_lengths(prompt_token_ids)
        if greedy and n != 1:
            raise ValueError(f"n={n}: greedy decoding gives one response per prompt, so n must be 1")
        def params_for(prompt_seed: int | None) -> SamplingParams:
            return SamplingParams(
                n=n,
                temperature=0.0 if greedy else self.config.temperature,
                top_p=self.config.top_p,
                top_k=self.config.top_k,
                max_tokens=self.config.max_new_tokens,
                logprobs=0,  # the sampled token's logprob only
                seed=prompt_seed,
                # Token ids are the product (callers decode them in one batch_decode): no incremental
                # detokenizer per request and no token strings for the logprobs.
                detokenize=False,
            )

        params = params_for(None) if seed is None else [params_for(seed + i) for i in range(len(prompt_token_ids))]
        with self._eager():
            outputs = self._llm.generate(_tokens_prompts(prompt_token_ids), params, use_tqdm=False)
        samples = []
        for prompt_index, (prompt_ids, output) in enumerate(zip(prompt_token_ids, outputs, strict=True)):
            for completion in output.outputs:
                response_ids = list(completion.token_ids)
                logprobs = [
                    position[token].logprob
                    for position, token in zip(completion.logprobs, response_ids, strict=True)
                ]
                samples.append(
                    RolloutSample(
                        prompt_index=prompt_index,
                        prompt_ids=list(prompt_ids),
                        response_ids=response_ids,
                        response_logprobs=logprobs,
                        finish_reason=_finish_reason(completion.finish_reason),
                    )
                )
        return samples

    def _eager(self):
        """Around each request an in-process CPU engine serves. The model runs eagerly already (``enforce_eager``),
        but vLLM's sampler counts each sampled token's rank (an integer we never read) with a ``torch.compile``d
        helper that compiles at the engine's first request: ≈ 2 s of CPU at every engine start. Uncompiled, the
        count is the same integer and every token and logprob the same bits (a test). Where requests run in worker
        processes (CUDA, or VLLM_ENABLE_V1_MULTIPROCESSING=1) a stance here would not reach them: the helper stays."""
        return torch.compiler.set_stance("force_eager") if self._in_process else contextlib.nullcontext()

    def _gemm_dispatch(self):
        """Where the weights are (re)loaded: the GEMM that ``config.cpu_linear`` names."""
        return _torch_linear_on_cpu() if self._torch_linear else contextlib.nullcontext()

    def _check_torch_linear(self) -> None:
        """``cpu_linear='torch'`` rests on a vLLM internal: fail loudly, naming the field, where it did not apply."""
        worker = self._in_process_worker()
        model = worker.model_runner.get_model() if worker is not None else None
        linears = [module for module in model.modules() if hasattr(module, "cpu_linear")] if model is not None else []
        # vLLM's packing branches empty the layer's weight; its torch.nn.functional.linear fallback keeps it.
        if not linears or any(module.weight.numel() == 0 for module in linears):
            raise RuntimeError("rollout.cpu_linear='torch' did not apply in this engine (needs an in-process CPU "
                               "engine of vLLM 0.32's GEMM dispatch); set rollout.cpu_linear='vllm'")

    def weight_sync_route(self) -> ResolvedWeightSync:
        """The route ``config.weight_sync`` resolved to on this engine ('auto' decided)."""
        return self._weight_sync

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> float:
        """Load a full state dict (HF checkpoint names) into the running engine; returns the seconds taken.

        With tied embeddings ``lm_head.weight`` must be there too (``model.state_dict()`` has it): without
        it vLLM 0.32's reload keeps the old output layer (measured: logprobs off by 0.9 on the tiny model).
        The tensors are in hand, so this takes the in-process route where it can (unless the config asks for bytes),
        else the bytes route; the collective route is :meth:`receive_weights`.
        """
        started = time.perf_counter()
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        items = [(name, tensor.detach()) for name, tensor in items]
        worker = self._in_process_worker()
        with self._gemm_dispatch():  # a reload packs the weights again
            if worker is not None and self._weight_sync != "bytes":
                worker.model_runner.reload_weights(weights_iterator=items)
            else:
                send_weights_via_rpc(self._llm, items, self.config.weight_sync_bucket_bytes)
        return self._weights_changed(started, len(items))

    # ------------------------------------------------------------------------- the collective route
    def weight_sync_devices(self) -> list[str | None]:
        """Each worker's GPU (None on CPU), in worker-rank order: one weight-sync rank per worker."""
        return self._llm.collective_rpc("weight_sync_device")

    def join_weight_sync_group(self, host: str, port: int, rank_offset: int, world_size: int,
                               backend: str) -> None:
        """Every worker joins the learner's group as rank ``rank_offset + its rank``; blocks until all have
        joined, so call it while the learner rank 0 joins too (``ray.get`` both together)."""
        self._llm.collective_rpc("join_weight_sync_group", args=(host, port, rank_offset, world_size, backend))

    def receive_weights(self) -> float:
        """Take the state dict that the learner rank 0 broadcasts (the call blocks until it has arrived and
        been reloaded); returns the seconds taken, waiting for the sender included."""
        started = time.perf_counter()
        with self._gemm_dispatch():
            (count, *_) = self._llm.collective_rpc("receive_broadcast_weights")
        return self._weights_changed(started, count)

    def _weights_changed(self, started: float, count: int) -> float:
        # Cached KV blocks were computed with the old weights; a prefix hit would silently reuse them.
        self._llm.reset_prefix_cache()
        seconds = time.perf_counter() - started
        logger.debug("Updated %d tensors in %.3f s", count, seconds)
        return seconds

    def _resolve_weight_sync(self) -> ResolvedWeightSync:
        route = self.config.weight_sync
        in_process = self._in_process_worker() is not None
        if route == "auto":
            return "collective" if not self.on_cpu else "in_process" if in_process else "bytes"
        if route == "in_process" and not in_process:
            raise ValueError("weight_sync='in_process' needs an in-process CPU engine "
                             "(VLLM_ENABLE_V1_MULTIPROCESSING=0 on CPU); this engine runs its workers in other "
                             "processes: use 'bytes' or 'collective'")
        return route

    def sequence_logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """log π(response_t | prompt, response_<t) at temperature 1, scored by vLLM as prompt logprobs."""
        from vllm import SamplingParams

        if not prompt_ids or not response_ids:
            raise ValueError("sequence_logprobs needs a non-empty prompt and response")
        token_ids = list(prompt_ids) + list(response_ids)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        with self._eager():
            (output,) = self._llm.generate(_tokens_prompts([token_ids]), params, use_tqdm=False)
        positions = output.prompt_logprobs[len(prompt_ids) :]
        return [position[token].logprob for position, token in zip(positions, response_ids, strict=True)]

    def shutdown(self) -> None:
        """Stop the engine core (and its worker processes, if any) and free the KV cache."""
        self._llm.llm_engine.engine_core.shutdown()

    def _in_process_worker(self) -> Any | None:
        """The vLLM worker when it lives in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), else None (worker processes)."""
        engine_core = getattr(self._llm.llm_engine.engine_core, "engine_core", None)
        executor = getattr(engine_core, "model_executor", None)
        driver = getattr(executor, "driver_worker", None)
        return getattr(driver, "worker", None)

    def _check_prompt_lengths(self, prompt_token_ids: list[list[int]]) -> None:
        for index, prompt in enumerate(prompt_token_ids):
            if not prompt or len(prompt) > self.config.max_prompt_tokens:
                raise ValueError(
                    f"prompt {index} has {len(prompt)} tokens; allowed 1..max_prompt_tokens="
                    f"{self.config.max_prompt_tokens}"
                )


@contextlib.contextmanager
def _context_proxies_hidden():
    """Hide modules holding werkzeug context proxies (flask's ``request``, ``g``…, imported by MLflow
    or a test client) while the engine starts: vLLM's CPU worker scans every loaded module's globals
    with ``hasattr``, and such a proxy raises RuntimeError ("outside of application context") instead
    of AttributeError, failing the engine start in any process that imported flask first."""
    local = sys.modules.get("werkzeug.local")
    proxy_type = getattr(local, "LocalProxy", None)
    hidden = {}
    if proxy_type is not None:
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None) or {}
            if any(type(value) is proxy_type for value in list(namespace.values())):
                hidden[name] = sys.modules.pop(name)
    try:
        yield
    finally:
        sys.modules.update(hidden)


# vLLM logs these on every in-place reload, i.e. once per RL step, burying the loop's own step line;
# the loop reports the sync time itself (time/sync). The rotary embedding has no weights to load.
_PER_SYNC_LOG_LINES = (
    "Reloading weights inplace", "Reloading and processing weights took", "Successfully reset prefix cache",
    "RotaryEmbedding: Failed to load weights",
)


class _PerSyncLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(line in message for line in _PER_SYNC_LOG_LINES)


def _drop_per_sync_log_lines() -> None:
    # On vLLM's handlers, not its logger: a logger's filters do not see its children's records.
    for handler in logging.getLogger("vllm").handlers:
        if not any(isinstance(f, _PerSyncLogFilter) for f in handler.filters):
            handler.addFilter(_PerSyncLogFilter())


@contextlib.contextmanager
def _torch_linear_on_cpu():
    """vLLM 0.32 has no switch for its CPU dense GEMM: ``dispatch_cpu_unquantized_gemm`` packs each linear
    weight into a oneDNN handle unless ``vllm._custom_ops._supports_onednn`` is false, and then falls back to
    ``torch.nn.functional.linear``. The flag is read at every (re)load of the weights, so it is switched off
    around those only, and another engine of this process keeps vLLM's own dispatch.
    ``RolloutEngine._check_torch_linear`` verifies that it took effect."""
    import vllm._custom_ops as vllm_ops

    before = vllm_ops._supports_onednn
    vllm_ops._supports_onednn = False
    try:
        yield
    finally:
        vllm_ops._supports_onednn = before


def _tokens_prompts(prompt_token_ids: list[list[int]]) -> list[Any]:
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]


def _finish_reason(reason: str | None) -> FinishReason:
    if reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a sample with reason {reason!r}; expected 'stop' or 'length'")
    return reason  # type: ignore[return-value]


def _folder_dtype(model_dir: Path) -> str:
    """The dtype the folder's weights were saved in, so vLLM computes in the learner's precision.

    (vLLM's "auto" may run a float32 checkpoint in half precision on GPUs.)
    """
    hf_config = json.loads((model_dir / "config.json").read_text())
    dtype = hf_config.get("dtype") or hf_config.get("torch_dtype")
    return dtype if isinstance(dtype, str) else "auto"
