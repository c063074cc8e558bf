"""From a container spec to a local command: env, $(VAR), fieldRef, mount rewriting, executables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx.devnode.containers import (
    ContainerConfigError,
    PodContext,
    build_local_command,
    expand_references,
    prepend_path_list,
    rewrite_paths,
)

pytestmark = pytest.mark.unit

POD: dict[str, Any] = {
    "metadata": {"name": "job-worker-1", "namespace": "team-a", "uid": "u-1", "labels": {"role": "worker"}},
    "spec": {"serviceAccountName": "trainer"},
}


def context(tmp_path: Path, volume_dirs: dict[str, str] | None = None) -> PodContext:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "torchrun").write_text("#!/bin/sh\n")
    return PodContext(
        pod_ip="127.9.9.4",
        node_name="real-0",
        host_ip="127.0.0.1",
        volume_dirs=volume_dirs or {},
        python="/venv/bin/python3.11",
        venv_bin=str(venv_bin),
        default_workdir="/repo",
    )


def test_expansion_follows_kubernetes_rules() -> None:
    values = {"A": "1", "B": "two"}
    assert expand_references("$(A)-$(B)", values) == "1-two"
    assert expand_references("$(MISSING) stays", values) == "$(MISSING) stays"
    assert expand_references("$$(A) is escaped", values) == "$(A) is escaped"


def test_env_resolves_field_refs_and_earlier_variables(tmp_path: Path) -> None:
    container = {
        "name": "trainer",
        "command": ["python", "-m", "phalanx_trainer"],
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
            {"name": "WHO", "value": "$(POD)@$(IP) as $(ROLE)"},
        ],
    }
    command = build_local_command(POD, container, context(tmp_path), {"PATH": "/usr/bin"})
    assert command.env["WHO"] == "job-worker-1@127.9.9.4 as worker"
    assert command.env["PATH"] == "/usr/bin"


def test_python_is_the_agents_interpreter_and_bare_names_come_from_its_venv(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    python = build_local_command(POD, {"name": "c", "command": ["python3", "-V"]}, ctx, {})
    torchrun = build_local_command(POD, {"name": "c", "command": ["torchrun"], "args": ["x.py"]}, ctx, {})
    absolute = build_local_command(POD, {"name": "c", "command": ["/bin/echo", "hi"]}, ctx, {})
    assert python.argv == ["/venv/bin/python3.11", "-V"]
    assert torchrun.argv == [str(Path(ctx.venv_bin) / "torchrun"), "x.py"]
    assert absolute.argv == ["/bin/echo", "hi"]
    assert python.cwd == "/repo"


def test_mount_paths_are_rewritten_where_a_path_starts(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"ckpt": "/local/ckpt", "cfg": "/local/cfg", "shm": "/local/shm"})
    container = {
        "name": "trainer",
        "command": ["python", "-m", "phalanx_trainer"],
        "args": ["--config", "/etc/phalanx/trainer.yaml", "--out=/checkpoints/run", "/checkpointsX"],
        "workingDir": "/checkpoints",
        "env": [{"name": "PHALANX_CHECKPOINT_DIR", "value": "/checkpoints"}],
        "volumeMounts": [
            {"name": "ckpt", "mountPath": "/checkpoints"},
            {"name": "cfg", "mountPath": "/etc/phalanx"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    command = build_local_command(POD, container, ctx, {"SHM": "/dev/shm"})
    assert command.argv[3:] == [
        "--config",
        "/local/cfg/trainer.yaml",
        "--out=/local/ckpt/run",
        "/checkpointsX",
    ]
    assert command.env["PHALANX_CHECKPOINT_DIR"] == "/local/ckpt"
    assert command.env["SHM"] == "/dev/shm"  # the host's shared memory serves as well as a mount would
    assert command.cwd == "/local/ckpt"


def test_mount_paths_inside_a_shell_command_line_are_rewritten(tmp_path: Path) -> None:
    """The form user manifests often take: one `sh -c` string that names mount paths as words."""
    ctx = context(tmp_path, {"scripts": "/local/scripts", "work": "/local/work"})
    container = {
        "name": "trainer",
        "command": ["sh", "-c"],
        "args": [
            "cp /scripts/multinode.py /work && cd /work;python multinode.py --out='/work/out' "
            '>"/work/log" 2>&1|tee /workshop/x (ls /scripts)'
        ],
        "volumeMounts": [
            {"name": "scripts", "mountPath": "/scripts"},
            {"name": "work", "mountPath": "/work"},
        ],
    }
    command = build_local_command(POD, container, ctx, {})
    assert command.argv[2] == (
        "cp /local/scripts/multinode.py /local/work && cd /local/work;python multinode.py --out='/local/work/out' "
        '>"/local/work/log" 2>&1|tee /workshop/x (ls /local/scripts)'
    )


def test_the_agents_own_variables_keep_their_paths_when_a_mount_shadows_them(tmp_path: Path) -> None:
    """A pod mounting /work on a machine whose virtualenv lives under /work: PATH must still find it."""
    ctx = context(tmp_path, {"work": "/local/work"})
    container = {
        "name": "trainer",
        "command": ["sh", "-c", "python /work/x.py"],
        "env": [{"name": "OUT", "value": "/work/out"}],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
    }
    base = {"PATH": "/work/main/.venv/bin:/usr/bin", "HOME": "/work/home"}
    command = build_local_command(POD, container, ctx, base)
    assert command.env["PATH"] == "/work/main/.venv/bin:/usr/bin"
    assert command.env["HOME"] == "/work/home"
    assert command.env["OUT"] == "/local/work/out"  # the container's own value is the pod's path
    assert command.argv[2] == "python /local/work/x.py"


def test_a_mount_path_inside_a_longer_word_is_left_alone() -> None:
    rewrites = [("/data", "/l/data")]
    assert rewrite_paths("http://host/data /database x/data", rewrites) == "http://host/data /database x/data"


def test_a_rewritten_path_is_never_rewritten_again() -> None:
    """One pass: a local directory that itself starts with another mount path stays as it is."""
    rewrites = [("/work", "/tmp/state/w"), ("/tmp", "/l/tmp")]
    assert rewrite_paths("/work/a /tmp/b", rewrites) == "/tmp/state/w/a /l/tmp/b"


def test_nested_mounts_win_over_their_parents() -> None:
    rewrites = [("/data/cache", "/l/cache"), ("/data", "/l/data")]
    assert rewrite_paths("/data/cache/x:/data/y", rewrites) == "/l/cache/x:/l/data/y"


@pytest.mark.parametrize(
    ("container", "problem"),
    [
        ({"name": "c", "args": ["x"]}, "no command"),
        ({"name": "c", "command": ["x"], "envFrom": [{"configMapRef": {"name": "m"}}]}, "envFrom"),
        (
            {"name": "c", "command": ["x"], "env": [{"name": "S", "valueFrom": {"secretKeyRef": {}}}]},
            "fieldRef",
        ),
        ({"name": "c", "command": ["x"], "volumeMounts": [{"name": "nope", "mountPath": "/n"}]}, "nope"),
        (
            {
                "name": "c",
                "command": ["x"],
                "env": [{"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "spec.x"}}}],
            },
            "spec.x",
        ),
    ],
)
def test_what_the_dev_node_cannot_run_is_refused_with_the_reason(
    tmp_path: Path, container: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ContainerConfigError, match=problem):
        build_local_command(POD, container, context(tmp_path), {})


def test_list_variables_keep_the_agents_entry_first() -> None:
    env = {"LD_PRELOAD": "/user/lib.so:/nss.so"}
    prepend_path_list(env, "LD_PRELOAD", "/nss.so", ":")
    prepend_path_list(env, "PYTHONPATH", "/hook", ":")
    assert env == {"LD_PRELOAD": "/nss.so:/user/lib.so", "PYTHONPATH": "/hook"}
