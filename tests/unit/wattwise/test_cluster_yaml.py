"""cluster.yaml (AWS) and cluster.gcp.yaml, checked offline: no cloud is contacted.

`ray up` fails late and expensively (after VMs boot) on what these tests catch early:
Ray's own config code (defaults merge, JSON schema, Docker section) must accept both
files, and every reference they make must resolve in this repository: mounted paths,
the extras and files the setup commands name, and the container image's Ray and Python
versions against pyproject.toml's pins.
"""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[3]
CLUSTER_FILES = ("cluster.yaml", "cluster.gcp.yaml")
# Ray's image tags: {Ray version}[-{Python version}][-{Platform}] (docker/ray/README.md in Ray's repo).
IMAGE_TAG = re.compile(r"^rayproject/ray:(?P<ray>\d+\.\d+\.\d+)-py(?P<py>3\d+)-(?P<platform>gpu|cu\d+)$")


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())


def _commands(config: dict[str, Any]) -> list[str]:
    keys = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
            "head_start_ray_commands", "worker_start_ray_commands")
    return [cmd for key in keys for cmd in config.get(key, [])]


def _pinned_ray() -> Version:
    for dep in _pyproject()["project"]["dependencies"]:
        m = re.fullmatch(r"ray(\[[^\]]*\])?==(\S+)", dep.replace(" ", ""))
        if m:
            return Version(m.group(2))
    raise AssertionError("pyproject.toml pins no ray version")


@pytest.fixture(params=CLUSTER_FILES)
def cluster(request) -> tuple[str, dict[str, Any]]:
    return request.param, _load(request.param)


def test_ray_accepts_the_config(cluster) -> None:
    """Ray's own `ray up` preparation: provider defaults merged, schema, Docker section."""
    _, config = cluster
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_ray_would_refuse_a_broken_config(cluster) -> None:
    """The check above can fail: a misspelt Docker key is refused by Ray's schema."""
    _, config = cluster
    broken = copy.deepcopy(config)
    broken["docker"]["run_option"] = broken["docker"].pop("run_options")
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


def test_image_matches_pinned_ray_and_python(cluster) -> None:
    _, config = cluster
    docker = config["docker"]
    images = {docker["image"], docker.get("head_image", docker["image"]), docker.get("worker_image", docker["image"])}
    assert len(images) == 1, "head and workers must run one Ray/Python build"
    m = IMAGE_TAG.match(images.pop())
    assert m, f"not a pinned Ray GPU image tag: {docker['image']}"
    assert Version(m["ray"]) == _pinned_ray()
    python = Version(f"{m['py'][0]}.{m['py'][1:]}")
    assert python in SpecifierSet(_pyproject()["project"]["requires-python"])
    # The image's Python is also asserted on the node itself before anything is installed.
    assert any("sys.version_info >= (3, 11)" in cmd for cmd in config["setup_commands"])


def test_gpu_nodes_can_lock_clocks(cluster) -> None:
    """NVML clock locking needs GPUs in the container, root, and CAP_SYS_ADMIN (or --privileged)."""
    _, config = cluster
    docker = config["docker"]
    worker_opts = " ".join(docker.get("run_options", []) + docker.get("worker_run_options", []))
    assert "--gpus all" in worker_opts
    assert "--cap-add SYS_ADMIN" in worker_opts or "--privileged" in worker_opts
    assert "--user root" in worker_opts
    # --gpus on a GPU-less head would stop its container from starting.
    assert "--gpus" not in " ".join(docker.get("run_options", []) + docker.get("head_run_options", []))
    assert "latest_dlami" not in (ROOT / "cluster.yaml").read_text() + (ROOT / "cluster.gcp.yaml").read_text()


def test_node_types_keep_replicas_off_the_head(cluster) -> None:
    _, config = cluster
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert workers and all(t["resources"].get("GPU", 0) > 0 for t in workers)


def test_host_images_are_named(cluster) -> None:
    """The VM's own image is a GPU-driver image, never the launcher's default."""
    _, config = cluster
    for node_type in config["available_node_types"].values():
        nc = node_type["node_config"]
        if config["provider"]["type"] == "aws":
            assert re.fullmatch(r"ami-[0-9a-f]{8,17}|resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
                                r"base-oss-nvidia-driver-gpu-ubuntu-22\.04/[^/]+/ami-id", nc["ImageId"])
        else:
            (boot,) = [d for d in nc["disks"] if d.get("boot")]
            assert boot["initializeParams"]["sourceImage"].startswith(
                "projects/deeplearning-platform-release/global/images/")


def test_file_mounts_exist(cluster) -> None:
    _, config = cluster
    assert config["file_mounts"], "the project must reach the nodes"
    for remote, local in config["file_mounts"].items():
        assert (ROOT / local).exists(), f"{remote}: {local} is not in the repository"
    assert (ROOT / "pyproject.toml").is_file()  # the mounted tree is installable


def test_setup_commands_name_real_extras_and_files(cluster) -> None:
    _, config = cluster
    mount = next(remote for remote, local in config["file_mounts"].items() if (ROOT / local).resolve() == ROOT)
    extras = set(_pyproject()["project"]["optional-dependencies"])
    installs = [c for c in config["setup_commands"] if "pip install -e" in c]
    assert installs, "the project must be installed on every node"
    for cmd in installs:
        assert mount in cmd
        for spec in re.findall(r"\[([^\]]+)\]", cmd):
            named = {e.strip() for e in spec.split(",")}
            assert named <= extras, f"unknown extras {named - extras}"
            assert "gpu" in named and "cpu" not in named
    referenced = [tok.removeprefix(mount + "/") for cmd in _commands(config) for tok in shlex.split(cmd)
                  if tok.startswith(mount + "/")]
    assert "serve_config.gpu.yaml" in referenced
    for path in referenced:
        assert (ROOT / path).exists(), f"a command names {path}, which is not in the repository"


def test_ports(cluster) -> None:
    """Dashboard 8265, metrics 8080 on every node, Serve HTTP 8000 from serve_config.gpu.yaml."""
    _, config = cluster
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    assert "--dashboard-port=8265" in head and "--dashboard-host=0.0.0.0" in head
    assert "--metrics-export-port=8080" in head and "--metrics-export-port=8080" in worker
    # wattwise's Grafana dashboard is provisioned with Ray's (dashboards/README.md).
    assert "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR=" in head and "dashboards/wattwise.json" in head
    serve = yaml.safe_load((ROOT / "serve_config.gpu.yaml").read_text())
    assert serve["http_options"]["port"] == 8000
