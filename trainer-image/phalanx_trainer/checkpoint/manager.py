"""CheckpointManager: asynchronous DCP saves committed by manifest and rename, verified resume.

Save: stage tensors into reusable CPU buffers (the only part training waits for), then a background
thread writes them with DCP over a dedicated gloo group, hashes what each rank wrote, and rank 0 writes
the manifest, renames the temporary folder into place and applies retention.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor

from phalanx_trainer.checkpoint import metrics
from phalanx_trainer.checkpoint.async_writer import BackgroundWriter
from phalanx_trainer.checkpoint.budget import (
    PROBE_BYTES,
    MeasuredSave,
    emergency_estimate,
    reusable_probe,
    write_speed,
)
from phalanx_trainer.checkpoint.hashing_writer import HashingFileSystemWriter
from phalanx_trainer.checkpoint.manifest import (
    DCP_METADATA_NAME,
    FileEntry,
    Manifest,
    ManifestError,
    describe_file,
    verify_digests,
    verify_folder,
    write_manifest,
)
from phalanx_trainer.checkpoint.memory import StateMemory, local_data, signature_of
from phalanx_trainer.checkpoint.memory_plan import Expected, plan_memory_restore, why_unusable
from phalanx_trainer.checkpoint.records import CheckpointConfig, CheckpointError, CheckpointInfo, Stateful
from phalanx_trainer.checkpoint.safe_load import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    dump_small_state,
    load_small_state,
    read_dcp_metadata,
)
from phalanx_trainer.checkpoint.selection import (
    Rejected,
    Selection,
    assign_verification,
    files_read,
    next_candidate,
    rank_file_name,
    unfinished_newer_than,
)
from phalanx_trainer.checkpoint.state import (
    StagingArea,
    apply_per_rank,
    apply_sharded,
    checkpointed_optimizer,
    collect,
    fill_tensors,
    merge_optimizer_state,
    optimizer_state_without_saved_values,
    overlay_plain_values,
    replicated_prefixes,
    split_tensors,
    tensor_bytes,
)
from phalanx_trainer.checkpoint.store import (
    commit,
    list_checkpoints,
    parse_step_dir,
    probe_dir_name,
    read_probe_record,
    remove_leftovers,
    remove_tree,
    retention_victims,
    step_dir_name,
    temporary_dir_name,
    unseen_files,
    write_probe_record,
)
from phalanx_trainer.contract import ENV_CHECKPOINT_DIR, ENV_NPROC_PER_NODE

log = logging.getLogger("phalanx_trainer.checkpoint")
# In each manifest's `extra`: the id of the save that wrote the folder (a snapshot kept in memory
# names it, so a folder written again since is told apart).
SAVE_ID_KEY = "save_id"
# A peer's state is sent in flat buckets of at most this many bytes (one tensor larger goes alone).
BROADCAST_BUCKET_BYTES = 256 * 1024 * 1024


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class _Pending:
    step: int
    emergency: bool
    staged: dict[str, torch.Tensor]
    small_state: bytes
    started: float
    blocking_seconds: float


@dataclass(frozen=True)
class SaveRecord:
    """What the last committed save cost, for metrics, the emergency estimate and status."""

    step: int
    blocking_seconds: float
    total_seconds: float
    bytes_written: int
    staged_bytes: int


def io_threads_per_rank(env: Mapping[str, str]) -> int:
    """Files each rank writes, each by its own thread, and hashes in parallel at resume: SHA-256 runs
    at 1-2 GB/s per core, below what a local NVMe disk reads, so one file per rank would leave the
    digest as the bound. At most 4, and no more than the cores this rank's share of the node has."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores // ranks_per_node(env)))


def ranks_per_node(env: Mapping[str, str]) -> int:
    try:
        return max(1, int(env.get(ENV_NPROC_PER_NODE, "1")))
    except ValueError:
        return 1


def describe_layout(app_state: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    model = app_state.get("model")
    kind = "single"
    if isinstance(model, nn.Module):
        if any(isinstance(p, DTensor) for p in model.parameters()):
            kind = "dtensor"  # FSDP2 and/or TP
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            kind = "ddp"
    return {"kind": kind, "world_size": world_size}


class CheckpointManager:
    def __init__(
        self,
        config: CheckpointConfig,
        process_group: Any = None,
        *,
        layout: Mapping[str, Any] | None = None,
        writer_nice_increment: int = 10,
        replica_rank: int = 0,
        written_with: Mapping[str, Any] | None = None,
        memory: StateMemory | None = None,
    ) -> None:
        """`replica_rank`: this rank's index among the data-parallel ranks that hold the same model
        state (DDP and ZeRO-1 pass their data-parallel rank; sharded layouts pass 0). Only index 0
        stages and writes that state; the others stage only what is theirs alone.
        `written_with`: JSON facts of the run (the trainer's global batch) kept in each manifest's
        `extra`; a resume reads them back from `restored_from`, with the writer's world size.
        `memory`: restart in place; the same on every rank (None or not). An agreed stop also keeps
        this rank's state in its pod's memory, and a restore uses it where memory_plan.py allows."""
        self.config = config
        self.memory = memory
        # Where the last restore's data came from: "storage", "memory" or "memory+peer".
        self.restore_source: str | None = None
        self._written_with = dict(written_with or {})
        self.restored_from: dict[str, Any] | None = None
        self.replica_rank = replica_rank
        self.io_threads = io_threads_per_rank(os.environ)
        self.process_group = process_group
        self.last: CheckpointInfo | None = None
        self.last_save: SaveRecord | None = None
        # The storage probe's figure for the whole job (bytes/s), once measured.
        self.storage_bytes_per_second: float | None = None
        self.root = Path(config.dir or os.environ.get(ENV_CHECKPOINT_DIR, ""))
        self._enabled = bool(config.dir or os.environ.get(ENV_CHECKPOINT_DIR))
        self._layout = dict(layout) if layout is not None else None
        self._writer = BackgroundWriter(writer_nice_increment)
        self._staging = StagingArea()
        self._rejected: set[int] = set()  # steps whose folders the resume found damaged
        self._distributed = dist.is_available() and dist.is_initialized()
        self._group: Any = None
        if self._distributed and self._enabled:
            ranks = dist.get_process_group_ranks(process_group) if process_group is not None else None
            # Collective over the whole world; every rank constructs the manager.
            self._group = dist.new_group(ranks=ranks, backend="gloo")
        self.rank = dist.get_rank(self._group) if self._group is not None else 0
        self.world_size = dist.get_world_size(self._group) if self._group is not None else 1

    @property
    def enabled(self) -> bool:
        return self._enabled

    # -- collectives on the checkpoint group ---------------------------------------------------------

    def _broadcast(self, value: Any) -> Any:
        if self._group is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, group=self._group, group_src=0)
        return box[0]

    def _all_gather(self, value: Any) -> list[Any]:
        if self._group is None:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self._group)
        return out

    def _max(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        if self._group is not None:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group)
        return [float(v) for v in tensor.tolist()]

    # -- resume -------------------------------------------------------------------------------------

    def restore(self, app_state: dict[str, Stateful]) -> int | None:
        """Load the newest valid checkpoint into app_state; returns its step, or None for a fresh start."""
        try:
            return self._restore(app_state)
        finally:
            if self.memory is not None:
                self.memory.discard()  # used or not, never again: free the pod's memory

    def _restore(self, app_state: dict[str, Stateful]) -> int | None:
        if not self.enabled:
            return None
        self.restore_source = None
        self._raise_if_failed(self._writer.wait())
        if self.config.write_bytes_per_second <= 0 and self.storage_bytes_per_second is None:
            self.storage_bytes_per_second = self._storage_speed()
        if not self.config.resume:
            return None
        optimizer = checkpointed_optimizer(app_state)
        optimizer_was_fresh = optimizer is not None and not optimizer.state
        live, _ = collect(app_state)
        live_skeleton, live_tensors = split_tensors(live)
        unfinished = unfinished_newer_than(self.root, -1) if self.rank == 0 else []
        if self.rank == 0:
            for removed in remove_leftovers(self.root):
                log.info("removed unfinished checkpoint folder %s", removed.name)
        rejected: list[Rejected] = []
        chosen: tuple[Path, Manifest, dict[str, Any]] | None = None
        below: int | None = None
        overwritten_by: str | None = None  # a rejected folder whose data the live tensors now hold
        while chosen is None:
            # Rank 0 checks structure and sizes; the digests are split over the ranks that read.
            proposal: tuple[Path, Manifest] | None = None
            if self.rank == 0:
                proposal, skipped = next_candidate(self.root, below)
                rejected += skipped
            proposal = self._broadcast(proposal)
            if proposal is None:
                break
            folder, manifest = proposal
            if self.memory is not None and below is None:
                kept = self._restore_from_memory(folder, manifest, app_state, live_tensors)
                if kept is not None:
                    chosen = (folder, manifest, kept)
                    break
            small, problem = self._load_and_verify(folder, manifest, live_skeleton, live_tensors)
            if problem is None and small is not None:
                chosen = (folder, manifest, small)
            else:
                rejected.append(Rejected(folder.name, manifest.step, problem or "unverified"))
                below = manifest.step
                overwritten_by = folder.name
        if self.rank == 0:
            floor = chosen[1].step if chosen else -1
            rejected += [item for item in unfinished if item.step > floor]
            rejected.sort(key=lambda item: item.step, reverse=True)
            self._report_selection(
                Selection(chosen[0] if chosen else None, chosen[1] if chosen else None, tuple(rejected))
            )
        if chosen is None and overwritten_by is not None:
            raise CheckpointError(
                f"no checkpoint under {self.root} verifies, and {overwritten_by} was rejected after its "
                "data was loaded: the live weights are no longer the initial ones, so this run cannot "
                f"start fresh. Move the damaged step-* folders away to start fresh (reasons logged above)"
            )
        if chosen is None:
            if optimizer_was_fresh and optimizer is not None:
                # collect() -> torch's get_state_dict created the optimizer's state with one zero-gradient
                # step at lr 0; kept, it would count (AdamW's bias correction would start at step 2).
                optimizer.state.clear()
            return None
        folder, manifest, small = chosen
        self._apply(folder, manifest, app_state, small, live_skeleton, live_tensors)
        self.restore_source = self.restore_source or "storage"
        self.restored_from = {**manifest.extra, "world_size": manifest.world_size}
        self.last = CheckpointInfo(
            step=manifest.step,
            time=manifest.created,
            path=str(folder),
            save_id=str(manifest.extra.get(SAVE_ID_KEY, "")),
        )
        metrics.LAST_STEP.set(manifest.step)
        metrics.LAST_TIME.set(_parse_time(manifest.created))
        return manifest.step

    def _restore_from_memory(
        self,
        folder: Path,
        manifest: Manifest,
        app_state: Mapping[str, Any],
        live_tensors: dict[str, torch.Tensor],
    ) -> dict[str, Any] | None:
        """Collective. Fills `live_tensors` with the state the ranks kept in memory at the stop that
        wrote `folder` (a rank without it receives it from rank 0 where memory_plan.py allows), and
        returns this rank's per-rank state; None on every rank when the gang must read storage.
        Every rank reaches every collective: whatever fails on one rank becomes its reason."""
        assert self.memory is not None
        header = None
        reason: str | None
        try:
            header = self.memory.claim()
            expected = Expected(
                step=manifest.step,
                checkpoint=folder.name,
                save_id=str(manifest.extra.get(SAVE_ID_KEY, "")),
                root=str(self.root),
                generation=self.memory.generation,
                rank=self.rank,
                world_size=self.world_size,
                signature=signature_of(live_tensors),
            )
            reason = why_unusable(header, expected)
            if reason is None and manifest.world_size != self.world_size:
                reason = f"the checkpoint was written by {manifest.world_size} ranks"
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"
        reasons = self._all_gather(reason)
        # memory.replicated comes from the config (plain DDP), so every rank holds the same answer.
        plan = plan_memory_restore([found is None for found in reasons], self.memory.replicated)
        if plan is None:
            self.memory.discard()  # before the storage load: its memory may be needed there
            if self.rank == 0 and any(found is None for found in reasons):
                unusable = {rank: found for rank, found in enumerate(reasons) if found}
                log.info("state in memory not used (not every rank can resume from it): %s", unusable)
            return None
        problem: str | None = None
        small: dict[str, Any] | None = None
        try:
            if self.rank in plan.receivers:
                own_file = rank_file_name(self.rank)
                verify_digests(folder, manifest, {own_file})
                small = load_small_state((folder / own_file).read_bytes())
            else:
                assert header is not None
                kept, small_bytes = self.memory.read(header)
                if kept.keys() != live_tensors.keys():
                    raise ValueError("the snapshot's tensors are not this rank's")
                with torch.no_grad():
                    for key, live in live_tensors.items():
                        local_data(live).copy_(kept[key])
                del kept
                small = load_small_state(small_bytes)
        except Exception as error:  # damage, a read error, an unsafe per-rank file, memory
            problem = f"rank {self.rank}: {type(error).__name__}: {error}"
        problems = [found for found in self._all_gather(problem) if found]
        if problems:
            self.memory.discard()
            if self.rank == 0:
                log.warning("state in memory not used, reading storage instead: %s", problems[0])
            return None
        if plan.source is not None:
            self._broadcast_tensors(live_tensors, plan.source)
        if self.rank == 0:
            log.info(
                "resuming %s from memory%s",
                folder.name,
                f"; ranks {list(plan.receivers)} received it from rank {plan.source}"
                if plan.receivers
                else "",
            )
        self.restore_source = plan.describe
        return small

    def _broadcast_tensors(self, tensors: dict[str, torch.Tensor], source: int) -> None:
        """Every tensor from `source` (a rank of the manager's group) to the others, on the training
        group (NCCL for GPU tensors; the manager's own is gloo): per device and dtype, in buckets of
        at most BROADCAST_BUCKET_BYTES, so the copy beside the state stays small on a full GPU."""
        src = dist.get_global_rank(self._group, source)
        buckets: dict[tuple[str, str], list[list[torch.Tensor]]] = {}
        filled: dict[tuple[str, str], int] = {}  # bytes in each kind's last bucket
        for key in sorted(tensors):
            local = local_data(tensors[key])
            kind = (str(local.device), str(local.dtype))
            chunks = buckets.setdefault(kind, [[]])
            size = local.numel() * local.element_size()
            if chunks[-1] and filled[kind] + size > BROADCAST_BUCKET_BYTES:
                chunks.append([])
                filled[kind] = 0
            chunks[-1].append(local)
            filled[kind] = filled.get(kind, 0) + size
        with torch.no_grad():
            for _, chunks in sorted(buckets.items()):
                for bucket in chunks:
                    flat = _flatten_dense_tensors([t.detach() for t in bucket])  # type: ignore[no-untyped-call]
                    dist.broadcast(flat, src=src, group=self.process_group)
                    for target, value in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):  # type: ignore[no-untyped-call]
                        target.copy_(value)
                    del flat

    def _keep_in_memory(
        self,
        step: int,
        app_state: dict[str, Stateful],
        written: tuple[bytes, dict[str, torch.Tensor]] | None,
        *,
        seconds_left: float,
    ) -> None:
        """After an agreed stop's checkpoint: this rank's state into its pod's memory, for the next
        generation (`written`: what that save collected, else collected here). Never fails the stop:
        the durable checkpoint is already committed."""
        if self.memory is None or self.memory.folder is None or self.last is None or self.last.step != step:
            return
        if not self.last.save_id:
            return  # nothing ties a snapshot to that checkpoint
        try:
            small, tensors = written if written is not None else _collect(app_state)
            header = self.memory.write(
                step=step,
                checkpoint=Path(self.last.path).name,
                save_id=self.last.save_id,
                root=str(self.root),
                world_size=self.world_size,
                small_state=small,
                tensors=tensors,
                seconds_left=seconds_left,
            )
        except Exception as error:
            log.warning("state not kept in memory: %s: %s", type(error).__name__, error)
            return
        if header is not None:
            log.info("state of step %d kept in memory: %d bytes on rank %d", step, header.size, self.rank)

    def _load_and_verify(
        self, folder: Path, manifest: Manifest, live_skeleton: Any, tensors: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any] | None, str | None]:
        """DCP-load `tensors` from `folder` while this rank hashes its share of the files the ranks
        read, then parse this rank's per-rank file (and, for optimizer state it lacks, the others).

        Collective. The digests are checked beside the load, not before it, so that a restore costs
        about one pass over the data instead of two. Returns (this rank's per-rank state, None) when
        every rank found its share intact, else (None, the first problem, the same on every rank).
        Raises CheckpointError on every rank when a rank holds optimizer state no file saved.
        """
        own_file = rank_file_name(self.rank if self.rank < manifest.world_size else 0)
        reads: set[str] | None = None
        planning_error: str | None = None
        try:
            metadata = read_dcp_metadata(folder / DCP_METADATA_NAME)
            reads = files_read(folder, metadata, tensors, own_file)
        except Exception as error:  # the checkpoint lacks a tensor this rank holds, or similar
            planning_error = f"rank {self.rank}: {type(error).__name__}: {error}"
        everyone = self._all_gather((reads, planning_error))
        errors = [error for _, error in everyone if error]
        if errors:
            # Not damage: this layout cannot load that checkpoint (the old code crashed in DCP too).
            raise CheckpointError(f"checkpoint {folder.name} does not fit this run: {errors[0]}")
        sizes = {entry.path: entry.size for entry in manifest.files}
        mine = assign_verification([names or set() for names, _ in everyone], sizes)[self.rank]
        problem: str | None = None
        load_problem: str | None = None
        with ThreadPoolExecutor(1, "checkpoint-verify") as pool:
            hashed = pool.submit(verify_digests, folder, manifest, mine, workers=self.io_threads)
            try:
                # Every tensor this rank holds must be in the checkpoint (planned above); what this
                # rank does not hold (another pipeline stage's layers) is not read.
                dcp_load(
                    tensors,
                    storage_reader=SafeFileSystemReader(folder),
                    planner=SafeLoadPlanner(),
                    process_group=self._group,
                    no_dist=self._group is None,
                )
            except (Exception, CheckpointException) as error:  # on every rank when one rank's read fails
                first_line = str(error).strip().splitlines()[-1] if str(error).strip() else ""
                load_problem = f"DCP load failed: {type(error).__name__}: {first_line[:300]}"
            try:
                hashed.result()
            # ManifestError (the digest names the damage best) or a read error (EIO, ESTALE): the
            # folder's problem, so every rank rejects it together rather than one leaving the collective.
            except (OSError, ValueError) as error:
                problem = f"{error} (found by rank {self.rank})"
        small: dict[str, Any] | None = None
        unfit: str | None = None
        if problem is None and load_problem is None:
            reading = own_file
            try:
                small = load_small_state((folder / own_file).read_bytes())
                others = (
                    rank_file_name(rank)
                    for rank in range(manifest.world_size)
                    if rank_file_name(rank) != own_file
                )
                missing = optimizer_state_without_saved_values(live_skeleton, small.get("sharded", {}))
                for reading in others:
                    if not missing:
                        break
                    # Not in this rank's verification share: hashed here, before it is trusted.
                    verify_digests(folder, manifest, {reading})
                    other = load_small_state((folder / reading).read_bytes())
                    small["sharded"] = merge_optimizer_state(
                        small.get("sharded", {}), [other.get("sharded", {})]
                    )
                    missing = optimizer_state_without_saved_values(live_skeleton, small["sharded"])
            except (OSError, ValueError) as error:  # read errors, UnsafeCheckpointError, damaged archives
                problem = f"{reading}: {error} (found by rank {self.rank})"
            else:
                if missing:
                    unfit = (
                        f"rank {self.rank} holds optimizer state that none of the {manifest.world_size} "
                        f"per-rank files saved: {', '.join(missing[:3])}"
                        f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}"
                    )
        everyone_found = self._all_gather((problem or load_problem, unfit))
        problems = [found for found, _ in everyone_found if found]
        if problems:
            return None, problems[0]
        unfits = [found for _, found in everyone_found if found]
        if unfits:
            raise CheckpointError(
                f"checkpoint {folder.name} does not fit this run: {unfits[0]}. Resume with the optimizer "
                "the checkpoint was written with (optimizer.name), or move the step-* folders away to "
                "start fresh"
            )
        return small, None

    def _storage_speed(self) -> float | None:
        """The figure of an earlier start of this job when rank 0 finds a fresh one, else a probe."""
        reused: float | None = None
        if self.rank == 0:
            reused = reusable_probe(read_probe_record(self.root), world_size=self.world_size,
                                    per_node=ranks_per_node(os.environ), now=time.time())  # fmt: skip
        reused = self._broadcast(reused)
        if reused is not None:
            if self.rank == 0:
                log.info("checkpoint storage takes %.0f MB/s from the job (an earlier probe)", reused / 1e6)
            return float(reused)
        speed = self._probe_storage()
        if self.rank == 0 and speed is not None:
            try:
                write_probe_record(self.root, speed, self.world_size, ranks_per_node(os.environ), time.time())
            except OSError as error:  # the next start probes again; nothing else depends on it
                log.warning("cannot record the storage probe under %s: %s", self.root, error)
        return speed

    def _probe_storage(self) -> float | None:
        """Every rank writes and fsyncs PROBE_BYTES at once: the job's bytes/s, or None if it failed."""
        token = self._broadcast(uuid.uuid4().hex if self.rank == 0 else None)
        folder = self.root / probe_dir_name(token)
        seconds: float | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            data = os.urandom(PROBE_BYTES)  # not zeros: some filesystems compress them away
            began = time.monotonic()
            with open(folder / f"rank-{self.rank:05d}", "wb", buffering=0) as handle:
                handle.write(data)
                os.fsync(handle.fileno())
            seconds = time.monotonic() - began
        except OSError as error:
            log.warning("storage probe under %s failed on rank %d: %s", self.root, self.rank, error)
        everyone = self._all_gather(seconds)
        if self.rank == 0:
            remove_tree(folder)
        if any(value is None for value in everyone):
            return None
        slowest = max(max(float(value) for value in everyone), 1e-6)
        speed = PROBE_BYTES * self.world_size / slowest
        if self.rank == 0:
            log.info(
                "checkpoint storage takes %.0f MB/s from the job (probe, %d ranks)",
                speed / 1e6,
                self.world_size,
            )
        return speed

    def _report_selection(self, selection: Selection) -> None:
        for item in selection.rejected:
            log.warning("checkpoint %s skipped at resume: %s", item.name, item.reason)
            if parse_step_dir(item.name) is not None:  # a committed folder, not a .tmp one
                self._rejected.add(item.step)
        if selection.rejected:
            metrics.FALLBACKS.inc(len(selection.rejected))
        if selection.path is None:
            log.info("no valid checkpoint under %s: fresh start", self.root)
        else:
            fallback = " (fallback: newer ones were damaged)" if selection.rejected else ""
            log.info("resuming from %s%s", selection.path.name, fallback)

    def _apply(
        self,
        folder: Path,
        manifest: Manifest,
        app_state: dict[str, Stateful],
        small: dict[str, Any],
        live_skeleton: Any,
        live_tensors: dict[str, torch.Tensor],
    ) -> None:
        if self.rank >= manifest.world_size:
            log.warning(
                "checkpoint has %d ranks; rank %d takes rank 0's per-rank state",
                manifest.world_size,
                self.rank,
            )
        # live_tensors hold the checkpoint's data (loaded and verified by _load_and_verify).
        skeleton = overlay_plain_values(live_skeleton, small.get("sharded", {}))
        apply_sharded(app_state, fill_tensors(skeleton, live_tensors.__getitem__))
        not_in_checkpoint = apply_per_rank(app_state, small.get("per_rank", {}))
        if not_in_checkpoint:
            log.warning("checkpoint %s has no state for %s; they start fresh", folder.name, not_in_checkpoint)

    # -- save ---------------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        interval = self.config.interval_steps
        return self.enabled and interval > 0 and step % interval == 0

    def save(self, step: int, app_state: dict[str, Stateful], *, emergency: bool = False) -> None:
        """Checkpoint `step`. Returns once the state is staged (async) or committed (sync, emergency).

        A save in flight is finished first. An emergency save is skipped, with a log line, when its
        estimated duration does not fit config.emergency_budget_seconds. Once an emergency save (or
        an earlier save of the same step) is committed, the state is also kept in memory.
        """
        called = time.monotonic()
        written = self._save(step, app_state, emergency=emergency)
        if emergency:
            left = self.config.emergency_budget_seconds - (time.monotonic() - called)
            self._keep_in_memory(step, app_state, written, seconds_left=left)

    def _save(
        self, step: int, app_state: dict[str, Stateful], *, emergency: bool
    ) -> tuple[bytes, dict[str, torch.Tensor]] | None:
        """The save; returns what it wrote of this rank (per-rank state, every tensor), if it wrote."""
        if not self.enabled:
            return None
        called = time.monotonic()
        self._raise_if_failed(self._writer.wait())
        if self.last is not None and self.last.step == step:
            log.info("step %d is already checkpointed", step)
            return None
        if emergency and not self._emergency_fits(step, app_state, called):
            return None
        started = time.monotonic()
        small_state, all_tensors = _collect(app_state)
        tensors = self._own_share(app_state, all_tensors)
        staged = self._staging.stage(tensors)
        if self._layout is None:
            self._layout = describe_layout(app_state, self.world_size)
        pending = _Pending(step, emergency, staged, small_state, started, time.monotonic() - started)
        metrics.SAVE_BLOCKING_SECONDS.observe(pending.blocking_seconds)
        if self.config.async_save and not emergency:
            self._writer.submit(lambda: self._write(pending), name=f"checkpoint-step-{step}")
        else:
            self._write(pending)
        return small_state, all_tensors

    def _own_share(
        self, app_state: Mapping[str, Any], tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """What this rank stages and writes. A data-parallel replica past the first leaves out the
        state the first one writes (DCP's metadata is the union of what the ranks write), so a node
        of 8 replicas holds one pinned copy of it, not 8."""
        if self.replica_rank == 0:
            return tensors
        prefixes = replicated_prefixes(app_state)
        return {key: tensor for key, tensor in tensors.items() if not key.startswith(prefixes)}

    def _emergency_fits(self, step: int, app_state: dict[str, Stateful], called: float) -> bool:
        sharded, _ = collect(app_state)
        _, tensors = split_tensors(sharded)
        rank_bytes = tensor_bytes(self._own_share(app_state, tensors))
        job_bytes = int(sum(self._all_gather(rank_bytes)))
        last = None
        if self.last_save is not None:
            record = self.last_save
            last = MeasuredSave(
                record.blocking_seconds, record.total_seconds - record.blocking_seconds, record.staged_bytes
            )
        speed = write_speed(self.config.write_bytes_per_second, self.storage_bytes_per_second)
        estimate = emergency_estimate(rank_bytes=rank_bytes, job_bytes=job_bytes, speed=speed, last=last)
        remaining = self.config.emergency_budget_seconds - (time.monotonic() - called)
        worst_estimate, neg_remaining = self._max([estimate, -remaining])
        if worst_estimate <= -neg_remaining:
            return True
        metrics.EMERGENCY_SKIPPED.inc()
        log.warning(
            "emergency checkpoint at step %d skipped: estimated %.1fs exceeds the %.1fs left of the budget; "
            "resume will use step %s",
            step,
            worst_estimate,
            -neg_remaining,
            self.last.step if self.last else "none",
        )
        return False

    def _write(self, pending: _Pending) -> None:
        token = self._broadcast(uuid.uuid4().hex if self.rank == 0 else None)
        temporary = self.root / temporary_dir_name(pending.step, token)
        temporary.mkdir(parents=True, exist_ok=True)
        own_small = rank_file_name(self.rank)
        with open(temporary / own_small, "wb") as handle:
            handle.write(pending.small_state)
            handle.flush()
            os.fsync(handle.fileno())
        writer = HashingFileSystemWriter(
            temporary, single_file_per_rank=True, sync_files=True, thread_count=self.io_threads
        )
        dcp_save(
            pending.staged, storage_writer=writer, process_group=self._group, no_dist=self._group is None
        )
        hashed = writer.entries
        own_entries = [describe_file(temporary, own_small)]
        own_entries += [entry for name, entry in sorted(hashed.items()) if name.endswith(".distcp")]
        if DCP_METADATA_NAME in hashed:
            own_entries.append(hashed[DCP_METADATA_NAME])
        everyone = self._all_gather(own_entries)
        outcome: tuple[bool, str] | None = None
        if self.rank == 0:
            try:
                self._check_shared_storage(temporary, everyone)
                outcome = (
                    True,
                    self._commit(pending, temporary, [e for entries in everyone for e in entries], token),
                )
            except Exception as error:  # tell the other ranks instead of leaving them in the broadcast
                outcome = (False, f"commit failed on rank 0: {type(error).__name__}: {error}")
        committed, final = self._broadcast(outcome)
        if not committed:
            raise CheckpointError(final)
        total = time.monotonic() - pending.started
        written = sum(entry.size for entry in own_entries)
        staged = tensor_bytes(pending.staged)
        self.last_save = SaveRecord(pending.step, pending.blocking_seconds, total, written, staged)
        self.last = CheckpointInfo(step=pending.step, time=_now_rfc3339(), path=str(final), save_id=token)
        metrics.SAVE_TOTAL_SECONDS.observe(total)
        metrics.SAVE_BYTES.set(written)
        metrics.LAST_STEP.set(pending.step)
        metrics.LAST_TIME.set(time.time())
        log.info(
            "checkpoint step %d committed%s: blocked %.3fs, total %.2fs, %d bytes on rank %d",
            pending.step,
            " (emergency)" if pending.emergency else "",
            pending.blocking_seconds,
            total,
            written,
            self.rank,
        )

    def _check_shared_storage(self, temporary: Path, everyone: list[list[FileEntry]]) -> None:
        """Rank 0 commits by renaming a folder that holds every rank's files: on node-local disks it
        would publish a checkpoint without the other nodes' files, which no resume can load."""
        writer_of = {entry.path: rank for rank, entries in enumerate(everyone) for entry in entries}
        expected = {entry.path: entry.size for entries in everyone[1:] for entry in entries}
        unseen = unseen_files(temporary, expected)
        if unseen:
            raise CheckpointError(
                f"the checkpoint folder {self.root} is not shared storage: rank 0 does not see "
                f"{len(unseen)} file(s) other ranks wrote there (e.g. {unseen[0]} from rank "
                f"{writer_of[unseen[0]]}). Every rank must write to one filesystem that all nodes "
                "mount (NFS, a ReadWriteMany volume, a parallel filesystem), not a node-local disk: "
                "see docs/checkpoints.md"
            )

    def _commit(self, pending: _Pending, temporary: Path, entries: list[FileEntry], save_id: str) -> str:
        if DCP_METADATA_NAME not in {entry.path for entry in entries}:
            entries.append(describe_file(temporary, DCP_METADATA_NAME))
        manifest = Manifest(
            step=pending.step,
            world_size=self.world_size,
            layout=self._layout or {},
            created=_now_rfc3339(),
            files=tuple(sorted(entries, key=lambda entry: entry.path)),
            emergency=pending.emergency,
            extra={**self._written_with, SAVE_ID_KEY: save_id},
        )
        write_manifest(temporary, manifest)
        final = self.root / step_dir_name(pending.step)
        commit(temporary, final)
        self._rejected.discard(pending.step)  # a damaged older copy of this step was replaced
        self._apply_retention(protected={pending.step})
        return str(final)

    def _apply_retention(self, protected: set[int]) -> None:
        complete = list_checkpoints(self.root).complete
        steps = [step for step, _ in complete]
        # Sizes and structure only (no digests): a folder whose manifest, files or sizes are wrong, or
        # that the resume rejected, is no checkpoint to count.
        invalid = {
            step for step, folder in complete if step in self._rejected or not _looks_valid(folder, step)
        }
        for victim in retention_victims(steps, self.config.keep, protected, invalid):
            remove_tree(self.root / step_dir_name(victim))
            reason = "failed verification" if victim in invalid else f"keep={self.config.keep}"
            log.info("removed checkpoint %s (%s)", step_dir_name(victim), reason)
            self._rejected.discard(victim)

    # -- lifecycle ----------------------------------------------------------------------------------

    @staticmethod
    def _raise_if_failed(error: BaseException | None) -> None:
        if error is not None:
            raise CheckpointError(f"checkpoint write failed: {type(error).__name__}: {error}") from error

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed."""
        self._raise_if_failed(self._writer.wait())

    def close(self) -> None:
        self.wait()

    def status(self) -> dict[str, Any]:
        """What the operator copies into status.lastCheckpoint (served on the trainer's /progress)."""
        if self.last is None:
            return {}
        body: dict[str, Any] = {"step": self.last.step, "time": self.last.time, "path": self.last.path}
        if self.last_save is not None and self.last_save.step == self.last.step:
            body["blockingSeconds"] = round(self.last_save.blocking_seconds, 4)
            body["totalSeconds"] = round(self.last_save.total_seconds, 3)
            body["bytes"] = self.last_save.bytes_written
        return body


def _looks_valid(folder: Path, step: int) -> bool:
    try:
        verify_folder(folder, expected_step=step, check_digests=False)
    except ManifestError:
        return False
    return True


def _parse_time(value: str) -> float:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _collect(app_state: Mapping[str, Any]) -> tuple[bytes, dict[str, torch.Tensor]]:
    """What a save writes of this rank: its per-rank file's bytes, and every tensor it holds by key."""
    sharded, per_rank = collect(app_state)
    skeleton, tensors = split_tensors(sharded)
    return dump_small_state({"sharded": skeleton, "per_rank": per_rank}), tensors
