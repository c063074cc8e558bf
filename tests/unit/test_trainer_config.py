"""Trainer config: typed sections from TOML / YAML plus overrides, one clear message per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx_trainer.__main__ import apply_env_defaults, main, metrics_port
from phalanx_trainer.config import ConfigError, TrainerConfig, deterministic_enabled, load_config

pytestmark = pytest.mark.unit

CONFIGS = Path(__file__).resolve().parents[2] / "trainer-image" / "phalanx_trainer" / "configs"


def problems_of(path: Path | None, overrides: list[str], world_size: int | None = 1) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides, world_size)
    return caught.value.problems


def test_no_file_gives_the_defaults() -> None:
    assert load_config(None, [], 1) == TrainerConfig()


def test_toml_file_and_typed_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[model]\nd_model = 64\nn_heads = 4\n[optimizer]\nname = "lamb"\n')
    config = load_config(path, ["optimizer.lr=0.01", "parallelism.dp_mode=fsdp", "model.compile=true"], 1)
    assert config.model.d_model == 64
    assert config.optimizer.name == "lamb"
    assert config.optimizer.lr == 0.01
    assert config.parallelism.dp_mode == "fsdp"  # an unquoted word is read as a string
    assert config.model.compile is True


def test_yaml_file_with_integer_for_float_and_unsigned_exponent(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  lr: 1\nmetrics:\n  peak_flops: 1.0e12\n")
    config = load_config(path, [], 1)
    assert config.optimizer.lr == 1.0
    assert config.metrics.peak_flops == 1e12


def test_every_mistake_gets_its_own_message(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[modle]\nx = 1\n[model]\ndepth = 3\nd_model = "big"\n[optimizer]\nname = "adam"\n')
    problems = problems_of(path, ["nonsense"])
    assert len(problems) == 4, problems
    assert any("unknown section [modle]" in p for p in problems)
    assert any("model.depth: unknown key" in p for p in problems)
    assert any("model.d_model: expected an integer, got 'big'" in p for p in problems)
    assert any("override 'nonsense'" in p for p in problems)


def test_choice_and_range_mistakes_after_types_are_right() -> None:
    problems = problems_of(None, ["optimizer.name=adam", "job.steps=0", "data.batch_size=-1"])
    assert problems == [
        "optimizer.name = 'adam': must be one of adamw, lamb, lars, sgd",
        "job.steps = 0: must be >= 1",
        "data.batch_size = -1: must be >= 1",
    ]


def test_layout_product_must_equal_world_size() -> None:
    layout = ["parallelism.dp=2", "parallelism.tp=2", "parallelism.pp=1", "parallelism.dp_mode=fsdp"]
    problems = problems_of(None, layout, world_size=6)
    assert problems[0] == "dp x tp x pp = 2 x 2 x 1 = 4 != world size 6"
    assert "set parallelism.dp = -1" in problems[1] and len(problems) == 2  # fixed dp: no world size but 4


def test_world_size_must_divide_by_tp_times_pp_when_dp_is_inferred() -> None:
    problems = problems_of(None, ["parallelism.tp=2", "model.n_layers=4", "parallelism.pp=2"], world_size=6)
    assert problems == ["world size 6 is not divisible by tp x pp = 2 x 2 = 4"]


def test_heads_must_split_over_tensor_parallel_ranks() -> None:
    problems = problems_of(None, ["model.n_heads=3", "model.d_model=96", "parallelism.tp=2"], world_size=2)
    assert problems == ["model.n_heads = 3 must be divisible by parallelism.tp = 2"]


def test_invalid_toml_is_one_message(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[job\nsteps = 1\n")
    [problem] = problems_of(path, [])
    assert problem.startswith(f"{path}: not valid toml")


def test_missing_file_is_one_message(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path / "absent.toml", [])
    assert "cannot read config file" in problem


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "path", [*sorted(CONFIGS.glob("*.toml")), EXAMPLES / "demo-trainer.yaml"], ids=lambda p: p.name
)
def test_shipped_example_configs_are_valid(path: Path) -> None:
    config = load_config(path, [], None)
    assert config.job.steps > 0


def test_entry_point_reports_a_bad_config_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[parallelism]\ntp = 2\ndp = 2\n")
    assert main(["--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        "phalanx-trainer: config error: dp x tp x pp = 2 x 2 x 1 = 4 != world size 1",
        "phalanx-trainer: config error: parallelism.dp_mode = 'ddp': tp = 2 with dp = 2 needs sharded data"
        ' parallelism: use dp_mode = "fsdp" or "zero2", or dp = 1',
    ]


def test_operator_env_fills_checkpoint_defaults_but_not_explicit_values() -> None:
    env = {
        "PHALANX_CHECKPOINT_DIR": "/ckpt",
        "PHALANX_CHECKPOINT_INTERVAL_STEPS": "50",
        "PHALANX_CHECKPOINT_KEEP": "5",
    }
    filled = apply_env_defaults(TrainerConfig(), env)
    assert (filled.checkpoint.dir, filled.checkpoint.interval_steps, filled.checkpoint.keep) == (
        "/ckpt",
        50,
        5,
    )
    explicit = load_config(None, ["checkpoint.dir='/mine'", "checkpoint.interval_steps=7"], 1)
    kept = apply_env_defaults(explicit, env)
    assert (kept.checkpoint.dir, kept.checkpoint.interval_steps) == ("/mine", 7)


def test_grace_period_caps_the_emergency_budget() -> None:
    filled = apply_env_defaults(TrainerConfig(), {"PHALANX_TERMINATION_GRACE_SECONDS": "15"})
    assert filled.checkpoint.emergency_budget_seconds == 10.0


def test_metrics_port_per_local_rank() -> None:
    assert metrics_port(-1, {}, 0) == 9400
    assert metrics_port(-1, {"PHALANX_METRICS_PORT": "9500"}, 3) == 9503
    assert metrics_port(0, {"PHALANX_METRICS_PORT": "9500"}, 1) == 0
    assert metrics_port(-1, {"PHALANX_METRICS_PORT": "0"}, 1) == 0
    assert metrics_port(8000, {}, 1) == 8001


def test_deterministic_algorithms_default_on_for_cpu_and_off_on_cuda() -> None:
    # On CUDA deterministic mode fills every new allocation with NaN and picks slow kernels.
    job = load_config(None, [], 1).job
    assert deterministic_enabled(job, "cpu") is True
    assert deterministic_enabled(job, "cuda") is False
    forced_on = load_config(None, ["job.deterministic=on"], 1).job
    assert deterministic_enabled(forced_on, "cuda") is True
    forced_off = load_config(None, ["job.deterministic=off"], 1).job
    assert deterministic_enabled(forced_off, "cpu") is False


def test_deterministic_setting_takes_booleans_as_on_and_off_and_names_its_choices() -> None:
    """Configs written before `auto` existed say `deterministic: true` (YAML's bare on/off are booleans too)."""
    assert load_config(None, ["job.deterministic=true"], 1).job.deterministic == "on"
    assert load_config(None, ["job.deterministic=false"], 1).job.deterministic == "off"
    assert problems_of(None, ["job.deterministic=1"]) == [
        "job.deterministic: expected a string, got 1 (one of auto, on, off)"
    ]


def test_a_config_that_only_this_world_size_cannot_split_exits_with_its_own_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # global batch 96 over 5 data-parallel ranks: fine at 1, 2, 3, 4, 6 ranks, not at 5. The
    # operator reads the code as "this size is unusable" and retries an elastic gang smaller.
    from phalanx_trainer import contract

    path = tmp_path / "c.toml"
    path.write_text("[data]\nglobal_batch_size = 96\nbatch_size = 96\n")
    monkeypatch.setenv("WORLD_SIZE", "5")
    monkeypatch.setenv("RANK", "0")
    assert main(["--config", str(path)]) == contract.EXIT_WORLD_SIZE_UNUSABLE
    err = capsys.readouterr().err
    assert "world size 5" in err and "Traceback" not in err
    # A mistake at every size stays a config error (exit 1).
    path.write_text(
        "[data]\nglobal_batch_size = 96\nbatch_size = 96\nnum_workers = 0\npersistent_workers = true\n"
    )
    assert main(["--config", str(path)]) == contract.EXIT_PERMANENT_ERROR


def test_the_world_size_exit_code_is_the_operators() -> None:
    from phalanx import constants as c
    from phalanx_trainer import contract

    assert contract.EXIT_WORLD_SIZE_UNUSABLE == c.EXIT_WORLD_SIZE_UNUSABLE == 78


def test_the_unusable_world_size_message_carries_the_marker_the_operator_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exit 78 alone is os.EX_CONFIG, which any script may use: the operator reads an unusable world
    # size only from the trainer container's termination message (its stderr) carrying this marker.
    from phalanx import constants as c
    from phalanx_trainer import contract

    assert contract.WORLD_SIZE_UNUSABLE_MARKER == c.WORLD_SIZE_UNUSABLE_MARKER
    path = tmp_path / "c.toml"
    path.write_text("[data]\nglobal_batch_size = 96\nbatch_size = 96\n")
    monkeypatch.setenv("WORLD_SIZE", "5")
    monkeypatch.setenv("RANK", "0")
    assert main(["--config", str(path)]) == contract.EXIT_WORLD_SIZE_UNUSABLE
    assert contract.WORLD_SIZE_UNUSABLE_MARKER in capsys.readouterr().err


def test_a_fixed_dp_that_differs_from_the_world_is_a_config_error_naming_dp_minus_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No world size is usable but dp x tp x pp: not the size's fault (exit 78 would have an elastic
    # gang try size after size), the config's.
    from phalanx_trainer import contract

    path = tmp_path / "c.toml"
    path.write_text("[parallelism]\ndp = 2\n")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert main(["--config", str(path)]) == contract.EXIT_PERMANENT_ERROR
    err = capsys.readouterr().err
    assert "parallelism.dp = 2" in err and "dp = -1" in err


def test_a_world_too_small_for_tp_x_pp_names_the_smallest_usable_world_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from phalanx_trainer import contract

    path = tmp_path / "c.toml"
    path.write_text('[model]\nkind = "gpt"\nn_layers = 4\n[parallelism]\ntp = 2\npp = 2\n')
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["--config", str(path)]) == contract.EXIT_WORLD_SIZE_UNUSABLE
    err = capsys.readouterr().err
    assert contract.WORLD_SIZE_TOO_SMALL_MARKER in err and "smallest usable world size is 4" in err
