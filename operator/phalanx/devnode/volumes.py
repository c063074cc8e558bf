"""Local directories that back a pod's volumes (thin I/O over a pure plan)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.devnode.containers import ContainerConfigError

# (namespace, name) -> the ConfigMap's data; the agent passes an API call.
ConfigMapReader = Callable[[str, str], Mapping[str, str]]


@dataclass(frozen=True)
class VolumePlan:
    name: str
    directory: str
    files: Mapping[str, str]  # relative path -> content, for configMap volumes


def plan_volumes(
    pod: Mapping[str, Any], pod_dir: Path, claims_dir: Path, read_config_map: ConfigMapReader
) -> list[VolumePlan]:
    """emptyDir: per pod; hostPath: as is; persistentVolumeClaim: per claim, kept across pods;
    configMap: its keys (or the listed items) as files. Anything else is refused with its kind."""
    namespace = pod["metadata"]["namespace"]
    plans = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume["name"]
        if "emptyDir" in volume:
            plans.append(VolumePlan(name, str(pod_dir / "volumes" / name), {}))
        elif "hostPath" in volume:
            plans.append(VolumePlan(name, str(volume["hostPath"]["path"]), {}))
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            plans.append(VolumePlan(name, str(claims_dir / namespace / claim), {}))
        elif "configMap" in volume:
            source = volume["configMap"]
            data = read_config_map(namespace, source["name"])
            items = source.get("items") or [{"key": key, "path": key} for key in data]
            missing = [item["key"] for item in items if item["key"] not in data]
            if missing:
                raise ContainerConfigError(f"configMap {source['name']!r} has no key(s) {missing}")
            files = {item["path"]: data[item["key"]] for item in items}
            plans.append(VolumePlan(name, str(pod_dir / "volumes" / name), files))
        elif "projected" in volume or "downwardAPI" in volume:
            files = _projected_files(pod, volume, read_config_map)
            plans.append(VolumePlan(name, str(pod_dir / "volumes" / name), files))
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise ContainerConfigError(f"volume {name!r} of kind {kinds} is not supported by the dev node")
    return plans


def materialize(plans: list[VolumePlan]) -> dict[str, str]:
    """Creates the directories (and configMap files); returns volume name -> directory."""
    for plan in plans:
        directory = Path(plan.directory)
        directory.mkdir(parents=True, exist_ok=True)
        for relative, content in plan.files.items():
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    return {plan.name: plan.directory for plan in plans}


def _downward_value(pod: Mapping[str, Any], field_path: str) -> str:
    meta = pod.get("metadata") or {}
    if field_path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return str(meta.get(field_path.split(".", 1)[1], ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(field_path.split(".", 1)[1]) or {}
        return "".join(f'{key}="{value}"\n' for key, value in sorted(values.items()))
    raise ContainerConfigError(f"downwardAPI field {field_path!r} is not supported by the dev node")


def _projected_files(
    pod: Mapping[str, Any], volume: Mapping[str, Any], read_config_map: ConfigMapReader
) -> dict[str, str]:
    """configMap and downwardAPI sources become files; a serviceAccountToken source writes nothing
    (dev-node pods get no API credentials; the operator's pods do not mount a token either)."""
    namespace = pod["metadata"]["namespace"]
    if "downwardAPI" in volume:
        sources: list[Mapping[str, Any]] = [{"downwardAPI": volume["downwardAPI"]}]
    else:
        sources = volume["projected"].get("sources") or []
    files: dict[str, str] = {}
    for source in sources:
        if "configMap" in source:
            config_map = source["configMap"]
            try:
                data = read_config_map(namespace, config_map["name"])
            except ContainerConfigError:
                if config_map.get("optional"):
                    continue
                raise
            items = config_map.get("items") or [{"key": key, "path": key} for key in data]
            files.update({item["path"]: data[item["key"]] for item in items if item["key"] in data})
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                if "fieldRef" not in item:
                    raise ContainerConfigError(
                        "downwardAPI resourceFieldRef is not supported by the dev node"
                    )
                files[item["path"]] = _downward_value(pod, item["fieldRef"]["fieldPath"])
    return files
