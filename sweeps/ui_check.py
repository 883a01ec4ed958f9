"""Look at a sweep in the MLflow UI as a user would: a real ``mlflow ui`` on loopback, a headless Chromium.

    python -m sweeps.ui_check SWEEP [--tracking-uri URI] [--screenshots DIR]

Opens the sweep's parent run and the compare view of its trials (the two URLs the sweep's end prints), and
the first arm's last completions table (the report's first "what the model says" link); checks that the
parent's page shows its summary metrics and the ablation table, that the compare view names every trial and
that the table's page shows its first row's completion and reference, and (``--screenshots``) saves the pages
as PNGs. Needs ``chromium`` (Debian's
package) on PATH. Exit status 0 when everything was visible, 1 when something was not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient

from sweeps.completions import CompletionTable, arm_tables
from sweeps.parent_summary import compare_url, run_url
from sweeps.results import find_parent, read_sweep

# Virtual time Chromium grants the page before dumping it: the UI fetches the run, then renders.
RENDER_BUDGET_MS = 30_000
WINDOW = (1500, 1100)
UI_START_TIMEOUT_S = 180.0  # `mlflow ui` takes ~30 s to start on 2 busy cores


@dataclass(frozen=True)
class PageCheck:
    url: str
    expected: list[str]  # texts that must be on the rendered page
    missing: list[str]
    screenshot: Path | None = None


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def mlflow_ui(tracking_uri: str) -> Iterator[str]:
    """``mlflow ui`` over ``tracking_uri`` on a free loopback port; yields its base URL, stops it after."""
    port = _free_port()
    log = tempfile.TemporaryFile()
    # Pages only: no job runner (eight processes for MLflow's GenAI jobs, as api/local_stack.py says).
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri, "--host",
                             "127.0.0.1", "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + UI_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"mlflow ui exited with {proc.returncode}: {log.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlflow ui did not answer on {base} within {UI_START_TIMEOUT_S:.0f} s")
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def render(url: str, screenshot: Path | None = None) -> str:
    """The page's text after its scripts ran (a fresh profile: no view remembered from an earlier visit).

    One Chromium run dumps the DOM and takes the screenshot: both show the page at the same moment, and a
    browser start (seconds on 2 busy cores) is paid once per page."""
    with tempfile.TemporaryDirectory(prefix="gmts-chromium-") as profile:
        command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                   f"--virtual-time-budget={RENDER_BUDGET_MS}", "--dump-dom"]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            command.append(f"--screenshot={screenshot}")
        dom = subprocess.run([*command, url], capture_output=True, text=True, timeout=180, check=True).stdout
    if screenshot is not None and not screenshot.is_file():
        raise RuntimeError(f"chromium dumped {url} but wrote no screenshot to {screenshot}")
    return _text(dom)


def _text(dom: str) -> str:
    """Visible text, roughly: scripts and styles dropped, tags removed, whitespace collapsed."""
    dom = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", dom)
    text = re.sub(r"<[^>]+>", " ", dom)
    for entity, char in (("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"), ("&nbsp;", " "), ("&#x27;", "'"),
                         ("&quot;", '"')):
        text = text.replace(entity, char)
    return re.sub(r"\s+", " ", text)


def check_sweep(tracking_uri: str, sweep: str, screenshots: Path | None = None) -> list[PageCheck]:
    """Render the parent run and the compare view; report what each page was expected to show and did not."""
    client = MlflowClient(tracking_uri)
    parent = find_parent(client, sweep)
    runs = read_sweep(client, parent)
    summary = sorted(k for k in parent.data.metrics if k.endswith("/mean"))
    if not summary:
        raise ValueError(f"parent run {parent.info.run_id} has no summary metrics (run sweeps.report first)")
    # The ablation table's first number column, row by row, as the run's description shows it.
    table_cells = [line.split("|")[3].strip() for line in parent.data.tags.get("mlflow.note.content", "").splitlines()
                   if line.startswith("| ") and not line.startswith("| method ")]
    shown = arm_tables(client, runs)
    checks = []
    with mlflow_ui(tracking_uri) as base:
        pages = [
            (run_url(base, runs.experiment_id, parent.info.run_id), [*summary[:3], *table_cells],
             "parent_run.png"),
            (compare_url(base, runs.experiment_id, [t.run_id for t in runs.trials]),
             [client.get_run(t.run_id).info.run_name for t in runs.trials], "compare_trials.png"),
        ]
        if shown:
            pages.append((shown[0].url(base, runs.experiment_id), _first_row(client, shown[0]), "completions.png"))
        for url, expected, png in pages:
            shot = None if screenshots is None else screenshots / png
            text = render(url, shot)
            checks.append(PageCheck(url, expected, [e for e in expected if e not in text], shot))
    return checks


def _first_row(client: MlflowClient, table: CompletionTable) -> list[str]:
    """The completion and the reference of the table's first row, as the page's text shows them."""
    with tempfile.TemporaryDirectory() as tmp:
        content = json.loads(Path(client.download_artifacts(table.run_id, table.path, tmp)).read_text())
    first = dict(zip(content["columns"], content["data"][0]))
    return [re.sub(r"\s+", " ", str(first[column])).strip() for column in ("completion", "reference")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.ui_check", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="sweep id, spec name (newest sweep) or parent run id")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///runs/mlflow.db"))
    parser.add_argument("--screenshots", type=Path,
                        help="save parent_run.png, compare_trials.png and completions.png here")
    args = parser.parse_args(argv)
    checks = check_sweep(args.tracking_uri, args.sweep, args.screenshots)
    for check in checks:
        state = "ok" if not check.missing else f"MISSING {check.missing}"
        print(f"{state}: {check.url}" + (f" → {check.screenshot}" if check.screenshot else ""))
    return 0 if all(not c.missing for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
