"""Run an ablation sweep with Ray Tune and report it in MLflow.

    python -m sweeps.run SPEC [--set key=value …] [--resume [SWEEP_ID]] [--output-dir DIR] [--storage URI]
                         [--address ADDR]
    ray job submit --working-dir . -- python -m sweeps.run SPEC …

SPEC is a shipped spec name (``sweeps/specs/*.yaml``) or a YAML path; ``--set`` overrides fields of
the spec (``--set max_concurrent_trials=2``, ``--set base.overrides.training.steps=5``,
``--set 'grid.ratio=[0.1,0.5]'``). Exit status: 0 when every trial finished, 1 when any failed,
2 when the spec is invalid (nothing was started), 3 when interrupted (Ctrl-C) with trials unfinished.
"""

# ruff: noqa: E402  (the heavy imports follow the early --help on purpose)
from __future__ import annotations

import argparse
import os
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sweeps.run", description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="shipped spec name or YAML path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    parser.add_argument(
        "--resume", nargs="?", const=True, default=False, metavar="SWEEP_ID",
        help="continue the newest interrupted sweep of SPEC (or SWEEP_ID): only unfinished trials rerun",
    )
    parser.add_argument("--output-dir", type=Path, help="sweep folders and the default MLflow store (default: runs; "
                        "on a cluster of several nodes, a folder they all mount, or give --storage)")
    parser.add_argument("--storage", default=os.environ.get("GMTS_STORAGE") or None, metavar="URI",
                        help="where the sweep's record, Tune's state, the trials' checkpoints and a local MLflow "
                        "store's artifacts go: a folder every node sees, or an object store (s3://bucket/prefix, "
                        "credentials and endpoint from the AWS_* environment); default $GMTS_STORAGE, else --output-dir")
    parser.add_argument("--sweep-id", help="id of the new sweep (folders, gmts.sweep_id tag, parent run name); "
                        "default <spec name>-<UTC time>. The API passes its own sw-… id")
    parser.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else an embedded local Ray)")
    parser.add_argument("--verbose", action="store_true",
                        help="also print the INFO logs of vLLM, Ray and DeepSpeed (off: phases and the progress display)")
    return parser


# `--help` and usage errors answer here, before the imports below load Ray Tune, MLflow and torch
# (through the experiment config), seconds each; main() parses again.
if __name__ == "__main__":
    _parser().parse_args()

import shlex
import sys

from mlflow import MlflowClient
from rich.console import Console
from rich.table import Table

from orchestrator import console_logs
from orchestrator.config_loader import ConfigError
from sweeps.report import build_report, print_report
from sweeps.labels import trial_label
from sweeps.driver import PreparedSweep, prepare_sweep, run_sweep
from sweeps.spec import AXES, load_spec

DEFAULT_OUTPUT_DIR = Path("runs")
EXIT_TRIAL_FAILED = 1
EXIT_BAD_SPEC = 2
EXIT_INTERRUPTED = 3


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    console_logs.configure(verbose_logs=args.verbose)
    console = Console()
    try:
        spec = load_spec(args.spec, args.set)
        if args.sweep_id and args.resume:
            raise ConfigError("--sweep-id names a new sweep; to continue one, pass its id to --resume")
        # A sweep on several nodes needs its state where they all read it: never ./runs of this node unless asked.
        prepared = prepare_sweep(spec, args.output_dir or DEFAULT_OUTPUT_DIR, args.resume, args.sweep_id, args.storage,
                                 storage_chosen=bool(args.output_dir or args.storage))
    except ConfigError as exc:
        console.print(f"[red]invalid sweep:[/] {exc}", highlight=False, soft_wrap=True)
        return EXIT_BAD_SPEC
    _print_plan(prepared, console)
    try:
        outcome = run_sweep(prepared, spec, args.address)
    except ConfigError as exc:  # the cluster cannot hold a trial: found after connecting, before any trial
        console.print(f"[red]cannot run the sweep:[/] {exc}", highlight=False, soft_wrap=True)
        return EXIT_BAD_SPEC
    client = MlflowClient(outcome.tracking_uri)
    report = build_report(client, client.get_run(outcome.parent_run_id), prepared.layout.sweep_dir / "report")
    print_report(report, outcome.tracking_uri, console)
    if outcome.failed:
        console.print(f"[red]{len(outcome.failed)} of {outcome.trials} trial(s) failed:[/] {', '.join(outcome.failed)}")
    if outcome.unfinished:
        console.print(f"[yellow]interrupted; {len(outcome.unfinished)} trial(s) unfinished:[/] {', '.join(outcome.unfinished)}")
    if outcome.failed or outcome.unfinished:
        command = ["python", "-m", "sweeps.run", args.spec, *(f"--set={item}" for item in args.set),
                   f"--output-dir={args.output_dir or DEFAULT_OUTPUT_DIR}",
                   *([f"--storage={args.storage}"] if args.storage else []),
                   f"--resume={outcome.sweep_id}"]
        console.print(f"Rerun only the unfinished trials with: {shlex.join(command)}", highlight=False, soft_wrap=True)
        return EXIT_TRIAL_FAILED if outcome.failed else EXIT_INTERRUPTED
    console.print(f"[green]all {outcome.trials} trial(s) finished[/]")
    return 0


def _print_plan(prepared: PreparedSweep, console: Console) -> None:
    verb = "resuming" if prepared.resume else "starting"
    table = Table(title=f"{verb} sweep {prepared.record.sweep_id} ({len(prepared.trials)} trials)")
    axes = [axis for axis in AXES if any(axis in t.point for t in prepared.trials)]
    table.add_column("trial")
    table.add_column("run name (MLflow, Tune)")
    for axis in axes:
        table.add_column(axis)
    for trial in prepared.trials:
        table.add_row(trial.name, trial_label(trial.point), *(str(trial.point.get(axis, "—")) for axis in axes))
    console.print(table)
    storage = f"   storage: {prepared.layout.durable.uri}" if prepared.layout.durable.remote else ""
    console.print(f"MLflow: {prepared.record.tracking_uri}   files: {prepared.layout.sweep_dir}{storage}",
                  highlight=False)


if __name__ == "__main__":
    sys.exit(main())
