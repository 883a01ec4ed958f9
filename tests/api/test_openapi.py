"""Property-based run of the OpenAPI spec (schemathesis): whatever a client sends that the schema
allows (and much that it does not), the server answers without a 5xx and within its own schema.

Bounded to a few dozen examples per operation so that it runs in well under a minute. The app is the
real one with the fake Ray Jobs backend (see conftest.py): valid random specs do get "submitted".
Each operation's Hypothesis strategy is driven here with ``@given`` (schemathesis' own pytest
plugin, ``from_fixture``, does not work with pytest 9 at schemathesis 4.32).
"""

from __future__ import annotations

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from api.app import create_app
from tests.api.support import bearer

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 25
# No shrinking: a failure is reported as found (Hypothesis prints it); shrinking can take minutes here.
PHASES = (Phase.explicit, Phase.generate)


def _operations(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    return [result.ok() for result in schema.get_all_operations()]


def test_no_server_errors_and_no_schema_violations(settings_, jobs) -> None:
    app = create_app(settings_, jobs)
    with TestClient(app):  # runs the lifespan (start-up reconciliation) once
        operations = _operations(app)
        assert len(operations) == 13  # 11 under /v1, /healthz, /readyz
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @given(operation.as_strategy(generation_mode=mode))
                @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                          database=None, phases=PHASES)
                def call(case) -> None:
                    case.call_and_validate(headers=bearer(), checks=CHECKS)

                try:
                    call()
                except Unsatisfiable:
                    # Nothing to break in an operation without parameters or body (/healthz …).
                    assert mode is GenerationMode.NEGATIVE, operation.label


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
