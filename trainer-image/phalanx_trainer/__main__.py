"""Entry point: `python -m phalanx_trainer --config FILE [section.key=value ...]`.

One process per rank under torchrun (RANK set); the resident launcher (resident.py) when
PHALANX_RESTART_IN_PLACE=true and no RANK is set; the local launcher when NPROC_PER_NODE > 1 and no
RANK is set; or a single process of world size 1 with no environment at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from phalanx_trainer import contract, startup
from phalanx_trainer.config import ConfigError, TrainerConfig, WorldSizeError, WorldTooSmallError, load_config
from phalanx_trainer.distenv import (
    DistEnv,
    EnvError,
    RendezvousTimeout,
    needs_local_launch,
    needs_resident_launch,
    process_group_backend,
    read_dist_env,
    wait_for_rendezvous,
)
from phalanx_trainer.stacks import dump_stacks_on_signal


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="phalanx-trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="TOML or YAML file with the config sections")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="override one config value")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )
    return parser.parse_args(list(argv))


def apply_env_defaults(config: TrainerConfig, env: Mapping[str, str]) -> TrainerConfig:
    """The operator's checkpoint settings fill in what the config file left at its defaults."""
    checkpoint = config.checkpoint
    changes: dict[str, object] = {}
    if not checkpoint.dir and env.get(contract.ENV_CHECKPOINT_DIR):
        changes["dir"] = env[contract.ENV_CHECKPOINT_DIR]
    if checkpoint.interval_steps == 0 and env.get(contract.ENV_CHECKPOINT_INTERVAL, "").isdigit():
        changes["interval_steps"] = int(env[contract.ENV_CHECKPOINT_INTERVAL])
    default_keep = type(checkpoint)().keep
    if checkpoint.keep == default_keep and env.get(contract.ENV_CHECKPOINT_KEEP, "").isdigit():
        changes["keep"] = int(env[contract.ENV_CHECKPOINT_KEEP])
    grace = env.get(contract.ENV_GRACE_PERIOD, "")
    if grace.isdigit() and int(grace) > 0:
        # Leave a few seconds of the grace period for the process to exit after the save.
        changes["emergency_budget_seconds"] = min(
            checkpoint.emergency_budget_seconds, max(1.0, int(grace) - 5.0)
        )
    return dataclasses.replace(config, checkpoint=dataclasses.replace(checkpoint, **changes))  # type: ignore[arg-type]


def metrics_port(configured: int, env: Mapping[str, str], local_rank: int) -> int:
    """0 means no server; -1 takes $PHALANX_METRICS_PORT (default 9400); local rank r adds r."""
    base = configured
    if configured < 0:
        raw = env.get(contract.ENV_METRICS_PORT, "")
        base = int(raw) if raw.isdigit() else contract.DEFAULT_METRICS_PORT
    return base + local_rank if base > 0 else 0


def fail(message: str) -> int:
    print(f"phalanx-trainer: error: {message}", file=sys.stderr, flush=True)
    return contract.EXIT_PERMANENT_ERROR


def run_worker(config: TrainerConfig, dist_env: DistEnv, env: Mapping[str, str]) -> int:
    if dist_env.distributed:
        try:
            wait_for_rendezvous(dist_env, log=lambda line: print(f"phalanx-trainer: {line}", file=sys.stderr))
        except RendezvousTimeout as err:
            return fail(str(err))
    try:
        return _run_generation(config, dist_env, env)
    except BaseException as err:
        # One classification from the group's start-up through close(): a lost peer or a fenced
        # worker ends this generation (76, the pod is fine); anything else is the code's (1).
        from phalanx_trainer.generation import lost_peer

        if dist_env.restart_in_place and lost_peer(err):
            return generation_failed(err)
        raise
    finally:
        _destroy_group()


def _run_generation(config: TrainerConfig, dist_env: DistEnv, env: Mapping[str, str]) -> int:
    import torch
    import torch.distributed as dist

    from phalanx_trainer.heap import freeze_imported
    from phalanx_trainer.train import Trainer

    freeze_imported()  # before the restore: its collections would walk every imported object
    if dist_env.distributed:
        use_cuda = config.job.device == "cuda" or (config.job.device == "auto" and torch.cuda.is_available())
        if use_cuda:
            torch.cuda.set_device(dist_env.local_rank)
        os.environ.setdefault(contract.ENV_MASTER_ADDR, dist_env.master_addr)
        os.environ.setdefault(contract.ENV_MASTER_PORT, str(dist_env.master_port))
        if dist_env.restart_in_place:
            from phalanx_trainer.generation import init_generation_group
            from phalanx_trainer.logs import EventLog

            init_generation_group(dist_env, process_group_backend(use_cuda), log=_note)
            # A phase of the recovery timeline: every rank of the generation is in its group.
            EventLog(dist_env.rank, config.metrics.json_logs)(
                "group_ready", generation=dist_env.generation, unix_time=round(time.time(), 3)
            )
        else:
            timeout = dist_env.collective_timeout
            dist.init_process_group(
                backend=process_group_backend(use_cuda),
                init_method="env://",
                rank=dist_env.rank,
                world_size=dist_env.world_size,
                timeout=datetime.timedelta(seconds=timeout) if timeout else None,
            )
    startup.mark(startup.RENDEZVOUS_DONE)
    try:
        trainer = Trainer(config, dist_env)
    except (ImportError, OSError, TypeError, ValueError) as err:
        from phalanx_trainer.generation import lost_peer

        if dist_env.restart_in_place and lost_peer(err):
            raise  # a peer's socket or timeout, not a user's hook or path: run_worker books it
        # Users' module:function hooks and data paths fail here; say which, without a traceback.
        return fail(f"{type(err).__name__}: {err}")
    try:
        trainer.start_metrics_server(metrics_port(config.metrics.port, env, dist_env.local_rank))
        return trainer.train()
    finally:
        trainer.close()
        # Free DDP / FSDP state while the process groups still exist: left to interpreter
        # shutdown, its collection can block on a gloo peer that has already exited.
        del trainer
        gc.collect()


def _note(line: str) -> None:
    print(f"phalanx-trainer: {line}", file=sys.stderr, flush=True)


def generation_failed(err: BaseException) -> int:
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
    _note(f"restart generation failed: {type(err).__name__}: {first_line}")
    return contract.EXIT_GENERATION_FAILED


def _destroy_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except dist.DistError:
            pass  # the group is already broken (a lost peer); the process exits next


def main(argv: Sequence[str] | None = None) -> int:
    startup.mark(startup.STARTED)
    dump_stacks_on_signal()  # first: a launcher replaces it with forwarding, a forked worker renews it
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(args_list)
    env = dict(os.environ)
    try:
        dist_env = read_dist_env(env)
        config = apply_env_defaults(load_config(args.config, args.overrides, dist_env.world_size), env)
    except WorldSizeError as err:
        too_small = isinstance(err, WorldTooSmallError)
        marker = contract.WORLD_SIZE_TOO_SMALL_MARKER if too_small else contract.WORLD_SIZE_UNUSABLE_MARKER
        for problem in err.problems:
            print(f"{marker} (world size {dist_env.world_size}): {problem}", file=sys.stderr)
        return contract.EXIT_WORLD_SIZE_UNUSABLE
    except ConfigError as err:
        for problem in err.problems:
            print(f"phalanx-trainer: config error: {problem}", file=sys.stderr)
        return contract.EXIT_PERMANENT_ERROR
    except EnvError as err:
        return fail(str(err))
    if args.print_config:
        import json

        print(json.dumps(config.to_dict(), indent=2))
        return contract.EXIT_SUCCESS
    if needs_resident_launch(env):
        from phalanx_trainer.resident import run_resident_launcher

        return run_resident_launcher(args_list, env, config.checkpoint.emergency_budget_seconds)
    if needs_local_launch(env):
        from phalanx_trainer.launcher import launch_local_workers

        return launch_local_workers(args_list, env, dist_env.nproc_per_node)
    return run_worker(config, dist_env, env)


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: collecting torch.distributed objects there has been seen to block
    # on a gloo peer that already exited. Everything worth keeping (checkpoints, logs) is done.
    os._exit(exit_code)
