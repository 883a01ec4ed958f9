"""Property-based run of the OpenAPI spec (schemathesis): whatever a client sends that the schema
allows (and much that it does not), the server answers without a 5xx, within its own schema, and
schema and validation agree.

``test_schemathesis_finds_nothing`` runs schemathesis' own CLI — every check (``--checks all``:
server errors, status codes, content types, response schemas and headers, schema-valid requests
accepted, schema-invalid ones rejected, unsupported methods and their ``Allow`` header, missing
headers, ignored auth, use after free, resource availability) and every phase: coverage, fuzzing
and the stateful phase, which chains calls along the links schemathesis infers (POST → GET/cancel
…) — against the real app under uvicorn on loopback, with the fake Ray Jobs backend (conftest.py):
valid random specs do get "submitted". It must report 0 findings.

One allowance, and why: a body can be schema-valid and still refused, 422 naming the field, because
it names a preset, a config key or a path the server does not have (``overrides`` are dotted config
keys with values of any type; presets and paths depend on the server's disk), or 413 because it is
larger than GMTS_MAX_BODY_BYTES; JSON Schema cannot say either. So for the two submit operations
only, the ``positive_data_acceptance`` check also expects 413/422 (and ``negative_data_rejection``
counts 413 as the rejection it is). Everything the schema *can* say
it says (preset non-empty, grid axes non-empty with their value ranges and enums, axis names in
``trials``/``exclude``, the limits of api/limits.py on trial counts); test_schema_says_what_is_accepted
pins what an attacker-style review found, so that the allowance cannot hide them again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from jsonschema import Draft202012Validator

from api.app import create_app
from tests.api.support import TOKEN, bearer, serve, sweep_body

# No shrinking: a failure is reported as found (Hypothesis prints it); shrinking can take minutes here.
PHASES = (Phase.explicit, Phase.generate)
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
CONFIG = """
headers = {{ Authorization = "Bearer {token}" }}
[parameters]
sweep_id = "{sweep_id}"
run_id = "{run_id}"

# Resume answers a valid request by the sweep's state: 409 while it is pending or running, or once it succeeded.
[[operations]]
include-name = "POST /v1/sweeps/{{sweep_id}}/resume"
checks.positive_data_acceptance.expected-statuses = ["2XX", "404", "409"]

[[operations]]
include-path-regex = "^/v1/(sweeps|runs)$"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2XX", "413", "422"]
# 413 is a rejection too (schemathesis' default list for schema-violating bodies lacks it)
checks.negative_data_rejection.expected-statuses = ["400", "401", "404", "405", "409", "413", "415", "422", "5XX"]

"""


def _operations(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.slow  # hundreds of generated requests
def test_schemathesis_finds_nothing(settings_, jobs, tmp_path: Path) -> None:
    with serve(create_app(settings_, jobs)) as url:
        with httpx.Client(base_url=url, headers=bearer(), timeout=60) as http:
            # Known ids, so that calls on /v1/sweeps/{id}/… reach real records, not only 404s.
            sweep = http.post("/v1/sweeps", json=sweep_body()).json()
            run = http.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"training.steps": 1}}).json()
        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG.format(token=TOKEN, sweep_id=sweep["id"], run_id=run["id"]))
        done = subprocess.run(
            [str(SCHEMATHESIS), "--config-file", str(config), "run", f"{url}/openapi.json", "--checks", "all",
             "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", "10", "--generation-deterministic",
             "--no-color"],
            capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path)  # its cache dir goes there
    report = done.stdout + done.stderr
    stateful = report.find("Stateful (")
    print(report[stateful:stateful + 300], report.split("SUMMARY")[-1])  # phases, links covered, test cases
    assert done.returncode == 0, report[:20000]
    assert "Selected: 14/14" in report and "Tested: 14" in report  # 12 under /v1, /healthz, /readyz
    assert "Failures:" not in report and "Errors:" not in report, report[-8000:]


def test_schema_says_what_is_accepted(client) -> None:
    """Issue 16's findings: requests the schema allowed and the service refused. The schema now
    refuses them too (and the service still does)."""
    openapi = client.get("/openapi.json").json()
    defs = openapi["components"]["schemas"]

    def validator(name: str) -> Draft202012Validator:
        return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": {"schemas": defs}})

    refused = {
        "BaseExperiment": [{"preset": ""}],
        "SweepSpec": [
            {**sweep_body(), "grid": {"method": []}},
            {**sweep_body(), "grid": {"method": ["gmtz"]}},
            {**sweep_body(), "grid": {"ratio": [0]}},
            {**sweep_body(), "grid": {"ratio": [1.5]}},
            {**sweep_body(), "grid": {"lr": [-1e-6]}},
            {**sweep_body(), "grid": {"seed": [-1]}},
            {**sweep_body(), "trials": [{"colour": "red"}]},
            {**sweep_body(), "max_concurrent_trials": 1025},
        ],
    }
    for name, bodies in refused.items():
        for body in bodies:
            assert not validator(name).is_valid(body), (name, body)
            path = "/v1/runs" if name == "BaseExperiment" else "/v1/sweeps"
            assert client.post(path, json=body).status_code == 422, body
    assert validator("SweepSpec").is_valid(sweep_body())
    assert validator("BaseExperiment").is_valid({"preset": "cpu-tiny-s"})


def test_unsupported_methods_are_405_naming_every_allowed_method(client) -> None:
    response = client.request("OPTIONS", "/v1/sweeps")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"  # both routes of the path, not only the first
    assert response.json()["message"] == "OPTIONS is not allowed on /v1/sweeps; allowed: GET, POST"
    assert client.request("DELETE", "/v1/runs/run-0123456789abcdef").headers["allow"] == "GET"


@pytest.mark.slow
def test_without_a_token_every_v1_call_is_401(settings_, jobs) -> None:
    app = create_app(settings_, jobs)
    with TestClient(app):
        for operation in _operations(app):

            @given(operation.as_strategy())
            @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                      phases=PHASES)
            def call(case) -> None:
                response = case.call(headers={"Authorization": ""})
                if case.path.startswith("/v1"):
                    # 413: an oversize body is refused before anything else, the token check included.
                    assert response.status_code in (401, 413), (case.method, case.path, response.status_code)
                else:
                    assert response.status_code in (200, 503)

            call()
