"""An S3-compatible object store on loopback for the tests: moto's server (``moto_server``, a real HTTP server that
speaks the S3 API; no MinIO binary installs from the package registries). pyarrow (Tune, the sweep records) and
boto3 (MLflow's artifacts) reach it through the standard AWS environment, as they would reach S3 or MinIO.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3


@contextlib.contextmanager
def s3_server(bucket: str) -> Iterator[dict[str, str]]:
    """Start the server with ``bucket`` in it; yields the environment that points clients at it (the caller sets it
    where its clients run: this process, Ray nodes it starts, subprocesses)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    executable = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    server = subprocess.Popen([executable, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "gmts-test",
           "AWS_SECRET_ACCESS_KEY": "gmts-test", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="gmts-test",
                              aws_secret_access_key="gmts-test", region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:  # not listening yet  # noqa: BLE001
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on 127.0.0.1:{port}") from None
                time.sleep(0.2)
        yield env
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def object_keys(env: dict[str, str], bucket: str, prefix: str = "") -> list[str]:
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"])
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
