"""The ``gmts`` command: serve the API, or talk to it.

    gmts serve [--host 127.0.0.1] [--port 8000]
    gmts sweep submit SPEC.yaml|SPEC-NAME [--set key=value …] [--idempotency-key K] [--wait]
    gmts sweep results ID [--json] [--metric M]  gmts sweep logs ID [--tail N] [--json]
    gmts sweep status|cancel ID                  gmts sweep list [--status S]
    gmts run submit PRESET [--set key=value …] [--idempotency-key K] [--wait]
    gmts run status|cancel ID    gmts run logs ID [--tail N] [--json]    gmts run list [--status S]

The client side reads GMTS_API_URL (default http://127.0.0.1:8000) and GMTS_API_TOKEN or
GMTS_API_TOKEN_FILE. ``results`` prints the ablation table and ``logs`` the log as plain text
(``--json`` for machines); the other answers are JSON. A sweep's id is the ``sw-…`` the API gives
it: every command takes it (``name`` is the spec's name, shown in MLflow). Exit status 1 when the
API says no (its message goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from api.client import ApiError, GmtsClient
from api.models import JobLogs, SweepResults

logger = logging.getLogger("gmts")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args.host, args.port)
    try:
        with GmtsClient.from_env(args.url) as client:
            answer = _dispatch(client, args)
            if getattr(args, "json", False) or not isinstance(answer, (SweepResults, JobLogs)):
                _print(answer)
            elif isinstance(answer, JobLogs):
                _print_logs(answer)
            else:
                _print_results(answer, args.metric)
    except ApiError as exc:
        print(f"gmts: {exc}", file=sys.stderr)
        return 1
    except (OSError, yaml.YAMLError, ValueError, TypeError) as exc:
        print(f"gmts: {exc}", file=sys.stderr)
        return 1
    return 0


def _dispatch(client: GmtsClient, args: argparse.Namespace) -> Any:
    sweep = args.command == "sweep"
    action = args.action
    if action == "submit":
        if sweep:
            spec = _spec_overrides(_read_spec(args.spec), args.set)
            status = client.submit_sweep(spec, idempotency_key=args.idempotency_key)
        else:
            status = client.submit_run(args.preset, _overrides(args.set), idempotency_key=args.idempotency_key)
        return client.wait(status.id) if args.wait else status
    if action == "list":
        return (client.list_sweeps if sweep else client.list_runs)(status=args.status)
    calls = {
        "status": client.sweep if sweep else client.run,
        "cancel": client.cancel_sweep if sweep else client.cancel_run,
        "logs": lambda i: (client.sweep_logs if sweep else client.run_logs)(i, tail=args.tail),
        "results": client.sweep_results,
    }
    return calls[action](args.id)


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


def _print_logs(logs: JobLogs) -> None:
    if logs.truncated:
        print(f"[… earlier lines left out: these are the last {len(logs.lines)}; see --tail]", file=sys.stderr)
    for line in logs.lines:
        print(line)


def _print_results(answer: SweepResults, metric: str) -> None:
    from rich.console import Console

    from sweeps.ablation import AblationResults
    from sweeps.table_views import LEGEND, summary, to_rich, wide_tables

    console = Console()
    results = AblationResults.model_validate(answer.results)
    if answer.note:
        console.print(f"[bold yellow]{answer.note}[/]", soft_wrap=True)
    tables = wide_tables(results, metric)
    if not tables:
        console.print(f"No finished trial logged '{metric}': the table is empty.", soft_wrap=True)
    else:
        console.print(f"[bold]Ablation of sweep {answer.sweep_id}[/] ({answer.status}): {metric} (%), {LEGEND}",
                      soft_wrap=True)
        for table in to_rich(results, tables):
            console.print(table)
        console.print(summary(results), soft_wrap=True)
    console.print(f"MLflow parent run: {answer.parent_run_id}", soft_wrap=True, highlight=False)


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
    parser = argparse.ArgumentParser(prog="gmts", description="gmts-lab control plane: serve it, or use it.")
    parser.add_argument("--url", help="API base URL (default $GMTS_API_URL or http://127.0.0.1:8000)")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the API server (settings from GMTS_* variables)")
    serve.add_argument("--host", help="bind address (default $GMTS_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default $GMTS_PORT or 8000)")

    for kind in ("sweep", "run"):
        group = commands.add_parser(kind, help=f"submit and watch {kind}s").add_subparsers(dest="action", required=True)
        submit = group.add_parser("submit", help=f"submit a {kind}")
        if kind == "sweep":
            submit.add_argument("spec", help="sweep spec YAML file, or a shipped spec name")
            submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                                help="spec override, e.g. max_concurrent_trials=2, grid.seed=[0,1], "
                                     "base.overrides.training.steps=2")
        else:
            submit.add_argument("preset", help="experiment preset name (or a YAML path under the allowed roots)")
            submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
        submit.add_argument("--idempotency-key", help="resubmitting with the same key returns the same submission")
        submit.add_argument("--wait", action="store_true", help="poll until it has finished")
        actions = ["status", "cancel", "logs"] + (["results"] if kind == "sweep" else [])
        for action in actions:
            command = group.add_parser(action)
            command.add_argument("id", help=f"the {kind}'s id ({'sw-' if kind == 'sweep' else 'run-'}…)")
            if action == "logs":
                command.add_argument("--tail", type=int, default=200)
            if action in ("logs", "results"):
                command.add_argument("--json", action="store_true", help="the API's JSON answer, for machines")
            if action == "results":
                command.add_argument("--metric", default="accuracy", help="which eval metric the table shows")
        group.add_parser("list").add_argument("--status", choices=["pending", "running", "succeeded", "failed", "cancelled"])
    return parser


if __name__ == "__main__":
    sys.exit(main())
