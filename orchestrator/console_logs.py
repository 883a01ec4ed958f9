"""What a run prints: our own INFO lines (phases, progress), third-party INFO off unless ``--verbose``.

vLLM, Ray and DeepSpeed each log dozens of INFO lines per engine start (≈ 480 lines in one demo); they
are what a maintainer debugging an engine wants, not what a user watching a sweep wants. Off by default:

- the driver and the trial processes: the third-party loggers below at WARNING;
- vLLM reads ``VLLM_LOGGING_LEVEL`` when imported in a rollout actor (and torch ``TORCH_CPP_LOG_LEVEL``):
  set in the environment the actors
  inherit (an embedded Ray's workers inherit the driver's environment; a connected cluster gets it in
  the job's ``runtime_env``);
- the actor processes: a Ray ``worker_process_setup_hook`` drops INFO records there (DeepSpeed builds
  its logger at INFO on import, with its own handler, so no level set beforehand survives); the trial
  process takes them back (``restore_info``), since it prints the run's own progress.

``GMTS_VERBOSE=1`` (what ``--verbose`` sets) keeps everything as the libraries configure it.
"""

from __future__ import annotations

import logging
import os
import warnings

VERBOSE_ENV = "GMTS_VERBOSE"
THIRD_PARTY_LOGGERS = ("vllm", "ray", "ray.tune", "ray.train", "ray.data", "DeepSpeed", "deepspeed", "mlflow",
                       "torch.distributed", "transformers", "alembic", "urllib3", "filelock")
# HF_HUB_DISABLE_PROGRESS_BARS also turns off transformers' own bars ("Writing model shards").
# vLLM at ERROR: on CPU its start-up WARNINGs (≈ 12 per engine: no Triton, no tcmalloc, thread binding, …)
# describe the host, not the run. TORCH_CPP_LOG_LEVEL: torch's C++ notes (NUMA binding).
QUIET_ENV = {"VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "warning", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             "TORCH_CPP_LOG_LEVEL": "ERROR"}
FORMAT = "%(asctime)s %(message)s"
DATE_FORMAT = "%H:%M:%S"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "0") not in ("", "0", "false", "False")


def configure(*, verbose_logs: bool) -> None:
    """Set up this (driver) process's console: our INFO lines, and the environment its workers inherit."""
    os.environ[VERBOSE_ENV] = "1" if verbose_logs else "0"
    logging.basicConfig(level=logging.INFO, format=FORMAT if not verbose_logs else
                        "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt=DATE_FORMAT)
    if not verbose_logs:
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
    quiet_third_party()


def quiet_third_party() -> None:
    if verbose():
        return
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def runtime_env() -> dict:
    """The job-level Ray runtime_env that carries the choice to every worker (merged with each actor's)."""
    if verbose():
        return {"env_vars": {VERBOSE_ENV: "1"}}
    return {"env_vars": {VERBOSE_ENV: "0", **QUIET_ENV},
            "worker_process_setup_hook": f"{__name__}.{quiet_worker.__name__}"}


def quiet_worker() -> None:
    """Ray worker setup hook: INFO records are dropped in this process (see the module docstring), and
    libraries' FutureWarnings about their own dependencies (vLLM on torch.distributed) are not shown."""
    if not verbose():
        logging.disable(logging.INFO)
        warnings.filterwarnings("ignore", category=FutureWarning)


def restore_info() -> None:
    """In a Ray worker that prints the run's own progress (a Tune trial): INFO records again, our own
    loggers only being at INFO."""
    logging.disable(logging.NOTSET)
    quiet_third_party()
