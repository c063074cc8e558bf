"""The trainer's side of the environment contract (docs/environment.md).

Kept apart from the operator on purpose: the two meet only at these names and exit codes, and
tests/unit/test_contract.py checks both sides agree.
"""

from typing import Final

ENV_MASTER_ADDR: Final = "MASTER_ADDR"
ENV_MASTER_PORT: Final = "MASTER_PORT"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_RANK: Final = "RANK"
ENV_LOCAL_RANK: Final = "LOCAL_RANK"
ENV_NNODES: Final = "NNODES"
ENV_NODE_RANK: Final = "NODE_RANK"
ENV_NPROC_PER_NODE: Final = "NPROC_PER_NODE"
ENV_JOB_NAME: Final = "PHALANX_JOB_NAME"
ENV_JOB_UID: Final = "PHALANX_JOB_UID"
ENV_ATTEMPT: Final = "PHALANX_ATTEMPT"
ENV_CHECKPOINT_DIR: Final = "PHALANX_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL: Final = "PHALANX_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINT_KEEP: Final = "PHALANX_CHECKPOINT_KEEP"
ENV_METRICS_PORT: Final = "PHALANX_METRICS_PORT"
ENV_RENDEZVOUS_TIMEOUT: Final = "PHALANX_RENDEZVOUS_TIMEOUT_SECONDS"
ENV_PREEMPTION_EXIT_CODE: Final = "PHALANX_PREEMPTION_EXIT_CODE"
ENV_GRACE_PERIOD: Final = "PHALANX_TERMINATION_GRACE_SECONDS"
# Restart in place (docs/trainer.md "Restart in place"): a resident launcher per pod.
ENV_RESTART_IN_PLACE: Final = "PHALANX_RESTART_IN_PLACE"
ENV_GENERATION: Final = "PHALANX_GENERATION"
ENV_CONTROL_PORT: Final = "PHALANX_CONTROL_PORT"
# The bearer token a POST /generation must carry (the operator sets one per pod); never in the workers' env.
ENV_CONTROL_TOKEN: Final = "PHALANX_CONTROL_TOKEN"
ENV_SPARE: Final = "PHALANX_SPARE"
ENV_COLLECTIVE_TIMEOUT: Final = "PHALANX_COLLECTIVE_TIMEOUT_SECONDS"
ENV_GENERATION_WAIT: Final = "PHALANX_GENERATION_WAIT_SECONDS"

EXIT_SUCCESS: Final = 0
EXIT_PERMANENT_ERROR: Final = 1
EXIT_CHECKPOINTED_ON_PREEMPTION: Final = 75
# EX_PROTOCOL: this worker's restart generation broke (a peer was lost mid-collective, or the worker
# was fenced out as stale) and nothing was saved; retryable from the newest checkpoint.
EXIT_GENERATION_FAILED: Final = 76
# EX_CONFIG: the config is valid, but not at this world size (data.global_batch_size does not divide
# over its data-parallel ranks, or tp x pp does not divide it). An elastic gang retries another size.
EXIT_WORLD_SIZE_UNUSABLE: Final = 78
# Starts the stderr line of an exit 78 (the operator reads it in the termination message: 78 alone is
# os.EX_CONFIG, which any script may use).
WORLD_SIZE_UNUSABLE_MARKER: Final = "phalanx-trainer: world size unusable"
# The same, for a world smaller than tp x pp (no smaller one is usable either; the line names the
# smallest usable world size).
WORLD_SIZE_TOO_SMALL_MARKER: Final = "phalanx-trainer: world size too small"

DEFAULT_METRICS_PORT: Final = 9400
DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS: Final = 600.0
DEFAULT_CONTROL_PORT: Final = 9399  # below the metrics ports, which count up from 9400 per local rank
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS: Final = 30.0  # with restart in place; torch's own default otherwise
DEFAULT_GENERATION_WAIT_SECONDS: Final = 120.0
PROGRESS_PATH: Final = "/progress"
