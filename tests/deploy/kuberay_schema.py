"""KubeRay's own CRD schemas as a strict JSON-schema validator, for checking deploy/kuberay/ offline.

The API server validates a custom resource against the CRD's structural OpenAPI schema and silently *prunes*
fields the schema does not name, so a misspelt field (``rayStartParam``, ``imagePullPolicyy``) is accepted and
ignored. Here an unknown field is an error instead, as ``kubeconform -strict`` and ``kubectl --validate=strict``
make it. The Kubernetes extensions are checked as the API server checks them: ``x-kubernetes-int-or-string``,
``nullable``, list-type ``map`` (unique entries by their keys) and ``set``. CEL rules
(``x-kubernetes-validations``) cannot be evaluated here: a document that reaches a field carrying one is an
error that names the rule, so nothing the operator would check goes unchecked silently.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, ValidationError, validators

KUBERAY_VERSION = "v1.6.2"
CRD_DIR = Path(__file__).resolve().parent / f"kuberay-crds-{KUBERAY_VERSION}"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml.gz", "RayJob": "ray.io_rayjobs.yaml.gz"}
# sha256 of the uncompressed upstream files (the folder's README says where they come from).
CRD_SHA256 = {
    "ray.io_rayclusters.yaml.gz": "1d51d8c4ce065b22c2069af0ebd72ae25f4a6968e5c5f93a3106ba6fc35bcc1d",
    "ray.io_rayjobs.yaml.gz": "ecae45d9a5dc1be68f1074ba784c495ef9d439d295253b61e1bd51f7b08522f5",
}


def crd_text(file_name: str) -> bytes:
    return gzip.decompress((CRD_DIR / file_name).read_bytes())


def crd_checksum(file_name: str) -> str:
    return hashlib.sha256(crd_text(file_name)).hexdigest()


@functools.cache
def openapi_schema(kind: str, version: str = "v1") -> dict:
    """The CRD's OpenAPI v3 schema for ``kind`` at API ``version``."""
    # libyaml's loader: the pure-Python one takes seconds on these 1–2 MB files.
    (crd,) = [doc for doc in yaml.load_all(crd_text(CRD_FILES[kind]), Loader=yaml.CSafeLoader) if doc]
    assert crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


def strict_json_schema(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes' structural subset) → JSON Schema 2020-12, closed to unknown fields."""
    if isinstance(node, list):
        return [strict_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    schema = {key: strict_json_schema(value) if key in _SUBSCHEMA_KEYS else value for key, value in node.items()}
    if "properties" in node:
        schema["properties"] = {name: strict_json_schema(sub) for name, sub in node["properties"].items()}
        schema.setdefault("additionalProperties", False)
    if node.get("x-kubernetes-int-or-string"):
        schema.pop("anyOf", None)
        schema["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        schema["type"] = [*types, "null"]
    return schema


_SUBSCHEMA_KEYS = ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not")


def _list_type(validator, list_type, instance, schema) -> Iterator[ValidationError]:
    if not isinstance(instance, list):
        return
    if list_type == "set":
        seen = []
        for item in instance:
            if item in seen:
                yield ValidationError(f"duplicate entry {item!r} in a list-type set")
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen = set()
        for item in instance:
            if not isinstance(item, dict):
                continue
            missing = [key for key in keys if key not in item and "default" not in
                       schema.get("items", {}).get("properties", {}).get(key, {})]
            if missing:
                yield ValidationError(f"list-type map entry lacks its key field(s) {missing}: {item!r}")
            identity = tuple(repr(item.get(key)) for key in keys)
            if identity in seen:
                yield ValidationError(f"duplicate entry for key(s) {keys} = {identity} in a list-type map")
            seen.add(identity)


def _cel_rules(validator, rules, instance, schema) -> Iterator[ValidationError]:
    listed = "; ".join(rule["rule"] for rule in rules)
    yield ValidationError(f"this field carries CEL rules the offline check cannot evaluate ({listed}): "
                          "check them by hand and extend tests/deploy/kuberay_schema.py")


StrictKubeRayValidator = validators.extend(
    Draft202012Validator,
    {"x-kubernetes-list-type": _list_type, "x-kubernetes-validations": _cel_rules},
)


@functools.cache
def validator_for(kind: str) -> Draft202012Validator:
    return StrictKubeRayValidator(strict_json_schema(openapi_schema(kind)))


def schema_errors(document: dict) -> list[str]:
    """Every way ``document`` (a RayCluster or RayJob) breaks its CRD schema, as ``path: message`` lines."""
    errors = validator_for(document["kind"]).iter_errors(document)
    return sorted(f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}" for error in errors)
