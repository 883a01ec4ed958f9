"""The cached base policy: trained once, its checksum recorded, checked on every load, tampering refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from orchestrator.base_policy import base_checksum, policy_checksum, prepare_policy
from orchestrator.config_loader import load_experiment
from workers.learner.sft import folder_checksum


def _config(tmp_path, **extra: str):
    overrides = {"model.cache_dir": str(tmp_path / "models"), "warmup.steps": "4", "warmup.examples": "64",
                 "warmup.batch_size": "16", **extra}
    return load_experiment("cpu-tiny-s", [f"{k}={v}" for k, v in overrides.items()])


def test_cached_base_is_reused_verified_and_tampering_is_refused(tmp_path):
    config = _config(tmp_path)
    folder = prepare_policy(config)
    recorded = base_checksum(folder)
    assert recorded == folder_checksum(folder) == policy_checksum(config, folder)
    assert prepare_policy(config) == folder  # the cache, not a second warm-up

    weights = next(folder.glob("*.safetensors"))
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + torch.finfo(torch.float32).eps  # one flipped low bit is enough
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match=r"warmup: the cached base policy .* delete the folder"):
        prepare_policy(config)


@pytest.mark.slow
def test_another_warmup_is_another_base(tmp_path):
    first = prepare_policy(_config(tmp_path))
    second = prepare_policy(_config(tmp_path, **{"warmup.seed": "1"}))
    assert first != second and base_checksum(first) != base_checksum(second)
    assert json.loads((second / "base_policy.json").read_text())["sha256"] == folder_checksum(second)
