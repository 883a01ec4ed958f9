"""The ``gmts`` command: serve the API, or talk to it.

    gmts serve [--host 127.0.0.1] [--port 8000]
    gmts sweep submit SPEC.yaml|SPEC-NAME [--idempotency-key K] [--wait]
    gmts sweep status|results|cancel|logs ID     gmts sweep list [--status S]
    gmts run submit PRESET [--set key=value …] [--idempotency-key K] [--wait]
    gmts run status|cancel|logs ID               gmts run list [--status S]

The client side reads GMTS_API_URL (default http://127.0.0.1:8000) and GMTS_API_TOKEN or
GMTS_API_TOKEN_FILE; answers are printed as JSON. Exit status 1 when the API says no (its message
goes to stderr).
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

logger = logging.getLogger("gmts")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args.host, args.port)
    try:
        with GmtsClient.from_env(args.url) as client:
            _print(_dispatch(client, args))
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
            status = client.submit_sweep(_read_spec(args.spec), idempotency_key=args.idempotency_key)
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


def _print(answer: Any) -> None:
    data = answer.model_dump(mode="json") if isinstance(answer, BaseModel) else answer
    print(json.dumps(data, indent=2))


def _serve(host: str | None, port: int | None) -> int:
    import uvicorn

    from api.app import create_app
    from api.settings import ApiSettings, SettingsError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        overrides = {key: value for key, value in (("host", host), ("port", port)) if value is not None}
        settings = ApiSettings(**overrides)
        app = create_app(settings)
    except SettingsError as exc:
        print(f"gmts serve: {exc}", file=sys.stderr)
        return 2
    if settings.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("binding to %s: the API is reachable from the network; put TLS in front of it", settings.host)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
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
        else:
            submit.add_argument("preset", help="experiment preset name (or a YAML path under the allowed roots)")
            submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
        submit.add_argument("--idempotency-key", help="resubmitting with the same key returns the same submission")
        submit.add_argument("--wait", action="store_true", help="poll until it has finished")
        actions = ["status", "cancel", "logs"] + (["results"] if kind == "sweep" else [])
        for action in actions:
            command = group.add_parser(action)
            command.add_argument("id")
            if action == "logs":
                command.add_argument("--tail", type=int, default=200)
        group.add_parser("list").add_argument("--status", choices=["pending", "running", "succeeded", "failed", "cancelled"])
    return parser


if __name__ == "__main__":
    sys.exit(main())
