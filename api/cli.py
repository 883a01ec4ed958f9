"""The ``gmts`` command: run the service on this machine, serve the API, or talk to it.

    gmts up [--ray-address URL [--ray-token-file F]] [--tracking-uri URI] [--port N] [--mlflow-port N]
            [--ray-port N] [--ray-dashboard-port N]     Ray head, MLflow server and API on 127.0.0.1
    gmts status          gmts down          eval "$(gmts env)"   (GMTS_API_URL, GMTS_API_TOKEN)
    gmts serve [--host 127.0.0.1] [--port 8000]
    gmts sweep submit SPEC.yaml|SPEC-NAME [--set key=value …] [--idempotency-key K] [--wait]
    gmts sweep watch|status|results|logs [ID]    (no ID: the newest sweep)
    gmts sweep results [ID] [--metric M]         gmts sweep logs [ID] [--tail N]
    gmts sweep cancel ID                         gmts sweep list [--status S]
    gmts sweep resume ID                         (a failed or cancelled sweep, from its checkpoints)
    gmts run submit PRESET [--set key=value …] [--idempotency-key K] [--wait]
    gmts run watch|status|logs [ID]    gmts run cancel ID    gmts run list [--status S]

``up`` keeps everything in ``$GMTS_HOME`` (default ~/.local/share/gmts-lab): tokens, logs, the stores
and ``stack.json``, from which ``down`` stops exactly what ``up`` started and clients find the API.
The client side reads GMTS_API_URL and GMTS_API_TOKEN or GMTS_API_TOKEN_FILE, else that stack.json.
Answers are tables and plain text for people; ``--json`` prints the API's JSON for machines. ``submit``
prints the new id on stdout; ``watch`` (and ``submit --wait``) follows it, riding out an API restart,
and exits 0 when it succeeded, 1 otherwise, 130 on Ctrl-C (the sweep goes on). A sweep's id is the
``sw-…`` the API gives it (``name`` is the spec's name, shown in MLflow). Exit status 1 when the API
says no (its message goes to stderr, as do its warnings).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from api.client import TERMINAL, ApiError, GmtsClient
from api.models import JobLogs, SubmissionList, SubmissionOut, SweepResults

logger = logging.getLogger("gmts")
T = TypeVar("T")
RETRY_FOR_S = 600.0  # how long watch rides out an unreachable API (a restart takes seconds to a minute)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args.host, args.port)
    from api.local_stack import StackError

    try:
        if args.command in ("up", "down", "status", "env"):
            return _stack(args)
        with GmtsClient.from_env(args.url) as client:
            return _dispatch(client, args)
    except KeyboardInterrupt:
        print("gmts: interrupted", file=sys.stderr)
        return 130
    except (ApiError, StackError, OSError, yaml.YAMLError, ValueError, TypeError) as exc:
        print(f"gmts: {exc}", file=sys.stderr)
        return 1


def _stack(args: argparse.Namespace) -> int:
    from api import local_stack

    if args.command == "up":
        ports = local_stack.Ports.from_env(api=args.port, mlflow=args.mlflow_port, ray=args.ray_port,
                                           ray_dashboard=args.ray_dashboard_port)
        local_stack.up(ports=ports, ray_address=args.ray_address, ray_token_file=args.ray_token_file,
                       tracking_uri=args.tracking_uri, timeout=args.timeout)
        return 0
    if args.command == "down":
        local_stack.down()
        return 0
    if args.command == "env":
        print("\n".join(local_stack.env_lines()))
        return 0
    from rich.table import Table

    rows = local_stack.status()
    table = Table("part", "state", "pid", "URL", title=f"gmts stack in {local_stack.stack_home()}",
                  title_justify="left")
    for row in rows:
        table.add_row(local_stack.TITLES[row.part], row.state, str(row.pid or ""), row.url or "")
    _console().print(table)
    return 0 if all(row.state in ("running", "existing") for row in rows) else 1


def _dispatch(client: GmtsClient, args: argparse.Namespace) -> int:
    kind = args.command
    sweep = kind == "sweep"
    action = args.action
    if action == "submit":
        return _submit(client, args)
    if action == "list":
        listed = (client.list_sweeps if sweep else client.list_runs)(status=args.status)
        _warn(listed)
        _print(listed) if args.json else _print_list(listed)
        return 0
    ident = args.id or _newest(client, kind)
    if action == "watch":
        return _watch(client, ident, args.interval, args.json)
    if action in ("status", "cancel", "resume"):
        answer = {"status": client.sweep if sweep else client.run, "resume": client.resume_sweep,
                  "cancel": client.cancel_sweep if sweep else client.cancel_run}[action](ident)
        _warn(answer)
        _print(answer) if args.json else _print_status(answer)
        return 0
    if action == "logs":
        logs = (client.sweep_logs if sweep else client.run_logs)(ident, tail=args.tail)
        _print(logs) if args.json else _print_logs(logs)
        return 0
    results = client.sweep_results(ident)
    _print(results) if args.json else _print_results(results, args.metric)
    return 0


def _submit(client: GmtsClient, args: argparse.Namespace) -> int:
    if args.command == "sweep":
        spec = _spec_overrides(_read_spec(args.spec), args.set)
        submitted = client.submit_sweep(spec, idempotency_key=args.idempotency_key)
    else:
        submitted = client.submit_run(args.preset, _overrides(args.set), idempotency_key=args.idempotency_key)
    _warn(submitted)
    # The id first, whatever happens next: a wait that fails must not leave the user without it.
    if args.json and not args.wait:
        _print(submitted)
    else:
        print(submitted.id, flush=True)
        print(f"submitted {args.command} {submitted.name}: {submitted.trials.total} trial(s), {submitted.status}; "
              f"follow it with: gmts {args.command} watch {submitted.id}", file=sys.stderr, flush=True)
    return _watch(client, submitted.id, args.interval, args.json) if args.wait else 0


def _newest(client: GmtsClient, kind: str) -> str:
    listed = (client.list_sweeps if kind == "sweep" else client.list_runs)(limit=1)
    if not listed.items:
        raise ValueError(f"no {kind} yet: submit one with `gmts {kind} submit …`")
    newest = listed.items[0]
    print(f"gmts: the newest {kind}: {newest.id} ({newest.name}, {newest.status})", file=sys.stderr)
    return newest.id


def _watch(client: GmtsClient, api_id: str, interval: float, as_json: bool,
           retry_for: float = RETRY_FOR_S) -> int:
    """Print a line whenever the progress changes, until the submission has finished."""
    kind = "run" if api_id.startswith("run-") else "sweep"
    get = client.run if kind == "run" else client.sweep
    shown, warned = "", set()
    try:
        while True:
            current = _retrying(lambda: get(api_id), retry_for)
            for warning in set(current.warnings) - warned:
                print(f"gmts: warning: {warning}", file=sys.stderr)
            warned |= set(current.warnings)
            line = _progress(current)
            if line != shown:
                print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
                shown = line
            if current.status in TERMINAL:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        print(f"gmts: stopped watching; {kind} {api_id} goes on (watch it: gmts {kind} watch {api_id}; "
              f"stop it: gmts {kind} cancel {api_id})", file=sys.stderr)
        return 130
    if as_json:
        _print(current)
    elif current.status == "succeeded":
        print(f"{api_id} succeeded" + (f"; its table: gmts sweep results {api_id}" if kind == "sweep" else ""))
    else:
        print(f"{api_id} {current.status}: {current.message or '(no message)'}; its log: gmts {kind} logs {api_id}")
    return 0 if current.status == "succeeded" else 1


def _progress(status: SubmissionOut) -> str:
    trials = status.trials
    text = f"{status.id} {status.status}: {trials.finished}/{trials.total} trial(s) finished, {trials.running} running"
    extra = [f"{count} {what}" for count, what in ((trials.failed, "failed"), (trials.killed, "killed")) if count]
    return text + "".join(f", {part}" for part in extra)


def _retrying(call: Callable[[], T], limit_s: float, sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, retried with backoff (1, 2, 4 … 15 s) while the API is unreachable or answers 502/503/504,
    for up to ``limit_s``; any other error at once."""
    deadline, delay = None, 1.0
    while True:
        try:
            answer = call()
        except ApiError as exc:
            if not exc.transient:
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + limit_s
                print(f"gmts: {exc}; retrying for up to {limit_s:.0f} s", file=sys.stderr, flush=True)
            if now + delay > deadline:
                raise
            sleep(delay)
            delay = min(2 * delay, 15.0)
            continue
        if deadline is not None:
            print("gmts: the API answers again", file=sys.stderr, flush=True)
        return answer


def _read_spec(source: str) -> dict[str, Any]:
    """A YAML file, or the name of a shipped spec (sweeps/specs/NAME.yaml)."""
    path = Path(source)
    if path.is_file():
        text = path.read_text()
    else:
        shipped = resources.files("sweeps.specs") / f"{source}.yaml"
        if not shipped.is_file():
            raise ValueError(f"{source!r} is neither a file nor a shipped spec name")
        text = shipped.read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise TypeError(f"{source}: a sweep spec is a YAML mapping, not a {type(data).__name__}")
    return data


def _overrides(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are YAML scalars, as with ``--set`` of orchestrator.train."""
    overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected key.path=value")
        overrides[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
    return overrides


def _spec_overrides(spec: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """``--set`` on a sweep spec: ``max_concurrent_trials=2``, ``grid.seed=[0,1]``; a key under
    ``base.overrides.`` stays one dotted config key (``base.overrides.training.steps=2``), as in the spec."""
    for key, value in _overrides(items).items():
        if key.startswith("base.overrides."):
            base = spec.setdefault("base", {})
            base.setdefault("overrides", {})[key.removeprefix("base.overrides.")] = value
            continue
        node = spec
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is a value, not a section")
        node[leaf] = value
    return spec


def _console(width: int | None = None):
    from rich.console import Console

    return Console(width=width, highlight=False)


def _warn(answer: SubmissionOut | SubmissionList) -> None:
    for warning in answer.warnings:
        print(f"gmts: warning: {warning}", file=sys.stderr)


def _print_list(listed: SubmissionList, console=None) -> None:
    from rich.table import Table

    table = Table("id", "name", "status", "trials", "created (UTC)")
    table.columns[0].no_wrap = True
    for item in listed.items:
        table.add_row(item.id, item.name, item.status, _trials(item), item.created_at.strftime("%m-%d %H:%M"))
    (console or _console()).print(table if listed.items else "nothing yet")


def _print_status(answer: SubmissionOut, console=None) -> None:
    from rich.table import Table

    table = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    rows = [("id", answer.id), ("name", f"{answer.name} ({answer.kind})"),
            ("status", answer.status + (f" (Ray: {answer.ray_status})" if answer.ray_status else "")
             + (", cancel requested" if answer.cancel_requested and answer.status != "cancelled" else "")),
            ("trials", _trials(answer)), ("message", answer.message),
            ("created", f"{answer.created_at:%Y-%m-%d %H:%M:%S} UTC"),
            ("updated", f"{answer.updated_at:%Y-%m-%d %H:%M:%S} UTC"),
            ("MLflow run", answer.mlflow.run_id or "not yet"), ("MLflow UI", answer.mlflow.ui_url or "")]
    for key, value in rows:
        if value:
            table.add_row(key, value)
    (console or _console()).print(table)


def _trials(item: SubmissionOut) -> str:
    trials = item.trials
    parts = [f"{trials.finished}/{trials.total} finished"]
    parts += [f"{count} {what}" for count, what in
              ((trials.running, "running"), (trials.failed, "failed"), (trials.killed, "killed")) if count]
    return ", ".join(parts)


def _print_logs(logs: JobLogs) -> None:
    if logs.truncated:
        print(f"[… earlier lines left out: these are the last {len(logs.lines)}; see --tail]", file=sys.stderr)
    for line in logs.lines:
        print(line)


def _print_results(answer: SweepResults, metric: str, console=None) -> None:
    from sweeps.ablation import AblationResults
    from sweeps.table_views import LEGEND, summary, to_rich, wide_tables

    console = console or _console()
    results = AblationResults.model_validate(answer.results)
    if answer.note:
        console.print(f"[bold yellow]{answer.note}[/]")
    tables = wide_tables(results, metric)
    if not tables:
        console.print(f"No finished trial logged '{metric}': the table is empty.")
    else:
        # Title and legend apart, each wrapped at word boundaries: the id stays whole on a narrow terminal.
        console.print(f"[bold]Ablation of sweep {answer.sweep_id}[/] ({answer.status}): {metric} (%)")
        console.print(LEGEND, style="dim")
        for table in to_rich(results, tables):
            console.print(table)
        console.print(summary(results))
    console.print(f"MLflow parent run: {answer.parent_run_id}")


def _print(answer: Any) -> None:
    data = answer.model_dump(mode="json") if isinstance(answer, BaseModel) else answer
    print(json.dumps(data, indent=2))


def _serve(host: str | None, port: int | None) -> int:
    import uvicorn

    from api.deferred import DeferredApp
    from api.settings import ApiSettings, SettingsError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        overrides = {key: value for key, value in (("host", host), ("port", port)) if value is not None}
        settings = ApiSettings(**overrides)
        settings.bearer_token()  # no token, no service: refused before anything listens
        settings.ray_token()
    except (SettingsError, ValueError) as exc:
        print(f"gmts serve: {exc}", file=sys.stderr)
        return 2
    if settings.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("binding to %s: the API is reachable from the network; put TLS in front of it", settings.host)

    def load():
        # Seconds to a minute of imports (request models, MLflow): behind a listening server (api/deferred.py).
        from api.app import create_app

        app = create_app(settings)
        app.state.plane.start_background(settings.reconcile_interval_s)
        return app, app.state.plane.close

    uvicorn.run(DeferredApp(load), host=settings.host, port=settings.port, log_level="info",
                access_log=settings.access_log)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmts", description="gmts-lab control plane: run it, serve it, or use it.")
    parser.add_argument("--url", help="API base URL (default $GMTS_API_URL, else the one `gmts up` recorded, "
                                      "else http://127.0.0.1:8000)")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="start a Ray head, an MLflow server and the API on 127.0.0.1 "
                                        "(what is not running yet)")
    up.add_argument("--ray-address", help="use this Ray cluster's Jobs API (http://host:8265) instead of starting a head")
    up.add_argument("--ray-token-file", type=Path, help="token file of that cluster (RAY_AUTH_MODE=token)")
    up.add_argument("--tracking-uri", help="use this MLflow tracking server (or sqlite:///… store) instead of starting one")
    up.add_argument("--port", type=int, help="the API's port (default $GMTS_PORT or 8000)")
    up.add_argument("--mlflow-port", type=int, help="the MLflow server's port (default $GMTS_MLFLOW_PORT or 5000)")
    up.add_argument("--ray-port", type=int, help="the Ray head's GCS port (default $GMTS_RAY_PORT or 6379)")
    up.add_argument("--ray-dashboard-port", type=int,
                    help="the Ray dashboard / Jobs API port (default $GMTS_RAY_DASHBOARD_PORT or 8265)")
    up.add_argument("--timeout", type=float, default=600.0, help="seconds each part may take to answer (default 600)")
    commands.add_parser("down", help="stop exactly what `gmts up` started")
    commands.add_parser("status", help="what `gmts up` started, and whether it answers")
    commands.add_parser("env", help='export lines of GMTS_API_URL and GMTS_API_TOKEN: eval "$(gmts env)"')

    serve = commands.add_parser("serve", help="run the API server (settings from GMTS_* variables)")
    serve.add_argument("--host", help="bind address (default $GMTS_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default $GMTS_PORT or 8000)")

    for kind in ("sweep", "run"):
        group = commands.add_parser(kind, help=f"submit and watch {kind}s").add_subparsers(dest="action", required=True)
        submit = group.add_parser("submit", help=f"submit a {kind}; prints its id")
        if kind == "sweep":
            submit.add_argument("spec", help="sweep spec YAML file, or a shipped spec name")
            submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                                help="spec override, e.g. max_concurrent_trials=2, grid.seed=[0,1], "
                                     "base.overrides.training.steps=2")
        else:
            submit.add_argument("preset", help="experiment preset name (or a YAML path under the allowed roots)")
            submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
        submit.add_argument("--idempotency-key", help="resubmitting with the same key returns the same submission")
        submit.add_argument("--wait", action="store_true", help="then follow it until it has finished (as watch)")
        actions = ["submit", "watch", "status", "cancel", "logs", "list"] + (["results", "resume"] if kind == "sweep" else [])
        for action in actions:
            command = submit if action == "submit" else group.add_parser(action)
            if action in ("watch", "status", "logs", "results"):
                command.add_argument("id", nargs="?", help=f"the {kind}'s id (default: the newest {kind})")
            if action in ("cancel", "resume"):
                command.add_argument("id", help=f"the {kind}'s id ({'sw-' if kind == 'sweep' else 'run-'}…)")
            if action in ("submit", "watch"):
                command.add_argument("--interval", type=float, default=5.0, help="seconds between looks (default 5)")
            if action == "logs":
                command.add_argument("--tail", type=int, default=200)
            if action == "results":
                command.add_argument("--metric", default="accuracy", help="which eval metric the table shows")
            if action == "list":
                command.add_argument("--status", choices=["pending", "running", "succeeded", "failed", "cancelled"])
            command.add_argument("--json", action="store_true", help="the API's JSON answer, for machines")
    return parser


if __name__ == "__main__":
    sys.exit(main())
