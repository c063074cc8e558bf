"""The training loop. Read `Trainer.train` top to bottom: data -> forward/backward (gradient sync on
the last micro-step under DDP, on every one under FSDP / ZeRO-2 unless deferred) -> unscale /
overflow check -> global-norm clip -> optimizer -> LR -> metrics -> checkpoint -> preemption check.
`__init__` builds everything in the order TP -> PP -> DP.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from phalanx_trainer import contract, faults, startup
from phalanx_trainer.checkpoint import CheckpointManager, PreemptionWatcher
from phalanx_trainer.checkpoint.memory import StateMemory
from phalanx_trainer.checkpoint.rng import RngState, new_rank_seed
from phalanx_trainer.config import TrainerConfig, batch_plan, deterministic_enabled, with_batch_plan
from phalanx_trainer.dataset import DataStream, build_source
from phalanx_trainer.distenv import DistEnv
from phalanx_trainer.global_batch import resume_batch_warnings, small_micro_batch_warning
from phalanx_trainer.hardware import device_peak_flops
from phalanx_trainer.logs import EventLog
from phalanx_trainer.metrics import MetricsServer, StepReport, TrainerMetrics
from phalanx_trainer.models import model_flops_per_token, parallelize_plan
from phalanx_trainer.models.initialize import build_for_sharding, initialise_after_sharding
from phalanx_trainer.optim import optimizer_class_and_kwargs
from phalanx_trainer.parallel_dims import SHARDED_DP_MODES, ParallelDims, device_for
from phalanx_trainer.parallelize import apply_ddp, apply_fsdp
from phalanx_trainer.pod_memory import STATE_MEMORY_DIR_ENV
from phalanx_trainer.precision import (
    AUTOCAST_DTYPES,
    DynamicLossScaler,
    apply_autocast,
    fsdp_mixed_precision,
    local_tensor,
)
from phalanx_trainer.schedule import build_scheduler
from phalanx_trainer.straggler import StragglerTracker
from phalanx_trainer.timing import PhaseTimer


class ProgressState:
    def __init__(self) -> None:
        self.step = 0
        self.tokens = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.tokens = int(state_dict["tokens"])


def state_memory(config: TrainerConfig, dist_env: DistEnv, dims: ParallelDims) -> StateMemory | None:
    """Where a restart-in-place worker keeps its state between generations: the same answer (None or
    not) on every rank, since the restore's plan is collective; a rank without the folder has none.
    Plain DDP holds the same model and optimizer on every rank, so a peer can send them."""
    if not (dist_env.restart_in_place and config.checkpoint.keep_in_memory):
        return None
    folder = os.environ.get(STATE_MEMORY_DIR_ENV, "")
    replicated = config.parallelism.dp_mode == "ddp" and not dims.tp_enabled and not dims.pp_enabled
    return StateMemory(
        Path(folder) if folder else None,
        dist_env.rank,
        dist_env.generation,
        local_rank=dist_env.local_rank,
        local_ranks=dist_env.nproc_per_node,
        replicated=replicated,
    )


def seed_generators(seed: int) -> None:
    """Python, NumPy and torch (CPU and every CUDA device): the generators RngState saves."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def cross_entropy_fp32(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def global_grad_norm(params: list[nn.Parameter], pp_group: Any) -> float:
    """L2 norm of all gradients of the whole model: across FSDP/TP shards and pipeline stages."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is None:
            continue
        grad = param.grad
        # One norm per layout: under FSDP x TP, TP-split weights live on the 2-D mesh and the rest on
        # the data-parallel mesh, and DTensor cannot stack norms from different meshes.
        key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
        groups.setdefault(key, []).append(grad)
    squared = torch.zeros((), dtype=torch.float32)
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squared += norm.float().cpu() ** 2
    if pp_group is not None:
        dist.all_reduce(squared, group=pp_group)
    return float(squared.sqrt())


class Trainer:
    def __init__(self, config: TrainerConfig, dist_env: DistEnv, log: EventLog | None = None) -> None:
        # With data.global_batch_size, the micro-batch and accumulation steps follow the world size
        # (an elastic resize): from here on the config holds the values trained with.
        self.batch_plan = batch_plan(config, dist_env.world_size)
        small_micro_batch = small_micro_batch_warning(self.batch_plan, config.data.batch_size)
        self.start_warnings = [small_micro_batch] if small_micro_batch else []
        config = with_batch_plan(config, self.batch_plan)
        self.config = config
        self.env = dist_env
        self.log = log or EventLog(dist_env.rank, config.metrics.json_logs)
        job, par = config.job, config.parallelism
        self.dims = ParallelDims.from_config(par, dist_env.world_size)
        self.device = device_for(dist_env.local_rank, job.device)
        if job.torch_threads:
            torch.set_num_threads(job.torch_threads)
        if deterministic_enabled(job, self.device.type):
            torch.use_deterministic_algorithms(True, warn_only=True)
        # A sharded dp_mode shards over a single rank too when a process group exists (one GPU under
        # bench/gpu_check.py): the same FSDP code path and mixed precision as on many.
        shard_alone = par.dp_mode in SHARDED_DP_MODES and dist.is_initialized() and dist_env.world_size == 1
        self.mesh: DeviceMesh | None = (
            self.dims.build_mesh(self.device.type) if self.dims.distributed or shard_alone else None
        )
        self.pp_rank, self.dp_rank, self.tp_rank = self.dims.coordinates(dist_env.rank)
        self.accumulation = par.grad_accumulation_steps

        # On the meta device when the model initialises per tensor (models/initialize.py): each rank
        # allocates only its part after sharding, with the one-process values, whatever the layout.
        # Otherwise every rank builds the whole model under the same seed and keeps its part.
        model, on_meta = build_for_sharding(config.model, self.device, job.seed)
        self.flops_per_token = model_flops_per_token(model)
        autocast_dtype = AUTOCAST_DTYPES[config.precision.dtype]
        apply_autocast(model, self.device.type, autocast_dtype)  # any model, not only ours
        plan = parallelize_plan(model)  # the model's own split / TP / FSDP / compile plan
        if self.dims.pp_enabled:
            plan.split_for_stage(self.pp_rank, self.dims.pp)
        self.loss_parallel = self.dims.tp_enabled  # logits stay vocabulary-split, pipelined or not
        if self.dims.tp_enabled:
            assert self.mesh is not None
            plan.apply_tensor_parallel(self.mesh["tp"], loss_parallel=self.loss_parallel)
        if config.model.compile:
            plan.apply_compile()
        self.model = model  # unwrapped: parameter names match a one-process model
        self.train_module: nn.Module = model
        dp_mesh = self.mesh["dp"] if self.mesh is not None and (self.dims.dp_enabled or shard_alone) else None
        self.dp_group = dp_mesh.get_group() if dp_mesh is not None and self.dims.dp_enabled else None
        if dp_mesh is not None and par.dp_mode in SHARDED_DP_MODES:
            apply_fsdp(
                model,
                plan.fsdp_units(),
                dp_mesh,
                reshard_after_forward=par.dp_mode == "fsdp",
                mp_policy=fsdp_mixed_precision(autocast_dtype),
            )
        if on_meta:
            initialise_after_sharding(model, self.device, job.seed)
        if dp_mesh is not None and par.dp_mode not in SHARDED_DP_MODES:
            self.train_module = apply_ddp(model, dp_mesh, par.ddp_bucket_mb, self.device)
        self.pp_group: Any = (
            self.mesh["pp"].get_group() if self.mesh is not None and self.dims.pp_enabled else None
        )
        # Different streams per rank for anything random from here on (none of the shipped models
        # draws during training, but users' models may). Every generator the checkpoint saves is
        # seeded, so an uninterrupted run and a resumed one end in the same state.
        seed_generators(job.seed + 1 + dist_env.rank)

        self.params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer_class, optimizer_kwargs = optimizer_class_and_kwargs(config.optimizer, self.device)
        self.optimizer: torch.optim.Optimizer
        if par.dp_mode == "zero1" and self.dp_group is not None:
            self.optimizer = ZeroRedundancyOptimizer(
                self.params, optimizer_class=optimizer_class, process_group=self.dp_group, **optimizer_kwargs
            )
        else:
            self.optimizer = optimizer_class(self.params, **optimizer_kwargs)
        self.scheduler = build_scheduler(self.optimizer, config.schedule, job.steps)
        self.scaler = DynamicLossScaler(config.precision)

        self.stage: PipelineStage | None = None
        self.schedule: ScheduleGPipe | Schedule1F1B | None = None
        self._pipeline_losses: list[torch.Tensor] = []
        if self.dims.pp_enabled:
            self.stage = PipelineStage(
                self.train_module, self.pp_rank, self.dims.pp, self.device, group=self.pp_group
            )
            schedule_class = ScheduleGPipe if par.pp_schedule == "gpipe" else Schedule1F1B
            # scale_grads=False: the schedule's own scaling divides every .grad at the end of each
            # step(), gradients kept from earlier accumulation micro-steps included; the loss is
            # divided instead (see _pipeline_loss).
            self.schedule = schedule_class(
                self.stage, par.pp_microbatches, loss_fn=self._pipeline_loss, scale_grads=False
            )

        self.data = DataStream(
            build_source(config.data, config.model, job.seed),
            config.data,
            self.dp_rank,
            self.dims.dp,
            self.device,
        )
        self.progress = ProgressState()
        self.rng = RngState()
        self.tokens_per_step = (
            config.data.batch_size * config.model.seq_len * self.dims.dp * self.accumulation
        )
        self.samples_per_step = config.data.batch_size * self.dims.dp * self.accumulation
        device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        self.peak_flops = device_peak_flops(config.metrics.peak_flops, device_name)
        self.metrics = TrainerMetrics(
            self.flops_per_token, self.peak_flops, dist_env.world_size, attempt=dist_env.attempt
        )
        self.timer = PhaseTimer(self.device)
        # Each rank's own work before it waits for anyone: compared across ranks (straggler.py).
        self.forward_timer = PhaseTimer(self.device)
        self.slow_delay = faults.slow_rank_delay(dist_env.rank)
        self.stragglers = (
            StragglerTracker(config.metrics.straggler_factor, config.metrics.straggler_steps)
            if dist_env.world_size > 1 and not self.dims.pp_enabled
            else None
        )
        self.server: MetricsServer | None = None
        # DDP and ZeRO-1 replicas hold the same model: only the first data-parallel rank stages it.
        replicated = par.dp_mode in ("ddp", "zero1")
        self.checkpoints = CheckpointManager(
            config.checkpoint,
            replica_rank=self.dp_rank if replicated else 0,
            # What a resize resumes from: the manifest already records the world size.
            written_with={"batch": self.batch_plan.as_json()},
            memory=state_memory(config, dist_env, self.dims),
        )
        self.watcher = PreemptionWatcher()

    # ---- one step ---------------------------------------------------------------------------

    def _syncs_on(self, micro: int) -> bool:
        """Whether accumulation micro-step `micro` reduces gradients: DDP only on the last; FSDP and
        ZeRO-2 on every one unless fsdp_defer_reduce (deferring keeps every unsharded gradient)."""
        sharded = isinstance(self.train_module, FSDPModule)
        if sharded and not self.config.parallelism.fsdp_defer_reduce:
            return True
        return micro == self.accumulation - 1

    @contextlib.contextmanager
    def _gradient_sync(self, enabled: bool) -> Iterator[None]:
        """Micro-steps that do not sync skip the gradient all-reduce / reduce-scatter."""
        module = self.train_module
        if isinstance(module, DistributedDataParallel) and not enabled:
            with module.no_sync():
                yield
            return
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(enabled)
        yield

    def _loss_parallel(self) -> contextlib.AbstractContextManager[None]:
        """Cross-entropy over vocabulary-split logits (forward and backward) under tensor parallelism."""
        return loss_parallel() if self.loss_parallel else contextlib.nullcontext()

    def _pipeline_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One pipeline micro-batch's share of the step's mean loss."""
        loss = cross_entropy_fp32(output, targets)
        self._pipeline_losses.append(local_tensor(loss.detach()))
        shares = self.accumulation * self.config.parallelism.pp_microbatches
        return self.scaler.scale_loss(loss / shares)

    def forward_backward(self) -> torch.Tensor:
        """Runs the accumulation micro-steps; returns this rank's mean loss (NaN on non-last stages)."""
        total = torch.zeros((), device=self.device)
        for micro in range(self.accumulation):
            inputs, targets = self.data.next_batch()
            sync = self._syncs_on(micro)
            if self.schedule is not None:
                self._pipeline_step(inputs, targets, sync)
                continue
            with self._gradient_sync(sync), self._loss_parallel():
                self.forward_timer.mark()
                faults.sleep(self.slow_delay)
                loss = cross_entropy_fp32(self.train_module(inputs), targets)
                self.forward_timer.mark()
                self.scaler.scale_loss(loss / self.accumulation).backward()  # type: ignore[no-untyped-call]
            total += local_tensor(loss.detach())
        if self.schedule is not None:
            return self._pipeline_mean_loss()
        return total / self.accumulation

    def _pipeline_mean_loss(self) -> torch.Tensor:
        """The mean of this step's micro-batch losses on the last stage; NaN on the others."""
        if not self._pipeline_losses:
            return torch.full((), math.nan)
        # The first schedule step also calls the loss once while it infers shapes: keep only the
        # losses of the real micro-batches, the last ones recorded.
        real = self.accumulation * self.config.parallelism.pp_microbatches
        mean = torch.stack(self._pipeline_losses[-real:]).mean()
        self._pipeline_losses.clear()
        return mean

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor, sync: bool) -> None:
        """One schedule step over pp_microbatches; the schedule drives FSDP's gradient sync itself,
        so the accumulation switch goes to it as finalize_gradients."""
        assert self.schedule is not None and self.stage is not None
        with self._loss_parallel():  # the schedule runs the loss and its backward inside step()
            self._schedule_step(inputs, targets, sync)

    def _schedule_step(self, inputs: torch.Tensor, targets: torch.Tensor, sync: bool) -> None:
        assert self.schedule is not None and self.stage is not None
        if self.stage.is_first:
            self.schedule.step(
                inputs, target=targets if self.stage.is_last else None, finalize_gradients=sync
            )
        elif self.stage.is_last:
            self.schedule.step(target=targets, losses=[], finalize_gradients=sync)
        else:
            self.schedule.step(finalize_gradients=sync)

    def optimizer_step(self) -> tuple[float, bool]:
        """Unscale, check overflow, clip, step, schedule; returns (grad norm before clipping, skipped)."""
        overflow = self.scaler.unscale_and_check(self.params)
        grad_norm = math.inf
        if not overflow:
            grad_norm = global_grad_norm(self.params, self.pp_group)
            clip = self.config.optimizer.grad_clip
            if clip > 0 and grad_norm > clip:
                grads = [local_tensor(p.grad) for p in self.params if p.grad is not None]
                torch._foreach_mul_(grads, clip / (grad_norm + 1e-6))
            self.optimizer.step()
        self.scaler.update(overflow)
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            # The schedule counts steps, skipped fp16 ones included; torch warns when the optimizer
            # did not step before the scheduler, which is intended here.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
            self.scheduler.step()
        return grad_norm, overflow

    def track_stragglers(self, report: StepReport) -> None:
        """Every rank's data wait + forward of this step to rank 0, which keeps the straggler record
        (/progress `stragglers`). Collective on all ranks; called at the same logged steps on each."""
        if self.stragglers is None:
            return
        mine = torch.tensor([report.data_wait_seconds + report.forward_seconds], dtype=torch.float64)
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(self.env.world_size)]
        dist.all_gather(gathered, mine)  # CPU tensors: gloo, also beside NCCL
        if self.env.rank != 0:
            return
        found = self.stragglers.update([float(t.item()) for t in gathered])
        known = {s["rank"] for s in self.metrics.stragglers}
        for straggler in found:
            if straggler.rank not in known:
                self.log("straggler", step=report.step, **straggler.as_json())
        self.metrics.stragglers = [s.as_json() for s in found]

    def reduce_loss(self, local_loss: torch.Tensor) -> float:
        """Mean over data-parallel ranks, taken from the last pipeline stage. Collective on all ranks."""
        value = local_loss.detach().float().cpu().reshape(1)
        if self.pp_group is not None:
            value = value if self.stage is not None and self.stage.is_last else torch.zeros(1)
            dist.all_reduce(value, group=self.pp_group)
        if self.dp_group is not None:
            dist.all_reduce(value, group=self.dp_group)
            value /= self.dims.dp
        return float(value.item())

    def train_step(self) -> tuple[torch.Tensor, StepReport]:
        self.data.take_wait_seconds()
        self.timer.mark()
        local_loss = self.forward_backward()
        self.timer.mark()
        learning_rate = float(self.scheduler.get_last_lr()[0])
        grad_norm, skipped = self.optimizer_step()
        self.timer.mark()
        # Device time on CUDA; the data wait is the host's, spent inside forward_backward.
        forward_backward_seconds, optimizer_seconds = self.timer.seconds()
        data_wait = self.data.take_wait_seconds()
        forward_seconds = sum(self.forward_timer.seconds()[::2])  # each micro-batch's forward pass
        self.progress.step += 1
        self.progress.tokens += self.tokens_per_step
        report = StepReport(
            step=self.progress.step,
            total_steps=self.config.job.steps,
            loss=math.nan,
            learning_rate=learning_rate,
            grad_norm=grad_norm,
            loss_scale=self.scaler.scale,
            skipped=skipped,
            data_wait_seconds=data_wait,
            forward_backward_seconds=max(0.0, forward_backward_seconds - data_wait),
            optimizer_seconds=optimizer_seconds,
            forward_seconds=forward_seconds,
            tokens=self.tokens_per_step,
            samples=self.samples_per_step,
        )
        return local_loss, report

    # ---- the loop ---------------------------------------------------------------------------

    def app_state(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "data": self.data,
            "rng": self.rng,
            "progress": self.progress,
        }

    def start_metrics_server(self, port: int) -> None:
        """Serves /metrics (and /progress on rank 0); a port already taken costs the metrics, not the run."""
        if port <= 0:
            return
        try:
            self.server = MetricsServer(self.metrics, port, serve_progress=self.env.rank == 0)
        except OSError as err:
            print(
                f"phalanx-trainer: warning: rank {self.env.rank}: cannot serve metrics on port {port} ({err});"
                " training goes on without them",
                file=sys.stderr,
                flush=True,
            )

    def _memory(self) -> tuple[int, int]:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device), torch.cuda.max_memory_allocated(self.device)
        return 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def _last_checkpoint(self) -> tuple[int, str] | None:
        last = self.checkpoints.last
        return (last.step, last.time) if last is not None else None

    def _resumed_at(self, restored: int) -> None:
        """After a restore: the step, the `resumed` line, a new rank's own random stream, and the
        warnings about a global batch that differs from the checkpoint writer's."""
        self.progress.step = restored
        written = self.checkpoints.restored_from or {}
        written_batch = written.get("batch", {}).get("global_batch_size")
        self.log(
            "resumed",
            step=restored,
            source=self.checkpoints.restore_source,
            unix_time=round(time.time(), 3),
            from_world_size=written.get("world_size"),
            from_global_batch_size=written_batch,
        )
        if self.checkpoints.rank >= int(written.get("world_size", self.checkpoints.world_size)):
            # This rank took rank 0's per-rank state; its generators must not repeat rank 0's.
            seed_generators(new_rank_seed(self.config.job.seed, self.env.rank, restored))
        for warning in resume_batch_warnings(
            written_global_batch=written_batch,
            global_batch=self.batch_plan.global_batch_size,
            consumed_samples=self.data.restored_position,
        ):
            self.log("warning", step=restored, **warning)

    def train(self) -> int:
        """Runs to job.steps; returns the process exit code (0, or 75 after a preemption checkpoint)."""
        config = self.config
        app_state = self.app_state()
        restored = self.checkpoints.restore(app_state)
        if restored is not None:
            self._resumed_at(restored)
        startup.mark(startup.RESTORED)  # from a checkpoint, or ready to start from step 0
        self.metrics.resumed_from_step = restored or 0
        self.metrics.note_startup(startup.marks())  # start-up is still going: no step yet
        self.watcher.install()
        self.log(
            "start",
            world_size=self.env.world_size,
            dp=self.dims.dp,
            tp=self.dims.tp,
            pp=self.dims.pp,
            dp_mode=config.parallelism.dp_mode,
            precision=config.precision.dtype,
            parameters=sum(p.numel() for p in self.model.parameters()),
            flops_per_token=self.flops_per_token,
            peak_flops=self.peak_flops,
            pp_microbatches=config.parallelism.pp_microbatches if self.dims.pp_enabled else 1,
            **self.batch_plan.as_json(),
        )
        for warning in self.start_warnings:
            self.log("warning", **warning)
        profiler = Profiler(
            config.metrics.profile_start_step, config.metrics.profile_steps, config.metrics.profile_dir
        )
        while self.progress.step < config.job.steps:
            profiler.before_step(self.progress.step + 1)
            self.metrics.step_started(time.perf_counter())  # rates: wall time between step starts
            local_loss, report = self.train_step()
            profiler.after_step(report.step)
            self.metrics.record_step(report)
            step = report.step
            if startup.FIRST_STEP not in startup.marks():
                startup.mark(startup.FIRST_STEP)
                self.metrics.note_startup(startup.marks())  # the operator times the recovery by it
                # In the log too, with the generation: restart in place times accepted -> first step.
                self.log(
                    "first_step", step=step, unix_time=round(time.time(), 3), generation=self.env.generation
                )
            if step % config.metrics.log_every == 0 or step == config.job.steps:
                report.loss = self.reduce_loss(local_loss)
                self.track_stragglers(report)
                report.memory_allocated_bytes, report.memory_peak_bytes = self._memory()
                progress = self.metrics.publish(report, self._last_checkpoint())
                self.log(
                    "progress",
                    step=step,
                    total_steps=report.total_steps,
                    loss=round(report.loss, 5),
                    lr=report.learning_rate,
                    grad_norm=round(report.grad_norm, 5),
                    loss_scale=report.loss_scale,
                    tokens_per_second=round(progress["tokens_per_second"], 1),
                    eta_seconds=round(progress["eta_seconds"], 1),
                    data_wait_s=round(report.data_wait_seconds, 5),
                    forward_backward_s=round(report.forward_backward_seconds, 5),
                    optimizer_s=round(report.optimizer_seconds, 5),
                )
            if step < config.job.steps and self.checkpoints.should_save(step):
                saving = time.perf_counter()
                self.checkpoints.save(step, app_state)
                self.metrics.checkpoint_stall_seconds += time.perf_counter() - saving
            if self.watcher.agreed_stop():
                self.log("preempted", step=step)
                self.checkpoints.save(step, app_state, emergency=True)
                self.checkpoints.wait()
                self.checkpoints.close()
                return contract.EXIT_CHECKPOINTED_ON_PREEMPTION
        self.checkpoints.save(self.progress.step, app_state)
        self.checkpoints.wait()
        self.checkpoints.close()
        self.log("finished", step=self.progress.step)
        return contract.EXIT_SUCCESS

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


class Profiler:
    """An optional torch.profiler window over steps [start, start + steps), saved as a Chrome trace."""

    def __init__(self, start: int, steps: int, directory: str) -> None:
        self.start, self.steps, self.directory = start, steps, directory
        self._active: torch.profiler.profile | None = None

    def before_step(self, step: int) -> None:
        if self.start > 0 and self.steps > 0 and step == self.start:
            self._active = torch.profiler.profile(record_shapes=False)
            self._active.__enter__()  # type: ignore[no-untyped-call]

    def after_step(self, step: int) -> None:
        if self._active is not None and step >= self.start + self.steps - 1:
            self._active.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            import os

            os.makedirs(self.directory, exist_ok=True)
            rank = dist.get_rank() if dist.is_initialized() else 0
            self._active.export_chrome_trace(
                os.path.join(self.directory, f"trace-rank{rank}-step{self.start}.json")
            )
            self._active = None
