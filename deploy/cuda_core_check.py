"""The pure-PyTorch core on a CUDA device, against the same computation on the CPU in float64.

    python deploy/cuda_core_check.py [OUT_DIR]

Needs only torch and pydantic (no vLLM, Ray or DeepSpeed), so it runs on a bare GPU machine where
``deploy/gpu_check.sh`` cannot install the rest. It checks, at a SmolLM2-like shape (vocabulary 49,152):

- token statistics (log π, entropy H, the exact logits-gradient norm G) from CUDA float32 and bfloat16 logits;
- that |ω|·G equals autograd's per-token gradient norm of the real PPO loss on CUDA (float32);
- that every reference recipe selects the same tokens on CUDA as on the CPU from the same float64 inputs;
- one fused ``token_stats_from_logits`` pass's time on the device (a figure, not a target).

Writes ``report.md`` and ``metrics.json`` into OUT_DIR (default ./cuda-core-check) and exits 1 on a failed check.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from workers.learner.losses import PolicyLossConfig, effective_grad_coef, ppo_clip_loss
from workers.learner.recipes import RECIPES
from workers.learner.selection import SelectionConfig, select_tokens
from workers.learner.token_stats import token_stats_from_logits

ROWS, LENGTH, VOCAB = (4, 16, 512) if os.environ.get("CUDA_CORE_CHECK_DEVICE") == "cpu" else (16, 256, 49_152)
GROUP = 8


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    # CUDA_CORE_CHECK_DEVICE=cpu runs the same checks on the CPU at a small shape: how the suite tests this script.
    device = torch.device(os.environ.get("CUDA_CORE_CHECK_DEVICE", "cuda"))
    generator = torch.Generator().manual_seed(0)
    logits64 = torch.randn(ROWS, LENGTH, VOCAB, generator=generator, dtype=torch.float64) * 3
    tokens = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=generator)
    reference = token_stats_from_logits(logits64, tokens, temperature=1.0, with_grad_norm=True)
    checks: dict[str, dict] = {}

    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        stats = token_stats_from_logits(logits64.to(device, dtype), tokens.to(device), temperature=1.0,
                                        with_grad_norm=True)
        errors = {name: float((getattr(stats, name).double().cpu() - getattr(reference, name)).abs().max())
                  for name in ("logp", "entropy", "grad_norm")}
        checks[f"token_stats_{str(dtype).removeprefix('torch.')}"] = {
            "max_abs_error_vs_cpu_float64": errors, "tolerance": tolerance,
            "ok": all(error <= tolerance * max(1.0, float(getattr(reference, name).abs().max()))
                      for name, error in errors.items())}

    checks["gradient_equivalence_float32"] = _gradient_equivalence(device)
    checks["recipes_select_the_same_tokens"] = _recipes_match(device, reference)

    logits32 = logits64.to(device, torch.float32)
    token_ids = tokens.to(device)
    for _ in range(3):
        token_stats_from_logits(logits32, token_ids, temperature=1.0, with_grad_norm=True)
    _synchronize(device)
    started = time.perf_counter()
    for _ in range(10):
        token_stats_from_logits(logits32, token_ids, temperature=1.0, with_grad_norm=True)
    _synchronize(device)
    seconds = (time.perf_counter() - started) / 10

    ok = all(check["ok"] for check in checks.values())
    metrics = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__, "shape": [ROWS, LENGTH, VOCAB],
               "token_stats_float32_ms": round(seconds * 1e3, 3), "checks": checks, "ok": ok}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    lines = [f"# CUDA core check: {metrics['device']}, torch {metrics['torch']}", "",
             f"logits {ROWS}×{LENGTH}×{VOCAB}; token_stats (float32, with G) {seconds * 1e3:.2f} ms per pass", ""]
    lines += [f"- {name}: {'ok' if check['ok'] else 'FAILED'} — "
              f"{json.dumps({k: v for k, v in check.items() if k != 'ok'})}" for name, check in checks.items()]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _gradient_equivalence(device: torch.device) -> dict:
    """Autograd's per-token gradient norm of the PPO-clip loss w.r.t. the logits against |ω|·G."""
    generator = torch.Generator().manual_seed(1)
    rows, length, vocab = 8, 64, 4096
    logits = (torch.randn(rows, length, vocab, generator=generator) * 2).to(device).requires_grad_(True)
    tokens = torch.randint(0, vocab, (rows, length), generator=generator).to(device)
    mask = torch.ones(rows, length, device=device)
    advantages = torch.randn(rows, 1, generator=generator).expand(rows, length).to(device)  # one per sequence
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, loss_agg="token-mean")
    stats = token_stats_from_logits(logits, tokens, temperature=1.0, with_grad_norm=True)
    old_logp = (stats.logp.detach() + 0.1 * torch.randn(rows, length, generator=generator).to(device))
    loss = ppo_clip_loss(logp=stats.logp, old_logp=old_logp, advantages=advantages, response_mask=mask,
                         config=config).loss
    (grad,) = torch.autograd.grad(loss, logits)
    autograd_norm = grad.norm(dim=-1)
    omega = effective_grad_coef(logp=stats.logp.detach(), old_logp=old_logp, advantages=advantages,
                                response_mask=mask, config=config)
    predicted = omega.abs() * stats.grad_norm.detach()
    error = float((autograd_norm - predicted).abs().max())
    return {"max_abs_error": error, "tolerance": 1e-5, "ok": error <= 1e-5}


def _recipes_match(device: torch.device, stats) -> dict:
    """Each recipe's mask from the same float64 inputs, on the CPU and on CUDA: exactly the same tokens."""
    generator = torch.Generator().manual_seed(2)
    mask = (torch.rand(ROWS, LENGTH, generator=generator) < 0.9).double()
    advantages = torch.randn(ROWS, generator=generator, dtype=torch.float64)
    group_ids = torch.arange(ROWS) // GROUP
    old_logp = stats.logp + 0.05 * torch.randn(ROWS, LENGTH, generator=generator, dtype=torch.float64)
    loss_config = PolicyLossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, loss_agg="token-mean")
    differing = {}
    for recipe in RECIPES:
        config = SelectionConfig(recipe=recipe, ratio=0.2, seed=0)
        masks = []
        for where in (torch.device("cpu"), device):
            selection = select_tokens(
                response_mask=mask.to(where), entropy=stats.entropy.to(where), advantages=advantages.to(where),
                group_ids=group_ids.to(where), logp=stats.logp.to(where), old_logp=old_logp.to(where),
                ref_logp=None, grad_norm=stats.grad_norm.to(where), config=config, loss_config=loss_config,
                process_group=None)
            masks.append(selection.mask.bool().cpu())
        differing[recipe] = int((masks[0] != masks[1]).sum())
    return {"tokens_differing_cpu_vs_cuda": differing, "ok": not any(differing.values())}


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("cuda-core-check")))
