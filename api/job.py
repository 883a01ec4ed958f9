"""The entrypoint of every Ray job the service submits: re-validate the job file, then run it.

    python -m api.job sweep <state>/jobs/<id>.yaml --output-dir <state>/runs/<id>   → sweeps.run
    python -m api.job sweep <state>/jobs/<id>.yaml --output-dir <state>/runs/<id> --resume   → sweeps.run --resume
    python -m api.job run   <state>/jobs/<id>.yaml                                  → orchestrator.train

The service wrote the file from the validated model, but between that and the job's start lie a
file on disk and another process, maybe another code version: the job validates the file again
through the same models and the same number bounds (api/limits.py) and refuses — exit status 2, the
field named on stderr, so it lands in the job's log — before any actor starts or any MLflow run
opens. Then it runs exactly the CLI a user would type (``sweeps.run`` / ``orchestrator.train``).

Everything the job creates is owner-only (umask 077): the driver sets it before it runs, and every other
process of the job — its actors, Tune's trials, on any node — runs ``owner_only_files`` as Ray's
``worker_process_setup_hook`` (api/ray_jobs.py puts it into the job's runtime_env) before its first
task. So the checkpoints, records and reports under ``<state>/runs/<id>/`` are 0600/0700 like the rest
of the state dir, also where the job writes outside it (a model cache). This module imports nothing
heavy at the top: every worker of the job imports it for that hook.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

OWNER_ONLY_UMASK = 0o077


def owner_only_files() -> None:
    """Ray worker setup hook of the service's jobs (see the module docstring)."""
    os.umask(OWNER_ONLY_UMASK)


def validate(kind: str, job_file: Path, output_dir: Path | None) -> None:
    """Raise ValidationError / ConfigError / RequestRejected if the job file is not a sensible job."""
    from api.submissions import check_grid_size, check_numbers

    if kind == "sweep":
        from sweeps.spec import expand, load_spec

        spec = load_spec(job_file)
        check_numbers(spec, "")
        check_grid_size(spec)
        for index, trial in enumerate(expand(spec, output_dir=output_dir or Path("runs"))):
            check_numbers(trial.config, f"trial {index} ({trial.name})")
    else:
        from orchestrator.config_loader import load_experiment

        check_numbers(load_experiment(job_file), "config")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.job", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["sweep", "run"])
    parser.add_argument("job_file", type=Path)
    parser.add_argument("--output-dir", type=Path, help="sweeps only: where its trials write")
    parser.add_argument("--resume", action="store_true", help="sweeps only: continue the sweep of this job file "
                        "(its id is the file's name) from its state, as `python -m sweeps.run --resume` does")
    args = parser.parse_args(argv)
    from pydantic import ValidationError

    from api.submissions import RequestRejected
    from orchestrator.config_loader import ConfigError

    try:
        validate(args.kind, args.job_file, args.output_dir)
    except RequestRejected as exc:
        reasons = "; ".join(f"{field}: {message}" for field, message in exc.errors)
        print(f"gmts job: refusing {args.job_file}: {reasons}", file=sys.stderr)
        return 2
    except (ValidationError, ConfigError, OSError) as exc:
        print(f"gmts job: refusing {args.job_file}: {exc}", file=sys.stderr)
        return 2
    owner_only_files()  # after the checks, which write nothing: the job's own files from here on
    if args.kind == "sweep":
        from sweeps.run import main as run_sweep

        # The job file is <state>/jobs/<api id>.yaml: the sweep runs under the API's id (one id for users).
        return run_sweep([str(args.job_file), "--output-dir", str(args.output_dir or "runs"),
                          "--resume" if args.resume else "--sweep-id", args.job_file.stem])
    from orchestrator.train import main as train

    return train(["--config", str(args.job_file)])


if __name__ == "__main__":
    sys.exit(main())
