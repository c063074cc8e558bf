"""Dataclasses as the single source of truth: from them come the CRD's OpenAPI schema, the parser the
operator uses, and the user-facing API reference.

A field's `metadata` (set through `api_field`) carries its description, default, bounds and CEL
rules; Python types map onto OpenAPI types. Nothing here knows about TrainingJob in particular.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

_META = "phalanx_api"


@dataclass(frozen=True)
class Rule:
    """A CEL rule (x-kubernetes-validations) attached to a field or a whole model."""

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def to_openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class FieldInfo:
    description: str
    json_name: str | None = None
    default: Any = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    max_length: int | None = None
    max_items: int | None = None
    rules: tuple[Rule, ...] = ()
    required: bool = False
    preserve_unknown: bool = False
    example: Any = None
    extra: Mapping[str, Any] | None = None


def api_field(
    description: str,
    *,
    default: Any = None,
    json_name: str | None = None,
    minimum: int | float | None = None,
    maximum: int | float | None = None,
    enum: tuple[str, ...] | None = None,
    pattern: str | None = None,
    max_length: int | None = None,
    max_items: int | None = None,
    rules: tuple[Rule, ...] = (),
    required: bool = False,
    preserve_unknown: bool = False,
    example: Any = None,
    extra: Mapping[str, Any] | None = None,
    factory: Any = None,
) -> Any:
    """Declares a model field. `default` is both the Python default and the schema default."""
    info = FieldInfo(
        description, json_name, default, minimum, maximum, enum, pattern, max_length, max_items, rules,
        required, preserve_unknown, example, extra,
    )  # fmt: skip
    metadata = {_META: info}
    if factory is not None:
        # `default` stays the schema's default ({} makes the API server fill in nested defaults).
        return dataclasses.field(default_factory=factory, metadata=metadata)
    if isinstance(default, (list, dict)):
        frozen = default
        return dataclasses.field(default_factory=lambda: type(frozen)(frozen), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_info(f: dataclasses.Field[Any]) -> FieldInfo:
    info = f.metadata.get(_META)
    if not isinstance(info, FieldInfo):
        raise TypeError(f"field {f.name} is not declared with api_field()")
    return info


def json_name(f: dataclasses.Field[Any]) -> str:
    info = field_info(f)
    if info.json_name:
        return info.json_name
    head, *rest = f.name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def model_rules(cls: type) -> tuple[Rule, ...]:
    rules: tuple[Rule, ...] = getattr(cls, "__rules__", ())
    return rules


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
    return tp, False


def openapi_schema(tp: Any, info: FieldInfo | None = None) -> dict[str, Any]:
    """OpenAPI v3 (structural) schema for a Python type, with the field's metadata applied."""
    tp, _ = _unwrap_optional(tp)
    schema: dict[str, Any]
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        schema = model_schema(tp)
    elif tp is bool:
        schema = {"type": "boolean"}
    elif tp is int:
        schema = {"type": "integer", "format": "int32"}
    elif tp is float:
        schema = {"type": "number"}
    elif tp is str:
        schema = {"type": "string"}
    elif origin is list:
        (item,) = get_args(tp)
        schema = {"type": "array", "items": openapi_schema(item)}
    elif origin is dict:
        _, value = get_args(tp)
        if value is Any:
            schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        else:
            schema = {"type": "object", "additionalProperties": openapi_schema(value)}
    elif tp is Any:
        schema = {"x-kubernetes-preserve-unknown-fields": True}
    else:
        raise TypeError(f"no OpenAPI mapping for {tp!r}")
    if info is None:
        return schema
    schema["description"] = info.description
    if info.default is not None and not info.required:  # required fields keep a Python default only
        schema["default"] = info.default
    for key, value in (
        ("minimum", info.minimum), ("maximum", info.maximum), ("pattern", info.pattern),
        ("maxLength", info.max_length), ("maxItems", info.max_items),
    ):  # fmt: skip
        if value is not None:
            schema[key] = value
    if info.enum:
        schema["enum"] = list(info.enum)
    if info.preserve_unknown:
        schema["x-kubernetes-preserve-unknown-fields"] = True
    if info.extra:
        _merge(schema, info.extra)
    if info.rules:
        schema.setdefault("x-kubernetes-validations", []).extend(r.to_openapi() for r in info.rules)
    return schema


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def model_schema(cls: type) -> dict[str, Any]:
    """The schema of a model. A model that names `__kubernetes_type__` refines that Kubernetes type:
    its schema is Kubernetes' own (api/k8s_schema.py), with the model's fields laid over it."""
    hints = get_type_hints(cls)
    base: dict[str, Any] = {}
    kubernetes_type = getattr(cls, "__kubernetes_type__", None)
    if kubernetes_type:
        from phalanx.api.k8s_schema import kubernetes_schema  # CRD generation only

        base = kubernetes_schema(kubernetes_type)
    properties: dict[str, Any] = dict(base.get("properties") or {})
    required: list[str] = list(base.get("required") or [])
    for f in dataclasses.fields(cls):
        info = field_info(f)
        own = openapi_schema(hints[f.name], info)
        if json_name(f) in properties:
            merged = dict(properties[json_name(f)])
            _merge(merged, own)
            own = merged
        properties[json_name(f)] = own
        if info.required and json_name(f) not in required:
            required.append(json_name(f))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    if required:
        schema["required"] = required
    if getattr(cls, "__preserve_unknown__", False):
        schema["x-kubernetes-preserve-unknown-fields"] = True
    rules = model_rules(cls)
    if rules:
        schema["x-kubernetes-validations"] = [r.to_openapi() for r in rules]
    return schema


class ParseError(ValueError):
    """A field of an object does not match the model: names the field path."""


def parse(cls: type[T], raw: Mapping[str, Any] | None, path: str = "") -> T:
    """Builds a model from API JSON, applying the schema's defaults (as the API server would)."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ParseError(f"{path or cls.__name__}: expected an object")
    kwargs: dict[str, Any] = {}
    for attribute, name, hint in _fields_of(typing.cast(type, cls)):
        if name in raw and raw[name] is not None:
            kwargs[attribute] = _parse_value(hint, raw[name], f"{path}.{name}" if path else name)
    return cls(**kwargs)


@functools.cache
def _fields_of(cls: type) -> tuple[tuple[str, str, Any], ...]:
    """(attribute, JSON name, type) per field; resolving type hints is slow and a reconcile parses
    a spec several times."""
    hints = get_type_hints(cls)
    return tuple((f.name, json_name(f), hints[f.name]) for f in dataclasses.fields(cls))


def _parse_value(tp: Any, value: Any, path: str) -> Any:
    tp, _ = _unwrap_optional(tp)
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return parse(tp, value, path)
    if origin is list:
        (item,) = get_args(tp)
        if not isinstance(value, list):
            raise ParseError(f"{path}: expected a list")
        return [_parse_value(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParseError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParseError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str and not isinstance(value, str):
        raise ParseError(f"{path}: expected a string, got {value!r}")
    if tp is bool and not isinstance(value, bool):
        raise ParseError(f"{path}: expected true or false, got {value!r}")
    return value


def to_json(model: Any) -> Any:
    """The inverse of parse: API JSON with camelCase names, dropping unset (None) fields."""
    if dataclasses.is_dataclass(model) and not isinstance(model, type):
        out = {}
        for f in dataclasses.fields(model):
            value = getattr(model, f.name)
            if value is not None:
                out[json_name(f)] = to_json(value)
        return out
    if isinstance(model, list):
        return [to_json(v) for v in model]
    return model


__all__ = ["Rule", "api_field", "model_schema", "openapi_schema", "parse", "to_json", "ParseError", "typing"]
