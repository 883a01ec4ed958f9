"""Weight sync: seconds to push a full state dict into a running vLLM engine vs the bytes moved.

Per model, side by side (interleaved rounds, medians):

- ``update_weights``: ``RolloutEngine.update_weights(state_dict)`` on an in-process engine (the CPU
  path: tensors handed to the worker, ``reload_weights``, prefix cache reset);
- ``rpc_bytes``: the multi-process/CUDA route on the same engine (``send_weights_via_rpc``: tensors
  serialised to bytes in buckets, ``collective_rpc``, rebuilt and reloaded by the worker extension);
- ``ray_group`` (full runs): the training loop's route into a rollout actor in another process —
  ``workers.weights.sync.load_into_engines`` puts the state dict in Ray's object store once as ``HostWeights``
  (``workers/weights/object_store.py``), the actor maps it without a copy and reloads (the loop itself puts it
  from the learner actor; the driver never holds it);
- ``clone``: ``{name: tensor.clone()}`` of the same state dict — one in-memory copy of the same bytes,
  the physical floor on this machine.
Figures: each path's time / clone time, and the effective GB/s of each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from benchmarks.ray_session import start_local_ray
from benchmarks.report import BenchmarkResult, Figure
from benchmarks.timing import interleaved, paired_ratio
from benchmarks.workloads import preset_workload
from workers.rollout import RolloutEngine
from workers.weights.vllm_reload import send_weights_via_rpc

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scale:
    label: str
    preset: str
    rounds: int
    with_ray: bool


def scales(smoke: bool) -> list[Scale]:
    if smoke:
        return [Scale("tiny-s", "cpu-tiny-s", rounds=2, with_ray=False)]
    return [Scale("tiny-s", "cpu-tiny-s", rounds=15, with_ray=True),
            Scale("smollm2-135m", "cpu-smollm2", rounds=7, with_ray=True)]


def run(smoke: bool) -> dict:
    figures: list[Figure] = []
    settings: dict = {}
    measurements: dict = {}
    ray_started = False
    try:
        for scale in scales(smoke):
            if scale.with_ray and not ray_started:
                start_local_ray()
                ray_started = True
            result = _measure(scale)
            figures += result["figures"]
            settings[scale.label] = result["settings"]
            measurements[scale.label] = result["measurements"]
    finally:
        if ray_started:
            import ray

            ray.shutdown()
    return BenchmarkResult(
        title="RolloutEngine.update_weights vs an in-memory copy of the same bytes",
        settings=settings, figures=figures, measurements=measurements,
        notes=["ratios are paired medians (path_i / clone_i in the same round); GB/s = bytes / median seconds."],
    ).as_dict()


def _measure(scale: Scale) -> dict:
    workload = preset_workload(scale.label, scale.preset, 1)
    model = AutoModelForCausalLM.from_pretrained(workload.model_dir, dtype=torch.float32)
    # What the learner sends (LearnerEngine.state_dict_for_inference): detached CPU copies with HF names.
    state_dict = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}
    del model
    total_bytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    engine = RolloutEngine(workload.model_dir, workload.config.rollout)
    group = None
    try:
        cases = {
            "clone": lambda: {name: tensor.clone() for name, tensor in state_dict.items()},
            "update_weights": lambda: engine.update_weights(state_dict),
            "rpc_bytes": lambda: send_weights_via_rpc(engine.llm, list(state_dict.items())),
        }
        if scale.with_ray:
            from workers.rollout.actor import RolloutGroup
            from workers.weights.sync import load_into_engines

            group = RolloutGroup(workload.model_dir, workload.config.rollout, num_cpus_per_actor=1)
            group.generate(workload.prompt_ids[:1], n=1)  # the actor's engine is up before timing starts
            cases["ray_group"] = lambda: load_into_engines(group.actors, state_dict)
        samples = interleaved(cases, rounds=scale.rounds, warmup=1)
    finally:
        if group is not None:
            group.shutdown()
        engine.shutdown()

    label = scale.label
    gbps = lambda case: total_bytes / samples.median(case) / 1e9
    figures = [
        Figure(f"{label}: {case} / clone", paired_ratio(samples, case, "clone"), "×",
               f"{samples.median(case) * 1e3:.1f} ms, {gbps(case):.2f} GB/s vs clone {gbps('clone'):.2f} GB/s")
        for case in cases if case != "clone"
    ]
    figures.append(Figure(f"{label}: bytes moved", round(total_bytes / 1e6, 2), "MB",
                          f"{len(state_dict)} tensors, fp32"))
    return {
        "figures": figures,
        "settings": {"preset": scale.preset, "model_dir": str(workload.model_dir), "bytes": total_bytes,
                     "tensors": len(state_dict), "rounds": scale.rounds, "warmup_rounds": 1,
                     "cases": list(cases), "torch_threads": torch.get_num_threads()},
        "measurements": samples.summary(),
    }
