"""The deployment files (deploy/) are valid by reading: nothing here builds an image or talks to a cluster.

Every YAML parses (multi-document aware); the Kubernetes core objects and every pod template match
Kubernetes' own JSON schemas (``kubernetes-validate``, strict), the RayCluster and RayJob documents match
KubeRay's pinned CRD schemas (strict, ``kuberay_schema.py``); the compose file and the ``ray up`` config
are checked as their tools would (the latter with Ray's own validator and cluster-config schema); and
every command the files run is a real entry point of this package, with flags its command line accepts.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
import io
import json
import re
import runpy
import shlex
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

from tests.deploy import kuberay_schema

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERAY = DEPLOY / "kuberay"
COMPOSE_FILE = DEPLOY / "docker" / "compose.yaml"
RAY_UP_FILE = DEPLOY / "ray-up" / "cluster.yaml"
DOCKERFILES = sorted(p for p in (DEPLOY / "docker").glob("Dockerfile.*") if p.suffix != ".dockerignore")
GUIDE = ROOT / "docs" / "deploy.md"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# The package's command-line entry points; deployment files may run no other module of it.
ENTRY_MODULES = ("orchestrator.train", "sweeps.run", "sweeps.report", "api.cli")
OWN_PACKAGES = {"orchestrator", "workers", "sweeps", "api"}
GMTS_SUBCOMMANDS = {"serve", "sweep"}

K8S_KINDS = {
    ("v1", "Secret"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Service"),
    ("ray.io/v1", "RayCluster"),
    ("ray.io/v1", "RayJob"),
}
RESOURCE_KEYS = {"cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"}
# Kubernetes' schema for core objects (pod templates included); KubeRay >= 1.6 needs >= 1.28 anyway.
K8S_SCHEMA_VERSION = "1.33"

# KubeRay's CRD schema declares submissionMode a plain string; these are the modes its operator knows.
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}

# Values the user must replace carry this marker on the same line or in the comment just above.
USER_SUPPLIED = "user-supplied"
PLACEHOLDER_VALUES = (
    "example.com",
    "ami-0123456789abcdef0",
    "fs-0123456789abcdef0",
    "shared-rwx",
    "standard-rwo",
)
SECRET_ENV = re.compile(r"(TOKEN|PASSWORD|SECRET|CREDENTIAL|API_KEY)")
RAY_PORTS = {6379, 8265, 10001}
# Compose Specification field names (top level, service, healthcheck).
COMPOSE_FIELDS = {
    "name",
    "services",
    "networks",
    "volumes",
    "secrets",
    "configs",
    "include",
    "models",
    "version",
}
COMPOSE_SERVICE_FIELDS = set(
    """annotations attach blkio_config build cap_add cap_drop cgroup cgroup_parent command configs container_name
    cpu_count cpu_percent cpu_period cpu_quota cpu_rt_period cpu_rt_runtime cpu_shares cpus cpuset credential_spec
    depends_on deploy develop device_cgroup_rules devices dns dns_opt dns_search domainname entrypoint env_file
    environment expose extends external_links extra_hosts gpus group_add healthcheck hostname image init ipc
    isolation label_file labels links logging mac_address mem_limit mem_reservation mem_swappiness memswap_limit
    models network_mode networks oom_kill_disable oom_score_adj pid pids_limit platform ports post_start pre_stop
    privileged profiles provider pull_policy read_only restart runtime scale secrets security_opt shm_size
    stdin_open stop_grace_period stop_signal storage_opt sysctls tmpfs tty ulimits use_api_socket user
    userns_mode uts volumes volumes_from working_dir""".split()  # noqa: SIM905
)
COMPOSE_HEALTHCHECK_FIELDS = {
    "test",
    "interval",
    "timeout",
    "retries",
    "start_period",
    "start_interval",
    "disable",
}


# -- loading --------------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


@functools.cache
def load_documents(path: Path) -> tuple[Any, ...]:
    return tuple(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)


def k8s_documents() -> list[tuple[Path, dict]]:
    return [
        (path, doc) for path in yaml_files() if path.is_relative_to(KUBERAY) for doc in load_documents(path)
    ]


def k8s_of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in k8s_documents() if doc.get("kind") == kind]


def compose() -> dict:
    (doc,) = load_documents(COMPOSE_FILE)
    return doc


def compose_mount(volume: str) -> tuple[str, str]:
    """(source, container path) of a short-syntax compose volume; the source may be ``${VAR:-default}``."""
    match = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(?:ro|rw))?", volume)
    assert match, f"compose volume {volume!r}"
    return match.group(1), match.group(2)


def ray_up() -> dict:
    (doc,) = load_documents(RAY_UP_FILE)
    return doc


@dataclass(frozen=True)
class PodTemplate:
    origin: str
    template: dict
    ray_container: bool  # containers[0] is a Ray node (KubeRay generates its `ray start`)

    @property
    def spec(self) -> dict:
        return self.template["spec"]

    def containers(self) -> list[dict]:
        return self.spec.get("initContainers", []) + self.spec["containers"]


def pod_templates() -> list[PodTemplate]:
    templates = []
    for cluster in k8s_of_kind("RayCluster"):
        templates += _cluster_templates(cluster["metadata"]["name"], cluster["spec"])
    for job in k8s_of_kind("RayJob"):
        name = job["metadata"]["name"]
        if "submitterPodTemplate" in job["spec"]:
            templates.append(
                PodTemplate(f"RayJob {name} submitter", job["spec"]["submitterPodTemplate"], False)
            )
        if "rayClusterSpec" in job["spec"]:
            templates += _cluster_templates(f"RayJob {name}", job["spec"]["rayClusterSpec"])
    return templates


def _cluster_templates(name: str, spec: dict) -> list[PodTemplate]:
    templates = [PodTemplate(f"{name} head", spec["headGroupSpec"]["template"], True)]
    for group in spec.get("workerGroupSpecs", []):
        templates.append(PodTemplate(f"{name} {group['groupName']}", group["template"], True))
    return templates


def all_k8s_containers() -> list[tuple[str, dict]]:
    return [(f"{pod.origin}/{c['name']}", c) for pod in pod_templates() for c in pod.containers()]


# -- commands -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    origin: str
    program: str  # basename: python, ray, mlflow, gmts, pip …
    args: tuple[str, ...]

    @property
    def module(self) -> str | None:
        if (
            re.fullmatch(r"python(\d+(\.\d+)?)?", self.program)
            and len(self.args) >= 2
            and self.args[0] == "-m"
        ):
            return self.args[1]
        return None

    def flags(self) -> list[str]:
        return [arg.split("=", 1)[0] for arg in self.args if arg.startswith("--") and len(arg) > 2]

    def options(self, flag: str) -> list[str]:
        """Values of ``flag`` (``--flag v`` or ``--flag=v``)."""
        values = []
        for i, arg in enumerate(self.args):
            if arg == flag and i + 1 < len(self.args):
                values.append(self.args[i + 1])
            elif arg.startswith(flag + "="):
                values.append(arg[len(flag) + 1 :])
        return values


def command_strings() -> list[tuple[str, str]]:
    """Every shell command or argv (joined) that the deployment files run, with where it comes from."""
    found: list[tuple[str, str]] = []
    for origin, container in all_k8s_containers():
        argv = container.get("command", []) + container.get("args", [])
        if argv:
            found.append((origin, shlex.join(argv)))
        for hook in container.get("lifecycle", {}).values():
            found.append((f"{origin} lifecycle", shlex.join(hook["exec"]["command"])))
    for job in k8s_of_kind("RayJob"):
        found.append((f"RayJob {job['metadata']['name']}", job["spec"]["entrypoint"]))
    for name, service in compose()["services"].items():
        command = service.get("command")
        if command:
            found.append((f"compose {name}", command if isinstance(command, str) else shlex.join(command)))
        test = service.get("healthcheck", {}).get("test")
        if test:
            found.append((f"compose {name} healthcheck", _healthcheck_command(test)))
    config = ray_up()
    for key in (
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ):
        found += [(f"cluster.yaml {key}", command) for command in config.get(key, [])]
    for dockerfile in DOCKERFILES:
        for instruction, rest in dockerfile_instructions(dockerfile):
            if instruction in ("RUN", "CMD", "ENTRYPOINT"):
                found.append((f"{dockerfile.name} {instruction}", _exec_form(rest)))
            elif instruction == "HEALTHCHECK" and " CMD " in f" {rest} ":
                found.append((f"{dockerfile.name} HEALTHCHECK", _exec_form(rest.split("CMD", 1)[1].strip())))
    return found


def _healthcheck_command(test: str | list[str]) -> str:
    if isinstance(test, str):
        return test
    if test[0] == "CMD-SHELL":
        return test[1]
    return shlex.join(test[1:] if test[0] == "CMD" else test)


def _exec_form(text: str) -> str:
    text = text.strip()
    return shlex.join(json.loads(text)) if text.startswith("[") else text


def invocations() -> list[Invocation]:
    return [inv for origin, command in command_strings() for inv in split_invocations(origin, command)]


def split_invocations(origin: str, command: str) -> Iterator[Invocation]:
    """The simple commands of a shell line: split at ; && || | ( ), leading VAR=value and wrappers dropped."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= set("();&|<>"):
            while words and (
                re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]) or words[0] in ("exec", "nohup", "sudo")
            ):
                words.pop(0)
            if words:
                yield Invocation(origin, words[0].rsplit("/", 1)[-1], tuple(words[1:]))
            words = []
        else:
            words.append(token)


@functools.cache
def click_options(command_path: str) -> frozenset[str]:
    """Long options of a click command, e.g. ``ray start`` or ``mlflow server``."""
    if command_path == "ray start":
        from ray.scripts.scripts import start as command
    elif command_path == "mlflow server":
        from mlflow.cli import server as command
    else:
        raise ValueError(command_path)
    return frozenset(opt for param in command.params for opt in (*param.opts, *param.secondary_opts))


def help_text(program: str, args: list[str], run: Callable[[], object]) -> str:
    """What ``program args… --help`` prints, run in this process (the imports are shared with other tests)."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [program, *args, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            run()
    except SystemExit as exit_:
        assert exit_.code in (0, None), f"{program} {' '.join(args)} --help exited with {exit_.code}"
    finally:
        sys.argv = saved
    return out.getvalue()


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# -- Dockerfiles ----------------------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) with line continuations joined and comment lines dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + stripped[:-1] if stripped.endswith("\\") else " " + stripped
        if not stripped.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            instructions.append((word.upper(), rest.strip()))
            pending = ""
    return instructions


def dockerfile_base_images(path: Path) -> list[str]:
    args: dict[str, str] = {}
    images = []
    for instruction, rest in dockerfile_instructions(path):
        if instruction == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value.strip('"')
        elif instruction == "FROM":
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), rest.split()[0])
            images.append(image)
    return images


def is_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name = image.rsplit("/", 1)[-1]
    return ":" in name and name.rsplit(":", 1)[1] not in ("", "latest") and "$" not in image


# -- quantities -----------------------------------------------------------------------------------

_SUFFIXES = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str | float) -> Decimal:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(value))
    assert match, f"{value!r} is not a Kubernetes quantity"
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]


# =================================================================================================
# Parsing and kinds
# =================================================================================================


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_parses_and_is_checked_here(path: Path) -> None:
    docs = load_documents(path)
    assert docs, f"{path} holds no document"
    assert all(isinstance(doc, dict) for doc in docs), f"{path}: every document must be a mapping"
    # A new kind of deployment file must come with its checks.
    assert path.is_relative_to(KUBERAY) or path in (COMPOSE_FILE, RAY_UP_FILE), (
        f"{path} is not checked by this test"
    )


def test_kubernetes_documents_have_known_api_versions_and_kinds() -> None:
    docs = k8s_documents()
    assert {doc["kind"] for _, doc in docs} >= {
        "RayCluster",
        "RayJob",
        "Secret",
        "PersistentVolumeClaim",
        "Service",
    }
    for path, doc in docs:
        assert (doc.get("apiVersion"), doc.get("kind")) in K8S_KINDS, (
            f"{path.name}: {doc.get('apiVersion')}/{doc.get('kind')}"
        )
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, (
            f"{path.name}: bad name {name!r}"
        )
        assert "namespace" not in doc["metadata"], (
            f"{path.name}: {name} hard-codes a namespace (use kubectl -n)"
        )


def test_core_objects_and_pod_templates_match_the_kubernetes_schema() -> None:
    for path, doc in k8s_documents():
        if doc["apiVersion"] == "v1":
            kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
    # KubeRay embeds plain pod templates: check them as a v1 PodTemplate (strict: no unknown field).
    for pod in pod_templates():
        wrapper = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "check"},
            "template": pod.template,
        }
        try:
            kubernetes_validate.validate(wrapper, K8S_SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{pod.origin}: {exc}")


def test_pinned_kuberay_crds_are_the_upstream_files() -> None:
    for file_name, checksum in kuberay_schema.CRD_SHA256.items():
        assert kuberay_schema.crd_checksum(file_name) == checksum, f"{file_name} is not the pinned upstream CRD"
    readme = (kuberay_schema.CRD_DIR / "README.md").read_text()
    assert all(checksum in readme for checksum in kuberay_schema.CRD_SHA256.values())


@pytest.mark.slow
def test_kuberay_documents_match_kuberays_crd_schemas_strictly() -> None:
    documents = k8s_of_kind("RayCluster") + k8s_of_kind("RayJob")
    assert {doc["kind"] for doc in documents} == {"RayCluster", "RayJob"}
    for doc in documents:
        errors = kuberay_schema.schema_errors(doc)
        assert not errors, f"{doc['kind']} {doc['metadata']['name']} against KubeRay " \
            f"{kuberay_schema.KUBERAY_VERSION}'s CRD:\n" + "\n".join(errors)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("spec", "workerGroupSpecs", 0, "replica"), 2, "'replica' was unexpected"),
        (("spec", "headGroupSpec", "template", "spec", "containers", 0, "imagePullPolicyy"), "Always",
         "'imagePullPolicyy' was unexpected"),
        (("spec", "workerGroupSpecs", 0, "replicas"), "2", "is not of type 'integer'"),
        (("spec", "headGroupSpec", "template", "spec", "containers", 0, "resources", "limits", "cpu"), [4],
         "is not of type 'integer', 'string'"),
        (("spec", "headGroupSpec", "template", "spec", "containers", 0, "resources", "limits", "memory"), "4GB",
         "does not match"),
        (("spec", "headGroupSpec", "template", "spec", "containers", 0, "env"),
         [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "duplicate entry"),
        (("spec", "managedBy"), "ray.io/kuberay-operator", "CEL rules"),
    ],
)
def test_the_crd_check_rejects_what_the_operator_would_drop_or_refuse(path: tuple, value: Any,
                                                                      expected: str) -> None:
    """The strict check can fail: a misspelt field (the API server would prune it silently), a wrong type, a
    malformed quantity, a duplicate list-map key, a field guarded by a CEL rule this check cannot run."""
    (cluster,) = k8s_of_kind("RayCluster")
    broken = copy.deepcopy(cluster)
    parent = broken
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    errors = kuberay_schema.schema_errors(broken)
    assert any(expected in error for error in errors), errors
    assert all(error.startswith(".".join(map(str, path[:-1]))) for error in errors), errors


def test_kuberay_documents_are_coherent() -> None:
    """What the CRD schema cannot say: the modes the operator implements, a job's one cluster source."""
    for job in k8s_of_kind("RayJob"):
        spec = job["spec"]
        assert spec.get("submissionMode", "K8sJobMode") in SUBMISSION_MODES
        assert ("clusterSelector" in spec) != ("rayClusterSpec" in spec), (
            "a RayJob selects a cluster or defines one"
        )
        yaml.safe_load(spec.get("runtimeEnvYAML", "{}"))


# =================================================================================================
# Images and resources
# =================================================================================================


def test_every_image_has_a_pinned_tag() -> None:
    images = [(origin, c["image"]) for origin, c in all_k8s_containers()]
    images += [(f"compose {name}", s["image"]) for name, s in compose()["services"].items()]
    images += [(p.name, image) for p in DOCKERFILES for image in dockerfile_base_images(p)]
    for origin, image in images:
        assert is_pinned(image), f"{origin}: image {image!r} has no pinned tag (not 'latest', not a variable)"


def test_our_images_carry_the_package_version() -> None:
    version = PYPROJECT["project"]["version"]
    ours = [c["image"] for _, c in all_k8s_containers()] + [
        s["image"] for s in compose()["services"].values()
    ]
    ours = [image for image in ours if re.search(r"gmts-(gpu|control):", image)]
    assert ours and all(image.endswith(f":{version}") for image in ours), ours
    assert len({image.rsplit("/", 1)[0] for image in ours if "/" in image}) == 1, (
        "one registry for all our images"
    )


def test_every_container_requests_and_limits_valid_resources() -> None:
    for origin, container in all_k8s_containers():
        resources = container.get("resources", {})
        requests, limits = resources.get("requests"), resources.get("limits")
        assert requests and limits, f"{origin}: needs resources.requests and resources.limits"
        assert {"cpu", "memory"} <= set(requests) and {"cpu", "memory"} <= set(limits), origin
        for key in set(requests) | set(limits):
            assert key in RESOURCE_KEYS, f"{origin}: resource {key!r} is none of {sorted(RESOURCE_KEYS)}"
        for key in set(requests) & set(limits):
            assert quantity(requests[key]) <= quantity(limits[key]), (
                f"{origin}: {key} request above its limit"
            )
        if "nvidia.com/gpu" in requests or "nvidia.com/gpu" in limits:
            # Extended resources cannot be overcommitted: Kubernetes rejects request != limit.
            assert requests.get("nvidia.com/gpu") == limits.get("nvidia.com/gpu"), origin


def test_raycluster_has_a_head_and_a_gpu_group_for_the_papers_setting() -> None:
    (cluster,) = k8s_of_kind("RayCluster")
    spec = cluster["spec"]
    head = spec["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict)
    head_ray = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head_ray["resources"]["limits"], "the head runs drivers, not training"
    gpu_groups = [
        g
        for g in spec["workerGroupSpecs"]
        if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]
    ]
    assert gpu_groups, "no worker group requests GPUs"
    for group in spec["workerGroupSpecs"]:
        assert isinstance(group["rayStartParams"], dict), f"{group['groupName']}: rayStartParams"
        assert group.get("minReplicas", 0) <= group.get("replicas", 0) <= group.get("maxReplicas", 2**31 - 1)
    for group in gpu_groups:
        pod = group["template"]["spec"]
        ray = pod["containers"][0]
        assert quantity(ray["resources"]["limits"]["nvidia.com/gpu"]) == 8, "one pod per 8 x 80 GB node"
        shm = [v["name"] for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        assert any(m["mountPath"] == "/dev/shm" and m["name"] in shm for m in ray["volumeMounts"]), (
            "NCCL needs /dev/shm"
        )
        assert pod.get("tolerations") and pod.get("nodeSelector"), "GPU nodes are tainted and labelled"


@pytest.mark.slow
def test_ray_start_params_are_ray_start_options_given_as_strings() -> None:
    for cluster_spec in [c["spec"] for c in k8s_of_kind("RayCluster")]:
        for group in [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]:
            for key, value in group["rayStartParams"].items():
                # The CRD types rayStartParams as map[string]string: an unquoted number is rejected.
                assert isinstance(value, str), f"rayStartParams.{key}: {value!r} must be a quoted string"
                assert f"--{key}" in click_options("ray start"), (
                    f"rayStartParams.{key} is no `ray start` option"
                )


# =================================================================================================
# Secrets, token auth, exposure
# =================================================================================================


def secret_template() -> dict[str, dict[str, str]]:
    return {s["metadata"]["name"]: s.get("stringData", {}) | s.get("data", {}) for s in k8s_of_kind("Secret")}


def test_secret_template_holds_no_secret() -> None:
    for name, data in secret_template().items():
        assert data, f"Secret {name} declares no key"
        assert all(value == "" for value in data.values()), (
            f"Secret {name}: the template must not hold a value"
        )


def test_secret_env_vars_come_from_secret_key_refs() -> None:
    secrets = secret_template()
    for origin, container in all_k8s_containers():
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if SECRET_ENV.search(env["name"]) and not env["name"].endswith(("_FILE", "_PATH")):
                assert ref and "value" not in env, (
                    f"{origin}: {env['name']} must come from valueFrom.secretKeyRef"
                )
            if ref:
                assert ref["name"] in secrets and ref["key"] in secrets[ref["name"]], (
                    f"{origin}: {ref} not in the template"
                )
    for pod in pod_templates():
        for volume in pod.spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, f"{pod.origin}: volume {volume['name']}"


def test_volumes_refer_to_declared_claims_and_mounts_to_declared_volumes() -> None:
    claims = {pvc["metadata"]["name"] for pvc in k8s_of_kind("PersistentVolumeClaim")}
    for pod in pod_templates():
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, (
                    f"{pod.origin}: {volume['name']}"
                )
        for container in pod.containers():
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (
                    f"{pod.origin}/{container['name']}: no volume {mount['name']!r}"
                )


def test_ray_token_auth_is_on_for_every_ray_process() -> None:
    secrets = secret_template()
    for cluster in k8s_of_kind("RayCluster"):
        auth = cluster["spec"]["authOptions"]
        assert auth["mode"] == "token" and "auth_token" in secrets[auth["secretName"]], auth
        assert tuple(map(int, cluster["spec"]["rayVersion"].split("."))) >= (2, 52), (
            "token auth needs Ray >= 2.52"
        )
    ray_containers = [
        (pod.origin, pod.spec["containers"][0])
        for pod in pod_templates()
        if pod.ray_container or "submitter" in pod.origin
    ]
    assert len(ray_containers) >= 3
    for origin, container in ray_containers:
        env = {e["name"]: e for e in container.get("env", [])}
        assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{origin}: RAY_AUTH_MODE=token"
        assert "secretKeyRef" in env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}), (
            f"{origin}: RAY_AUTH_TOKEN"
        )
    # compose: the Ray head runs with token auth; the API reads the same token from a compose secret.
    services = compose()["services"]
    declared = compose()["secrets"]
    head_env = services["ray-head"]["environment"]
    assert head_env["RAY_AUTH_MODE"] == "token"
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_ENV.search(key) and not key.endswith(("_FILE", "_PATH")):
                pytest.fail(f"compose {name}: {key} holds a literal; use a secret file")
            if key.endswith(("TOKEN_FILE", "TOKEN_PATH")):
                secret = Path(value).name
                assert (
                    value == f"/run/secrets/{secret}"
                    and secret in service.get("secrets", [])
                    and secret in declared
                )
    # ray up: every `ray start` runs with token auth and the token file reaches every node.
    config = ray_up()
    starts = [
        c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c
    ]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token" in c for c in starts), starts
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"


def test_ray_dashboard_is_never_exposed_publicly() -> None:
    for service in k8s_of_kind("Service"):
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP", service["metadata"]["name"]
    for cluster in k8s_of_kind("RayCluster"):
        assert cluster["spec"]["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP"
        assert not cluster["spec"]["headGroupSpec"].get("enableIngress", False)
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            # "${VAR:-default}" publishes on the default unless the user sets VAR.
            parts = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(port)).split(":")
            container_port = int(parts[-1].split("/")[0])
            host = parts[0] if len(parts) == 3 else "0.0.0.0"
            if container_port in RAY_PORTS:
                assert host == "127.0.0.1", f"compose {name}: Ray port {container_port} published on {host}"
    for inv in invocations():
        if (
            inv.origin.startswith("cluster.yaml")
            and inv.program == "ray"
            and inv.args[:2] == ("start", "--head")
        ):
            assert inv.options("--dashboard-host") == ["127.0.0.1"], (
                "ray up: reach the dashboard by SSH tunnel"
            )


def test_jobs_log_to_the_mlflow_service() -> None:
    services = {s["metadata"]["name"]: s for s in k8s_of_kind("Service")}
    uris = []
    for job in k8s_of_kind("RayJob"):
        uris.append(yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]["MLFLOW_TRACKING_URI"])
    for origin, container in all_k8s_containers():
        uris += [e["value"] for e in container.get("env", []) if e["name"].endswith("MLFLOW_TRACKING_URI")]
    assert uris
    for uri in uris:
        url = urlparse(uri)
        assert url.scheme == "http" and url.hostname in services, uri
        assert url.port in [p["port"] for p in services[url.hostname]["spec"]["ports"]], uri
    compose_services = compose()["services"]
    for name, service in compose_services.items():
        for key, value in (service.get("environment") or {}).items():
            if key.endswith("MLFLOW_TRACKING_URI"):
                url = urlparse(value)
                assert (
                    url.hostname == "mlflow" and f"--port {url.port}" in compose_services["mlflow"]["command"]
                ), (name, value)


def preset_env_vars() -> set[str]:
    """The ``${VAR}`` names that presets and specs expand from the environment (model and data roots)."""
    texts = [
        p.read_text() for d in ("orchestrator/presets", "sweeps/specs") for p in (ROOT / d).glob("*.yaml")
    ]
    return {name for text in texts for name in re.findall(r"\$\{(\w+)\}", text)}


def test_preset_roots_are_set_to_mounted_paths_wherever_presets_are_read() -> None:
    names = preset_env_vars()
    assert names, "the GPU presets name their model/data roots with ${VAR}"
    readers = [(p.origin, p.spec["containers"][0]) for p in pod_templates() if p.ray_container]
    readers += [(origin, c) for origin, c in all_k8s_containers() if c.get("command", [""])[0] == "gmts"]
    for origin, container in readers:
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        for name in names:
            assert env.get(name) in mounts, (
                f"{origin}: {name}={env.get(name)!r} is not a mounted path {mounts}"
            )
    for name, service in compose()["services"].items():
        if name in ("ray-head", "api"):
            mounts = {compose_mount(volume)[1] for volume in service["volumes"]}
            for var in names:
                assert service["environment"].get(var) in mounts, f"compose {name}: {var}"
    config = ray_up()
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        if "ray start" in command:
            assert all(f"{var}=" in command for var in names), f"cluster.yaml: `ray start` without {names}"


# =================================================================================================
# Commands are real entry points
# =================================================================================================


def own_module_invocations() -> list[Invocation]:
    return [inv for inv in invocations() if inv.module and inv.module.split(".")[0] in OWN_PACKAGES]


def test_deployment_files_run_only_entry_point_modules() -> None:
    used = own_module_invocations()
    assert any(inv.module == "sweeps.run" for inv in used), "no deployment runs a sweep"
    for inv in used:
        assert inv.module in ENTRY_MODULES, (
            f"{inv.origin}: python -m {inv.module} is not an entry point {ENTRY_MODULES}"
        )


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_entry_point_module_exists(module: str) -> None:
    assert module_exists(module), f"{module} does not resolve (importlib.util.find_spec)"


def test_gmts_commands_match_the_console_script() -> None:
    scripts = PYPROJECT["project"].get("scripts", {})
    gmts = [inv for inv in invocations() if inv.program == "gmts"]
    assert gmts, "no deployment runs `gmts`"
    assert scripts.get("gmts") == "api.cli:main", scripts
    for inv in gmts:
        assert inv.args and (inv.args[0] in GMTS_SUBCOMMANDS or inv.args[0] == "--help"), (
            f"{inv.origin}: gmts {inv.args}"
        )


def test_gmts_flags_exist() -> None:
    module, _, function = PYPROJECT["project"]["scripts"]["gmts"].partition(":")
    if not module_exists(module):
        pytest.skip(f"{module} does not exist yet (test_entry_point_module_exists reports it)")
    main = getattr(importlib.import_module(module), function)
    for inv in invocations():
        if inv.program == "gmts" and inv.args[0] in GMTS_SUBCOMMANDS:
            text = help_text("gmts", [inv.args[0]], main)
            for flag in inv.flags():
                assert flag in text, f"{inv.origin}: `gmts {inv.args[0]}` has no {flag}"


def test_module_flags_exist() -> None:
    for inv in own_module_invocations():
        if not module_exists(inv.module):
            continue  # reported by test_entry_point_module_exists
        run = functools.partial(runpy.run_module, inv.module, run_name="__main__", alter_sys=True)
        text = help_text(inv.module, [], run)
        for flag in inv.flags():
            assert flag in text, f"{inv.origin}: python -m {inv.module} has no {flag}"


def sweep_invocations() -> list[Invocation]:
    return [inv for inv in own_module_invocations() if inv.module == "sweeps.run"]


def test_sweep_overrides_name_spec_fields() -> None:
    from orchestrator.config import ExperimentConfig
    from sweeps.spec import SweepSpec

    for inv in sweep_invocations():
        for item in inv.options("--set"):
            key = item.partition("=")[0].split(".")
            assert key[0] in SweepSpec.model_fields, f"{inv.origin}: --set {item}: no spec field {key[0]!r}"
            if key[:2] == ["base", "overrides"]:
                assert key[2] in ExperimentConfig.model_fields, (
                    f"{inv.origin}: --set {item}: no config field {key[2]!r}"
                )


def test_sweep_commands_name_shipped_specs() -> None:
    from sweeps.spec import load_spec, spec_names

    for inv in sweep_invocations():
        spec_name = inv.args[2]
        assert spec_name in spec_names(), f"{inv.origin}: no shipped spec {spec_name!r} (have {spec_names()})"
        load_spec(spec_name, inv.options("--set"))  # raises ConfigError naming the field


@pytest.mark.slow
def test_ray_start_and_mlflow_server_flags_exist() -> None:
    seen = set()
    for inv in invocations():
        if inv.program == "ray" and inv.args[:1] == ("start",):
            command = "ray start"
        elif inv.program == "mlflow" and inv.args[:1] == ("server",):
            command = "mlflow server"
        else:
            continue
        seen.add(command)
        for flag in inv.flags():
            assert flag in click_options(command), f"{inv.origin}: `{command}` has no {flag}"
    assert seen == {"ray start", "mlflow server"}


def test_pinned_versions_agree_everywhere_and_satisfy_pyproject() -> None:
    allowed: dict[str, list[Requirement]] = {}
    for spec in PYPROJECT["project"]["dependencies"] + [
        d for ds in PYPROJECT["project"]["optional-dependencies"].values() for d in ds
    ]:
        requirement = Requirement(spec)
        allowed.setdefault(requirement.name.lower(), []).append(requirement)
    pins: dict[str, set[str]] = {}
    for inv in invocations():
        if inv.program != "pip" or "install" not in inv.args:
            continue
        for arg in inv.args:
            if "==" in arg and not arg.startswith("-"):
                requirement = Requirement(arg)
                (version,) = [s.version for s in requirement.specifier]
                pins.setdefault(requirement.name.lower(), set()).add(version)
                for bound in allowed.get(requirement.name.lower(), []):
                    assert bound.specifier.contains(version, prereleases=True), (
                        f"{inv.origin}: {arg} vs pyproject {bound}"
                    )
    assert {"torch", "vllm", "deepspeed", "ray", "mlflow"} <= set(pins), sorted(pins)
    for name, versions in pins.items():
        assert len(versions) == 1, f"{name} is pinned to {sorted(versions)} in different places"


def test_package_installs_use_declared_extras() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    installs = []
    for inv in invocations():
        if inv.program == "pip" and "install" in inv.args:
            installs += [arg for arg in inv.args if re.fullmatch(r"(\.|.*gmts-lab)(\[[^\]]*\])?", arg)]
    assert installs, "no deployment installs this package"
    for arg in installs:
        used = set(re.findall(r"\[([^\]]*)\]", arg)[0].split(",")) if "[" in arg else set()
        assert used <= extras, f"pip install {arg}: extras {used - extras} not in pyproject"


# =================================================================================================
# Dockerfiles and compose
# =================================================================================================


def test_dockerfiles_run_as_non_root_with_a_healthcheck() -> None:
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.gpu", "Dockerfile.control"}
    for path in DOCKERFILES:
        instructions = dockerfile_instructions(path)
        users = [rest for instruction, rest in instructions if instruction == "USER"]
        assert users and users[-1].split(":")[0] not in ("root", "0"), f"{path.name}: runs as root"
        assert any(instruction == "HEALTHCHECK" for instruction, _ in instructions), (
            f"{path.name}: no HEALTHCHECK"
        )
        for instruction, rest in instructions:
            if instruction == "COPY" and "--from" not in rest:
                for source in shlex.split(rest)[:-1]:
                    assert (ROOT / source).exists(), (
                        f"{path.name}: COPY {source}: no such path in the repository"
                    )


def test_gpu_image_builds_cuda_torch_vllm_and_deepspeed_ops() -> None:
    path = DEPLOY / "docker" / "Dockerfile.gpu"
    (base,) = dockerfile_base_images(path)
    assert base.startswith("nvidia/cuda:") and "-devel-" in base, (
        "DeepSpeed ops need nvcc: a CUDA devel image"
    )
    runs = [rest for instruction, rest in dockerfile_instructions(path) if instruction == "RUN"]
    deepspeed = [r for r in runs if "deepspeed==" in r and "--no-build-isolation" in r]
    assert deepspeed, "DeepSpeed must build against the installed CUDA torch (--no-build-isolation)"
    ops = deepspeed[0]
    assert "DS_BUILD_OPS=1" in ops or ("DS_BUILD_CPU_ADAM=1" in ops and "DS_BUILD_FUSED_ADAM=1" in ops)
    assert "DS_ACCELERATOR=cuda" in ops, "no GPU during `docker build`: the CUDA accelerator must be forced"
    assert any(re.search(r"pip install \"?\.\[[^\]]*gpu[^\]]*\]", r) for r in runs), "installs .[gpu,…]"


def test_control_image_has_no_vllm_and_no_cuda() -> None:
    text = (DEPLOY / "docker" / "Dockerfile.control").read_text()
    instructions = " ".join(
        rest for _, rest in dockerfile_instructions(DEPLOY / "docker" / "Dockerfile.control")
    )
    assert "vllm" not in instructions and "[gpu" not in instructions and "[cpu" not in instructions
    assert "download.pytorch.org/whl/cpu" in text, "the control plane needs only the CPU torch build"
    assert not any(
        "cuda" in image for image in dockerfile_base_images(DEPLOY / "docker" / "Dockerfile.control")
    )


def test_compose_file_is_consistent() -> None:
    doc = compose()
    assert {key for key in doc if not key.startswith("x-")} <= COMPOSE_FIELDS
    services = doc["services"]
    assert set(services) == {"ray-head", "mlflow", "api"}
    for name, service in services.items():
        assert set(service) <= COMPOSE_SERVICE_FIELDS, (
            f"compose {name}: {set(service) - COMPOSE_SERVICE_FIELDS}"
        )
        assert set(service.get("healthcheck", {})) <= COMPOSE_HEALTHCHECK_FIELDS, (
            f"compose {name}: healthcheck"
        )
        if "build" in service:
            build = service["build"]
            context = (COMPOSE_FILE.parent / build["context"]).resolve()
            assert context == ROOT and (context / build["dockerfile"]).is_file(), (
                f"compose {name}: build {build}"
            )
        assert "healthcheck" in service, f"compose {name}: no healthcheck"
        for dependency in service.get("depends_on") or {}:
            assert dependency in services and "healthcheck" in services[dependency], f"{name} -> {dependency}"
        for secret in service.get("secrets", []):
            assert secret in doc["secrets"], f"compose {name}: undeclared secret {secret}"
        for volume in service.get("volumes", []):
            source = compose_mount(volume)[0]
            assert source.startswith(("$", ".", "/")) or source in doc["volumes"], (
                f"compose {name}: volume {source}"
            )
    gpu = services["ray-head"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in gpu), (
        "the Ray head owns the GPUs"
    )
    assert services["ray-head"].get("shm_size"), "NCCL and the object store need /dev/shm"
    # The API's job files and run folders must be where the Ray head can read them.
    api_env = services["api"]["environment"]
    state = api_env["GMTS_STATE_DIR"]
    # Read-write mounts of the same source in both services:
    writable = [
        {compose_mount(v) for v in services[n]["volumes"] if not v.endswith(":ro")}
        for n in ("ray-head", "api")
    ]
    assert any(state.startswith(target + "/") for _, target in writable[0] & writable[1]), (
        "GMTS_STATE_DIR must be on a volume that the API and the Ray head both mount read-write"
    )


def test_secrets_folder_is_ignored_by_git() -> None:
    ignore = (DEPLOY / "docker" / "secrets" / ".gitignore").read_text().split()
    assert ignore[:1] == ["*"], "deploy/docker/secrets/ holds real tokens: git must ignore it"


# =================================================================================================
# ray up
# =================================================================================================


def test_ray_up_config_passes_rays_own_validation() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = ray_up()
    validate_config(prepare_config(copy.deepcopy(config)))  # what `ray up` runs before anything else
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"].get("CPU") == 0, "the head schedules no trial"
    assert any(t.get("min_workers", 0) >= 1 for name, t in types.items() if name != config["head_node_type"])
    assert any("gmts-lab" in key for key in config["file_mounts"]) and "." in config["file_mounts"].values()


# =================================================================================================
# Placeholders
# =================================================================================================


def deployment_texts() -> list[Path]:
    return [p for p in DEPLOY.rglob("*") if p.is_file() and p.name != ".gitignore"] + (
        [GUIDE] if GUIDE.exists() else []
    )


def test_no_placeholder_text_and_user_supplied_values_are_marked() -> None:
    for path in deployment_texts():
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            assert not re.search(r"\b(TODO|FIXME|XXX|TBD|CHANGEME)\b", line), (
                f"{path.name}:{number + 1}: {line.strip()}"
            )
            if path.suffix in (".yaml", ".yml") and any(value in line for value in PLACEHOLDER_VALUES):
                context = " ".join(lines[max(0, number - 3) : number + 1])
                assert USER_SUPPLIED in context, (
                    f"{path.name}:{number + 1}: mark the value as {USER_SUPPLIED}"
                )
