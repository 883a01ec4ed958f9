"""The console choice: third-party INFO off unless verbose, carried to Ray workers by the job's runtime_env."""

from __future__ import annotations

import logging

import pytest

from orchestrator import console_logs


@pytest.fixture
def restore_logging(monkeypatch: pytest.MonkeyPatch):
    levels = {name: logging.getLogger(name).level for name in console_logs.THIRD_PARTY_LOGGERS}
    for key in (console_logs.VERBOSE_ENV, *console_logs.QUIET_ENV):
        # set, then delete: monkeypatch then restores the original state (absent or not) of what configure() sets
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)
    yield
    logging.disable(logging.NOTSET)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_quiet_by_default(restore_logging, monkeypatch: pytest.MonkeyPatch) -> None:
    console_logs.configure(verbose_logs=False)
    assert logging.getLogger("vllm").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("DeepSpeed").level == logging.WARNING
    env = console_logs.runtime_env()
    assert env["env_vars"]["VLLM_LOGGING_LEVEL"] == "ERROR" and env["env_vars"][console_logs.VERBOSE_ENV] == "0"
    hook = env["worker_process_setup_hook"]
    module, name = hook.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is console_logs.quiet_worker  # importable by workers
    # In a worker: INFO dropped (what DeepSpeed's own handler would print) until a trial takes it back.
    console_logs.quiet_worker()
    assert not logging.getLogger("DeepSpeed").isEnabledFor(logging.INFO)
    assert not logging.getLogger("orchestrator.train").isEnabledFor(logging.INFO)
    console_logs.restore_info()
    logging.getLogger("orchestrator.train").setLevel(logging.INFO)
    assert logging.getLogger("orchestrator.train").isEnabledFor(logging.INFO)
    assert not logging.getLogger("vllm").isEnabledFor(logging.INFO)


def test_verbose_keeps_everything(restore_logging, monkeypatch: pytest.MonkeyPatch) -> None:
    console_logs.configure(verbose_logs=True)
    assert console_logs.verbose()
    assert "worker_process_setup_hook" not in console_logs.runtime_env()
    console_logs.quiet_worker()
    assert logging.root.manager.disable == logging.NOTSET  # the hook dropped nothing
