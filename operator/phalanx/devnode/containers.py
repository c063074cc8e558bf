"""From a pod's container to a local process: argv, environment and working directory (pure).

The image is ignored: the agent's Python environment stands in for it. Bare command names are looked
up in the agent's virtualenv first (so `python`, `torchrun` and `phalanx` are the repo's), and volume
mount paths in the command, args (shell command lines included), env values and workingDir are
rewritten to the local directories that back the volumes (docs/dev-node.md explains why rewriting
rather than mounting).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PYTHON_NAMES = frozenset({"python", "python3", "python3.11"})
# Paths whose host version serves the process as well as a mount would (memory-backed shared memory).
NOT_REWRITTEN = frozenset({"/dev/shm"})
_VAR_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ContainerConfigError(ValueError):
    """The pod asks for something the dev node cannot give; the message becomes the pod's reason."""


@dataclass(frozen=True)
class PodContext:
    """What the agent knows about a pod beyond its spec."""

    pod_ip: str
    node_name: str
    host_ip: str
    volume_dirs: Mapping[str, str]  # volume name -> local directory
    python: str  # the interpreter that stands in for `python`
    venv_bin: str  # searched first for bare command names
    default_workdir: str  # the "image's" WORKDIR when the container sets none


@dataclass(frozen=True)
class LocalCommand:
    argv: list[str]
    env: dict[str, str]
    cwd: str


def expand_references(text: str, values: Mapping[str, str]) -> str:
    """Kubernetes $(VAR) expansion: known names are replaced, unknown ones kept, $$ escapes a $."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return values.get(name, match.group(0))

    return _VAR_REFERENCE.sub(replace, text)


def field_value(pod: Mapping[str, Any], path: str, context: PodContext) -> str:
    """The downward API fields a fieldRef may name."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": context.node_name,
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": context.pod_ip,
        "status.podIPs": context.pod_ip,
        "status.hostIP": context.host_ip,
        "status.hostIPs": context.host_ip,
    }
    if path in simple:
        return str(simple[path])
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise ContainerConfigError(f"fieldRef {path!r} is not supported by the dev node")


def mount_rewrites(container: Mapping[str, Any], volume_dirs: Mapping[str, str]) -> list[tuple[str, str]]:
    """(mountPath, local directory) pairs, longest mount path first so nested mounts win."""
    pairs = []
    for mount in container.get("volumeMounts") or []:
        path = str(mount["mountPath"]).rstrip("/") or "/"
        if path in NOT_REWRITTEN:
            continue
        name = mount["name"]
        if name not in volume_dirs:
            raise ContainerConfigError(f"volumeMount {name!r} names no volume the dev node could prepare")
        local = volume_dirs[name]
        sub = mount.get("subPath")
        pairs.append((path, str(Path(local) / sub) if sub else local))
    return sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)


# Where a path can start: the beginning of a value, after '=', ':' or ',' (NAME=/p, a:/p, a,/p), and,
# for shell command lines (`sh -c "cp /scripts/x /work && cd /work"`), after a space, a quote or a
# shell operator. It must end the value or go on with '/' or one of the same delimiters.
_PATH_START = r"(?:^|(?<=[=:,\s'\"`;|&(<>]))"
_PATH_END = r"(?=$|[/:,\s'\"`;|&)<>])"


def rewrite_paths(text: str, rewrites: Sequence[tuple[str, str]]) -> str:
    """Replaces each mount path where a path starts (see _PATH_START), in one pass, longest first."""
    if not rewrites:
        return text
    local_of = dict(rewrites)
    alternatives = "|".join(re.escape(path) for path in sorted(local_of, key=len, reverse=True))
    pattern = re.compile(_PATH_START + "(" + alternatives + ")" + _PATH_END)
    return pattern.sub(lambda match: local_of[match.group(1)], text)


def resolve_executable(name: str, context: PodContext, path_dirs: Sequence[str]) -> str:
    if "/" in name:
        return name
    if name in PYTHON_NAMES:
        return context.python
    for directory in (context.venv_bin, *path_dirs):
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    return name  # let the spawn fail with the kubelet's reason for it


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], context: PodContext, base: Mapping[str, str]
) -> dict[str, str]:
    """Base environment, then the container's env in order (each may expand the ones before it)."""
    env = dict(base)
    if container.get("envFrom"):
        raise ContainerConfigError("envFrom is not supported by the dev node")
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" in item:
            source = item["valueFrom"]
            if "fieldRef" not in source:
                raise ContainerConfigError(
                    f"env {name}: only valueFrom.fieldRef is supported by the dev node"
                )
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], context)
        else:
            env[name] = expand_references(str(item.get("value", "")), env)
    return env


def build_local_command(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    context: PodContext,
    base_env: Mapping[str, str],
) -> LocalCommand:
    """argv, env and cwd for one container; raises ContainerConfigError for what cannot run here."""
    command = [str(part) for part in container.get("command") or []]
    args = [str(part) for part in container.get("args") or []]
    if not command:
        raise ContainerConfigError(
            f"container {container.get('name')!r} has no command: the dev node cannot read an image's entrypoint"
        )
    rewrites = mount_rewrites(container, context.volume_dirs)
    env = container_env(pod, container, context, base_env)
    # Only what the container sets holds the pod's paths; the agent's own variables (PATH to its
    # virtualenv, HOME) are host paths, even where a mount path is a prefix of them.
    own = {str(item["name"]) for item in container.get("env") or []}
    env = {name: rewrite_paths(value, rewrites) if name in own else value for name, value in env.items()}
    argv = [rewrite_paths(expand_references(part, env), rewrites) for part in (*command, *args)]
    path_dirs = [d for d in env.get("PATH", "").split(":") if d]
    argv[0] = resolve_executable(argv[0], context, path_dirs)
    workdir = container.get("workingDir")
    cwd = rewrite_paths(str(workdir), rewrites) if workdir else context.default_workdir
    return LocalCommand(argv=argv, env=env, cwd=cwd)


def prepend_path_list(env: dict[str, str], name: str, entry: str, separator: str) -> None:
    """Keeps `entry` first in a list-valued variable whatever the container set it to."""
    current = [part for part in env.get(name, "").split(separator) if part and part != entry]
    env[name] = separator.join([entry, *current])
