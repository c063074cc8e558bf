"""Typed trainer configuration: one dataclass per section, loaded from TOML or YAML plus overrides.

Loading never raises a traceback at the user: every mistake becomes one line in `ConfigError.problems`.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phalanx_trainer.checkpoint import CheckpointConfig
from phalanx_trainer.global_batch import BatchPlan, GlobalBatchError, plan_batch
from phalanx_trainer.parallel_dims import layout_problems


class ConfigError(Exception):
    """One message per mistake, ready to print."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class WorldSizeError(ConfigError):
    """The config is valid, but not at the world size it was launched with."""


class WorldTooSmallError(WorldSizeError):
    """The world is smaller than tp x pp: no smaller world is usable either."""


@dataclass
class JobConfig:
    name: str = "phalanx"
    seed: int = 1234
    steps: int = 100  # optimizer steps
    device: str = "auto"  # auto | cpu | cuda
    torch_threads: int = 0  # 0: torch's default
    # auto: on for CPU (bitwise repeatable losses for a fixed seed), off on CUDA, where it fills every
    # new allocation with NaN and picks slow kernels | on | off
    deterministic: str = "auto"


@dataclass
class ModelConfig:
    kind: str = "gpt"  # gpt | mlp | custom
    custom: str = ""  # "module:function" taking (ModelConfig) and returning an nn.Module (kind = custom)
    vocab_size: int = 256  # byte level for the shipped text
    seq_len: int = 128
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 0  # 0: 4 x d_model
    init_std: float = 0.02
    activation_checkpointing: bool = False  # recompute each block in backward
    compile: bool = False  # torch.compile each block


@dataclass
class DataConfig:
    source: str = "text"  # text | synthetic | custom
    path: str = ""  # text file; empty: the shipped public-domain text
    custom: str = ""  # "module:function" taking (DataConfig, ModelConfig) and returning a SampleSource
    batch_size: int = 8  # sequences per micro-batch per data-parallel rank
    # Sequences per optimizer step, the same at every world size (elastic resize): accumulation steps
    # are derived from it (global_batch.py). 0: off, batch_size x dp x grad_accumulation_steps.
    global_batch_size: int = 0
    # With global_batch_size: when it does not divide by batch_size x dp, let the per-rank micro-batch
    # shrink below batch_size (batch_size is then the largest micro-batch) instead of failing.
    adjust_batch_size: bool = False
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int = 2  # only with num_workers > 0
    persistent_workers: bool = False  # only with num_workers > 0


@dataclass
class OptimizerConfig:
    name: str = "adamw"  # adamw | lamb | lars | sgd
    lr: float = 3e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9  # sgd and lars
    trust_coefficient: float = 0.001  # lars
    fused: str = "auto"  # auto | on | off (AdamW's fused kernel)
    grad_clip: float = 1.0  # global L2 norm across all shards; 0 disables


@dataclass
class ScheduleConfig:
    kind: str = "cosine"  # constant | cosine | wsd | cyclic
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1  # floor of cosine / wsd decay, and the low end of cyclic
    decay_fraction: float = 0.2  # wsd: share of the steps spent decaying at the end
    cycle_steps: int = 100  # cyclic: length of one triangle


@dataclass
class ParallelismConfig:
    dp: int = -1  # -1: world_size / (tp x pp)
    tp: int = 1
    pp: int = 1
    dp_mode: str = "ddp"  # ddp | zero1 | zero2 | fsdp
    pp_schedule: str = "1f1b"  # gpipe | 1f1b
    pp_microbatches: int = 2
    grad_accumulation_steps: int = 1
    ddp_bucket_mb: float = 25.0
    # zero2 / fsdp with grad_accumulation_steps > 1: false reduce-scatters every micro-step and keeps
    # only sharded gradients; true reduces once per step but holds every unsharded fp32 gradient
    # until the last micro-step (docs/trainer.md).
    fsdp_defer_reduce: bool = False


@dataclass
class PrecisionConfig:
    dtype: str = "fp32"  # fp32 | bf16 | fp16  (parameters stay fp32: master weights)
    initial_scale: float = 65536.0  # fp16 loss scale
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000  # overflow-free steps before the scale grows


@dataclass
class MetricsConfig:
    port: int = -1  # -1: $PHALANX_METRICS_PORT (default 9400) + local rank; 0: no server
    log_every: int = 10  # steps between progress lines from rank 0
    # A rank slower than this times the median of the others (data wait + forward) for this many
    # logged steps in a row is reported as a straggler (straggler.py); checked at each logged step.
    straggler_factor: float = 2.0
    straggler_steps: int = 20
    # Peak FLOP/s of one device for MFU; 0: from the table of known GPUs (hardware.py), and no MFU
    # on devices it does not list (CPU)
    peak_flops: float = 0.0
    json_logs: bool = True
    profile_start_step: int = 0  # torch.profiler window; 0: off
    profile_steps: int = 0
    profile_dir: str = "profiles"


@dataclass
class TrainerConfig:
    job: JobConfig = field(default_factory=JobConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTION_TYPES = typing.get_type_hints(TrainerConfig)

_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("job", "device"): ("auto", "cpu", "cuda"),
    ("job", "deterministic"): ("auto", "on", "off"),
    ("model", "kind"): ("gpt", "mlp", "custom"),
    ("data", "source"): ("text", "synthetic", "custom"),
    ("optimizer", "name"): ("adamw", "lamb", "lars", "sgd"),
    ("optimizer", "fused"): ("auto", "on", "off"),
    ("schedule", "kind"): ("constant", "cosine", "wsd", "cyclic"),
    ("parallelism", "dp_mode"): ("ddp", "zero1", "zero2", "fsdp"),
    ("parallelism", "pp_schedule"): ("gpipe", "1f1b"),
    ("precision", "dtype"): ("fp32", "bf16", "fp16"),
}


def _coerce(value: Any, annotation: Any, where: str) -> tuple[Any, str | None]:
    """Converts a parsed value to the field's type; returns (value, problem)."""
    if annotation is bool:
        if isinstance(value, bool):
            return value, None
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true", None
        return value, f"{where}: expected true or false, got {value!r}"
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        return value, f"{where}: expected an integer, got {value!r}"
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value), None
        try:
            # YAML 1.1 reads 1.0e12 (no exponent sign) as a string; accept what float() accepts.
            return float(value), None
        except (TypeError, ValueError):
            return value, f"{where}: expected a number, got {value!r}"
    if annotation is str:
        if isinstance(value, str):
            return value, None
        return value, f"{where}: expected a string, got {value!r}"
    if isinstance(annotation, types.UnionType):  # pragma: no cover - no such field today
        return value, None
    return value, None


def _parse_override_value(text: str) -> Any:
    """`key=value` values are read as TOML literals when they parse, else as plain strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError([f"cannot read config file {path}: {err.strerror}"]) from None
    try:
        if path.suffix in (".yaml", ".yml"):
            loaded = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            loaded = json.loads(text)
        else:
            loaded = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as err:
        first_line = str(err).splitlines()[0]
        raise ConfigError([f"{path}: not valid {path.suffix.lstrip('.') or 'TOML'}: {first_line}"]) from None
    if not isinstance(loaded, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections"])
    return loaded


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Applies `section.key=value` strings; returns the merged mapping and the malformed ones."""
    merged = {name: dict(body) if isinstance(body, dict) else body for name, body in raw.items()}
    problems: list[str] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            problems.append(f"override {item!r}: expected section.key=value")
            continue
        body = merged.setdefault(section, {})
        if isinstance(body, dict):
            body[name] = _parse_override_value(value.strip())
    return merged, problems


def build_config(raw: dict[str, Any]) -> tuple[TrainerConfig, list[str]]:
    """Builds typed sections from a mapping; unknown names and wrong types become problems."""
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for section, body in raw.items():
        section_type = _SECTION_TYPES.get(section)
        if section_type is None:
            problems.append(f"unknown section [{section}] (known: {', '.join(_SECTION_TYPES)})")
            continue
        if not isinstance(body, dict):
            problems.append(f"[{section}] must be a table of key = value")
            continue
        hints = typing.get_type_hints(section_type)
        values: dict[str, Any] = {}
        for key, value in body.items():
            if key not in hints:
                problems.append(f"{section}.{key}: unknown key (known: {', '.join(hints)})")
                continue
            if isinstance(value, bool) and {"on", "off"} <= set(_CHOICES.get((section, key), ())):
                value = "on" if value else "off"  # true/false (and YAML's bare on/off) in a switch
            coerced, problem = _coerce(value, hints[key], f"{section}.{key}")
            if problem and (section, key) in _CHOICES:
                problem += f" (one of {', '.join(_CHOICES[section, key])})"
            if problem:
                problems.append(problem)
            else:
                values[key] = coerced
        sections[section] = section_type(**values)
    return TrainerConfig(**sections), problems


def validate(config: TrainerConfig, world_size: int | None = None) -> list[str]:
    """Semantic checks; `world_size` adds the layout checks that depend on the launch."""
    problems: list[str] = []
    for (section, key), allowed in _CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in allowed:
            problems.append(f"{section}.{key} = {value!r}: must be one of {', '.join(allowed)}")

    def positive(section: str, key: str, minimum: float = 1) -> None:
        value = getattr(getattr(config, section), key)
        if value < minimum:
            problems.append(f"{section}.{key} = {value}: must be >= {minimum}")

    positive("job", "steps")
    positive("model", "seq_len")
    positive("model", "d_model")
    positive("model", "n_layers")
    positive("model", "n_heads")
    positive("model", "vocab_size", 2)
    positive("data", "batch_size")
    positive("data", "num_workers", 0)
    positive("data", "global_batch_size", 0)
    positive("parallelism", "tp")
    positive("parallelism", "pp")
    positive("parallelism", "pp_microbatches")
    positive("parallelism", "grad_accumulation_steps")
    positive("metrics", "log_every")
    positive("checkpoint", "keep", 2)
    positive("checkpoint", "write_bytes_per_second", 0)
    positive("precision", "growth_interval")
    if config.optimizer.lr <= 0:
        problems.append(f"optimizer.lr = {config.optimizer.lr}: must be > 0")
    if config.parallelism.dp == 0 or config.parallelism.dp < -1:
        problems.append(f"parallelism.dp = {config.parallelism.dp}: must be >= 1, or -1 for the rest")

    model, par = config.model, config.parallelism
    if model.kind == "gpt" and model.n_heads > 0 and model.d_model % model.n_heads:
        problems.append(
            f"model.d_model = {model.d_model} must be divisible by model.n_heads = {model.n_heads}"
        )
    if model.kind == "custom" and ":" not in model.custom:
        problems.append("model.custom: kind = custom needs module:function")
    if config.data.source == "custom" and ":" not in config.data.custom:
        problems.append("data.custom: source = custom needs module:function")
    if par.tp > 1 and model.kind == "gpt" and model.n_heads % par.tp:
        problems.append(f"model.n_heads = {model.n_heads} must be divisible by parallelism.tp = {par.tp}")
    if par.tp > 1 and model.kind == "gpt" and (model.d_ff or 4 * model.d_model) % par.tp:
        problems.append(f"the MLP width must be divisible by parallelism.tp = {par.tp}")
    if par.tp > 1 and model.kind == "gpt" and model.seq_len % par.tp:
        problems.append(
            f"model.seq_len = {model.seq_len} must be divisible by parallelism.tp = {par.tp}"
            " (sequence parallelism splits the sequence between tensor-parallel ranks)"
        )
    if par.tp > 1 and model.kind != "gpt":
        problems.append("parallelism.tp > 1 needs model.kind = gpt (the TP plan splits attention and MLP)")
    if par.pp > 1 and model.kind != "gpt":
        problems.append("parallelism.pp > 1 needs model.kind = gpt (stages split the transformer blocks)")
    if par.pp > 1 and model.n_layers < par.pp:
        problems.append(f"model.n_layers = {model.n_layers} must be >= parallelism.pp = {par.pp}")
    if par.pp > 1 and config.data.batch_size % par.pp_microbatches:
        problems.append(
            f"data.batch_size = {config.data.batch_size} must be divisible by "
            f"parallelism.pp_microbatches = {par.pp_microbatches}"
        )
    if config.data.global_batch_size > 0 and par.grad_accumulation_steps != 1:
        problems.append(
            f"parallelism.grad_accumulation_steps = {par.grad_accumulation_steps} with "
            f"data.global_batch_size = {config.data.global_batch_size}: the accumulation steps are derived "
            "from the global batch; set one or the other"
        )
    if config.data.adjust_batch_size and config.data.global_batch_size <= 0:
        problems.append("data.adjust_batch_size = true needs data.global_batch_size > 0")
    if config.data.num_workers == 0 and config.data.persistent_workers:
        problems.append("data.persistent_workers = true needs data.num_workers > 0")
    if config.checkpoint.keep < 2:
        pass  # reported by positive() above

    if par.tp >= 1 and par.pp >= 1 and par.dp >= -1 and par.dp != 0:
        # Before the launch (no world size yet), check the smallest world this layout allows.
        launch_size = world_size if world_size is not None else max(par.dp, 1) * par.tp * par.pp
        layout = layout_problems(par, launch_size)
        problems.extend(layout)
        if not layout and not problems:
            problems.extend(_batch_plan_problems(config, launch_size))
    return problems


def _batch_plan_problems(config: TrainerConfig, world_size: int) -> list[str]:
    """Whether data.global_batch_size splits over this launch's data-parallel ranks."""
    try:
        batch_plan(config, world_size)
    except GlobalBatchError as err:
        return [str(err)]
    return []


def batch_plan(config: TrainerConfig, world_size: int) -> BatchPlan:
    """The micro-batch and accumulation steps this launch trains with (global_batch.py)."""
    par = config.parallelism
    model_parallel = par.tp * par.pp
    return plan_batch(
        global_batch_size=config.data.global_batch_size,
        batch_size=config.data.batch_size,
        grad_accumulation_steps=par.grad_accumulation_steps,
        dp=par.dp if par.dp != -1 else world_size // model_parallel,
        model_parallel=model_parallel,
        pp_microbatches=par.pp_microbatches if par.pp > 1 else 1,
        adjust_batch_size=config.data.adjust_batch_size,
    )


def with_batch_plan(config: TrainerConfig, plan: BatchPlan) -> TrainerConfig:
    """The config as trained: the derived micro-batch and accumulation steps in their usual fields."""
    return dataclasses.replace(
        config,
        data=dataclasses.replace(config.data, batch_size=plan.micro_batch_size),
        parallelism=dataclasses.replace(
            config.parallelism, grad_accumulation_steps=plan.grad_accumulation_steps
        ),
    )


def deterministic_enabled(job: JobConfig, device_type: str) -> bool:
    """Whether to call torch.use_deterministic_algorithms for this device."""
    if job.deterministic == "auto":
        return device_type != "cuda"
    return job.deterministic == "on"


def load_config(path: Path | None, overrides: list[str], world_size: int | None = None) -> TrainerConfig:
    """File + overrides -> validated config, or ConfigError listing every mistake."""
    raw = read_config_file(path) if path is not None else {}
    merged, problems = apply_overrides(raw, overrides)
    config, build_problems = build_config(merged)
    problems += build_problems
    if not problems:
        problems += validate(config, world_size)
        if problems and world_size is not None and not validate(config, None):
            # Valid at its own smallest layout: this size is the trouble, unless dp is fixed (then no
            # other size is usable either: the config's mistake, for an elastic job too).
            par = config.parallelism
            fixed_world = par.dp * par.tp * par.pp
            if par.dp != -1 and fixed_world != world_size:
                raise ConfigError([*problems,
                    f"parallelism.dp = {par.dp} is fixed: it needs a world size of dp x tp x pp = {fixed_world}, "
                    f"launched with {world_size}; set parallelism.dp = -1 to take the rest (an elastic job needs it)"
                ])  # fmt: skip
            if world_size < par.tp * par.pp:
                raise WorldTooSmallError([
                    f"tp x pp = {par.tp * par.pp} does not fit in {world_size} rank(s): the smallest usable "
                    f"world size is {par.tp * par.pp}"
                ])  # fmt: skip
            raise WorldSizeError(problems)
    if problems:
        raise ConfigError(problems)
    return config
