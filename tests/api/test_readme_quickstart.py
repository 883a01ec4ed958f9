"""The README's quickstart of the service, run as written, in one bash shell.

The block is the fenced ```bash block right after the line ``MARKER`` in README.md (or, where the
README has no such line yet, in api/README.md's "Run it"). It runs with ``GMTS_HOME`` in a fresh
folder and free ports through the environment (GMTS_PORT, GMTS_MLFLOW_PORT, GMTS_RAY_PORT,
GMTS_RAY_DASHBOARD_PORT), so it shares nothing with a stack the user may run; the model cache
~/.cache/gmts-lab is the user's, so the cpu-smoke warm-up comes from it. Each command must exit 0,
the sweep must succeed with a two-row table, curl must list it, and after ``gmts down`` no process
that ``gmts up`` started (nor any descendant of theirs) may be alive, while a process named like Ray's
(what ``ray stop`` would kill) still is. After ``gmts up`` the test also runs ``AFTER_UP``: a second
``gmts up`` must start nothing, and ``gmts up --ray-address … --tracking-uri …`` in another folder
only an API, which its ``gmts down`` stops alone.

The block runs in a bash process of its own (``QuickstartRun``), started through the ``readme_quickstart``
fixture: with the API integration module where a session runs both, else by the test itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.api.support import free_port

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- quickstart-rest: run as written by tests/api/test_readme_quickstart.py -->"
# After the block's first command (gmts up): a second `gmts up` starts nothing, `gmts status` sees all,
# and a stack of its own in another folder puts only an API in front of that Ray head and MLflow server.
AFTER_UP = [
    "gmts up",
    "gmts status",
    'GMTS_HOME="$1/home2" GMTS_PORT=$GMTS_PORT2 gmts up --ray-address "http://127.0.0.1:$GMTS_RAY_DASHBOARD_PORT"'
    ' --ray-token-file "$GMTS_HOME/ray-token" --tracking-uri "http://127.0.0.1:$GMTS_MLFLOW_PORT"',
    'GMTS_HOME="$1/home2" gmts down',
]
SNAPSHOT = """import json, os, psutil, sys
rows = []
for p in psutil.process_iter(["pid", "ppid", "create_time"]):
    try:
        rows.append({**p.info, "pgid": os.getpgid(p.pid)})
    except (psutil.Error, ProcessLookupError):
        pass
json.dump(rows, open(sys.argv[1], "w"))
"""


def quickstart() -> tuple[Path, list[str]]:
    """The marked block's commands (continuation lines joined), and the file it came from."""
    for doc in (REPO / "README.md", REPO / "api" / "README.md"):
        text = doc.read_text()
        if MARKER not in text:
            continue
        after = text.split(MARKER, 1)[1].lstrip("\n")
        assert after.startswith("```bash\n"), f"{doc}: the line after {MARKER} must open a ```bash block"
        block = after.removeprefix("```bash\n").split("\n```", 1)[0]
        commands = re.sub(r"\\\n\s*", " ", block).splitlines()
        return doc, [line for line in commands if line.strip() and not line.lstrip().startswith("#")]
    raise AssertionError(f"neither README.md nor api/README.md has the line {MARKER}")


def test_the_quickstart_block_is_there() -> None:
    _, commands = quickstart()
    assert commands[0].startswith("gmts up") and commands[-1].startswith("gmts down")


def _script(commands: list[str], out: Path) -> str:
    """Each command in the one shell (``eval`` must reach the next ones), its output, status and the
    machine's processes after it kept apart."""
    lines = ["cd \"$1\""]
    for n, command in enumerate(commands):
        lines += ["{", command, f"}} >{out}/out.{n} 2>{out}/err.{n}", f"echo $? >{out}/rc.{n}",
                  f"cp \"$GMTS_HOME/stack.json\" {out}/stack.{n} 2>/dev/null",
                  f"ls -A \"$GMTS_HOME/tmp\" >{out}/tmp.{n} 2>/dev/null",
                  f"\"$GMTS_TEST_PYTHON\" {out}/snapshot.py {out}/ps.{n}"]
    return "\n".join(lines) + "\n"


def _descendants(rows: list[dict], roots: set[int], groups: set[int]) -> set[int]:
    found = {row["pid"] for row in rows if row["pid"] in roots or row["pgid"] in groups}
    while True:
        more = {row["pid"] for row in rows if row["ppid"] in found} - found
        if not more:
            return found
        found |= more


def _alive(pid: int, create_time: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - create_time) < 1 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class QuickstartRun:
    """The marked block with ``AFTER_UP``, run as written by one bash process of its own: ``start`` launches it
    and returns, ``wait`` gives its outcome, ``stop`` ends whatever it left (idempotent). The API integration
    module starts it beside itself (tests/api/conftest.py): each leaves a core idle much of its time."""

    def __init__(self) -> None:
        self.doc, block = quickstart()
        self.commands = [block[0], *AFTER_UP, *block[1:]]
        # Short: Ray's temp dir goes under it, and its unix socket paths may have at most 107 characters.
        self.work = Path(tempfile.mkdtemp(prefix="gq-", dir="/tmp"))
        self.home, self.out = self.work / "home", self.work / "out"
        self.out.mkdir()
        (self.out / "snapshot.py").write_text(SNAPSHOT)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("GMTS_", "RAY_", "MLFLOW_"))}
        env.update(GMTS_HOME=str(self.home), GMTS_PORT=str(free_port()), GMTS_MLFLOW_PORT=str(free_port()),
                   GMTS_RAY_PORT=str(free_port()), GMTS_RAY_DASHBOARD_PORT=str(free_port()),
                   GMTS_PORT2=str(free_port()), GMTS_TEST_PYTHON=sys.executable,
                   PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
                   # this checkout's code, also where the venv's editable install points at another one
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
        self.env = env
        self.decoy: subprocess.Popen | None = None
        self.shell: subprocess.Popen | None = None

    def start(self) -> None:
        # Another "Ray" of ours: gmts down must not touch it (ray stop would, by its name).
        self.decoy = subprocess.Popen(["bash", "-c", "exec -a raylet sleep 3000"], start_new_session=True)
        with open(self.out / "shell.err", "w") as err:
            self.shell = subprocess.Popen(["bash", "-c", _script(self.commands, self.out), "quickstart",
                                           str(self.work)], env=self.env, stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True)

    def wait(self, timeout: float) -> tuple[int, str]:
        """The shell's exit status and the end of its stderr."""
        returncode = self.shell.wait(timeout=timeout)
        return returncode, (self.out / "shell.err").read_text()[-3000:]

    def stop(self) -> None:
        if self.shell is not None and self.shell.poll() is None:
            os.killpg(self.shell.pid, signal.SIGKILL)  # an unfinished block (the test stopped early)
            self.shell.wait()
        if self.decoy is not None:
            self.decoy.kill()
            self.decoy.wait()
        if (self.home / "stack.json").exists():  # whatever the block left running
            subprocess.run([sys.executable, "-m", "api.cli", "down"], env=self.env, cwd=REPO, timeout=300,
                           check=False)
        # What a `gmts up` killed before it recorded a part left running in a session of its own, and the
        # API that AFTER_UP starts in its own home.
        for process in psutil.process_iter():
            try:
                if process.environ().get("GMTS_HOME", "").startswith(f"{self.work}/"):
                    process.kill()
            except psutil.Error:
                pass
        if not os.environ.get("GMTS_IT_KEEP"):
            shutil.rmtree(self.work, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_readme_quickstart_runs_as_written(readme_quickstart: QuickstartRun) -> None:
    run = readme_quickstart
    doc, commands, home, out, decoy = run.doc, run.commands, run.home, run.out, run.decoy
    try:
        returncode, stderr = run.wait(timeout=2700)
        assert returncode == 0, stderr
        outputs = []
        for n, command in enumerate(commands):
            stdout, stderr = (out / f"out.{n}").read_text(), (out / f"err.{n}").read_text()
            rc = int((out / f"rc.{n}").read_text())
            assert rc == 0, f"{doc.name}: `{command}` exited {rc}\n{stdout[-3000:]}\n{stderr[-3000:]}"
            outputs.append(stdout)
        by_name = {command.split("#")[0].strip(): text for command, text in zip(commands, outputs)}
        assert outputs[1].count("already running") == 3, outputs[1]
        assert json.loads((out / "stack.0").read_text()) == json.loads((out / "stack.1").read_text())
        assert outputs[2].count("running") == 3, outputs[2]
        assert "existing cluster" in outputs[3] and "existing server" in outputs[3], outputs[3]
        assert re.search(r"API .* started \(pid \d+\)", outputs[3]), outputs[3]
        assert outputs[4].startswith("API: stopped (1 process(es)") and "Ray" not in outputs[4], outputs[4]

        sweep_id = by_name["gmts sweep submit cpu-smoke"].strip()
        assert re.fullmatch(r"sw-[0-9a-f]{16}", sweep_id), by_name["gmts sweep submit cpu-smoke"]
        assert f"{sweep_id} succeeded" in by_name["gmts sweep watch"]
        table = by_name["gmts sweep results"]
        assert f"Ablation of sweep {sweep_id}" in table
        rows = [line for line in table.splitlines() if re.match(r"│ (ets|gmts)-release", line)]
        assert len(rows) == 2, table
        curl = next(text for command, text in zip(commands, outputs) if command.startswith("curl"))
        listed = json.loads(curl)["items"]
        assert [(item["id"], item["status"]) for item in listed] == [(sweep_id, "succeeded")]

        # gmts down: nothing that gmts up started is alive, other Ray clusters are
        before_down = len(commands) - 2
        stack = json.loads((out / f"stack.{before_down}").read_text())
        started = {part["pid"] for part in (stack[name] for name in ("ray", "mlflow", "api"))}
        rows = json.loads((out / f"ps.{before_down}").read_text())
        family = _descendants(rows, started, started)
        assert len(family) > 10  # Ray's gcs_server, raylet, dashboard, workers; MLflow's workers …
        # MLflow as a tracking server only: its CLI and one uvicorn worker, no job runner's huey consumers
        mlflow = _descendants(rows, {stack["mlflow"]["pid"]}, {stack["mlflow"]["pid"]})
        assert len(mlflow) == 2, mlflow
        times = {row["pid"]: row["create_time"] for row in rows}
        assert [pid for pid in family if _alive(pid, times[pid])] == []
        assert decoy.poll() is None
        assert json.loads((home / "stack.json").read_text()) == {"home": str(home)}
        # Python temp files of the head's processes went into the stack's folder (Ray's dashboard runs a
        # multiprocessing forkserver, whose pymp-* folder outlives the node), and left with the head.
        assert stack["ray"]["scratch_dir"] == str(home / "tmp")
        assert any(name.startswith("pymp-") for name in (out / f"tmp.{before_down}").read_text().split())
        assert not (home / "tmp").exists()

        # owner-only: the folder, tokens, stack.json, logs, stores (Ray's temp dir is world-writable by
        # Ray's own choice; it is inside the owner-only folder)
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for name in ("stack.json", "api-token", "ray-token"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
        loose = [str(path) for path in home.rglob("*") if not path.is_symlink() and (home / "ray") not in path.parents
                 and path != home / "ray" and path.stat().st_mode & 0o077]
        assert loose == []
    finally:
        run.stop()
