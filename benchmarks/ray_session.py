"""An embedded Ray for the benchmarks that need one (always ``ray.shutdown()`` it in a ``finally``)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def start_local_ray(num_cpus: int | None = None) -> None:
    """``ray.init`` on this machine's cores; actors import the project from this checkout."""
    from orchestrator.cluster import ACTOR_ENV, start_embedded

    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    # A new cluster of our own, never another local one (another engineer's sweep, a test) that happens to run.
    start_embedded(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False,
                   runtime_env={"env_vars": {"PYTHONPATH": python_path, **ACTOR_ENV}})
