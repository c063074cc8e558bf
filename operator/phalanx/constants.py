"""Names shared by the operator, its manifests and the trainer's environment contract.

One source of truth: builders, policies, the CRD's CEL rules and docs/environment.md read these.
The trainer keeps its own copy (phalanx_trainer/contract.py); tests/unit/test_contract.py checks
that both sides agree.
"""

from typing import Final

GROUP: Final = "phalanx.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TrainingJob"
PLURAL: Final = "trainingjobs"
SINGULAR: Final = "trainingjob"
SHORT_NAMES: Final = ("tj",)

TRAINER_CONTAINER: Final = "trainer"

# Labels and annotations on everything a TrainingJob owns.
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_REPLICA_INDEX: Final = f"{GROUP}/replica-index"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
# The size of the attempt the pod was built for (its WORLD_SIZE / procs): read back from the pods, since
# status.currentReplicas can be lost or lag behind the creates (pod_facts.attempt_sizes).
LABEL_GANG_SIZE: Final = f"{GROUP}/gang-size"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
# On a warm spare (spec.spares): "true" while it stands by. It has no replica-index label then; a spare
# that takes a lost rank is relabelled (this label removed, replica-index set), so everything that
# indexes pods by rank finds it (pod_facts.py, policy/spares.py).
LABEL_SPARE: Final = f"{GROUP}/spare"
MANAGED_BY: Final = "phalanx"
GANG_SCHEDULING_GATE: Final = f"{GROUP}/gang"
# spec.managedBy: unset or this and this operator runs the job; any other value (MultiKueue's, say)
# and it leaves the job alone (docs/kueue.md).
CONTROLLER_NAME: Final = f"{GROUP}/operator"
# Kueue (docs/kueue.md): a job with this label is admitted by Kueue, through a Workload the operator
# owns, instead of the built-in gang admission.
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"  # what Kueue v0.17 stores
KUEUE_API_VERSION: Final = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
# TrainingJob as Kueue's integrations.externalFrameworks names it (Kind.version.group): required, so
# that Kueue's pod integration leaves the worker pods to the operator (docs/kueue.md).
KUEUE_EXTERNAL_FRAMEWORK: Final = f"{KIND}.{VERSION}.{GROUP}"
# Kueue's finalizer, set on the Workload when it is created (as Kueue's own integrations do): garbage
# collection of a deleted job would otherwise drop the Workload, and the quota with it, while the
# pods still take their grace period. The operator removes it once the gang has stopped.
KUEUE_RESOURCE_IN_USE_FINALIZER: Final = "kueue.x-k8s.io/resource-in-use"
KUEUE_PODSET: Final = "workers"  # the Workload's one pod set: the whole gang
# On the Workload: the spec.runPolicy.suspend the operator last wrote into spec.active ("true"/"false"),
# so that it writes spec.active only when suspend changes, never over Kueue's or an admin's deactivation.
KUEUE_SUSPENDED_ANNOTATION: Final = "phalanx.dev/suspended"
# On a pod whose trainer is a resident launcher (restartStrategy InPlace): the operator's pod
# stores keep metadata, not the container env, so this is what says a pod can restart in place.
ANNOTATION_RESIDENT_LAUNCHER: Final = f"{GROUP}/resident-launcher"
# A random bearer token per in-place pod: the launcher reads it (downward API env), the operator
# sends it with each POST /generation (docs/trainer.md "Restart in place").
ANNOTATION_CONTROL_TOKEN: Final = f"{GROUP}/control-token"
# The nodes a worker pod was built to keep off (comma-separated): its attempt's avoidance, as built,
# so a gated gang whose avoidance no longer holds can be rebuilt (reconcile/rules/creation.py).
ANNOTATION_AVOIDED_NODES: Final = f"{GROUP}/avoided-nodes"

# On the TrainingJob CRD: a digest of its spec as `make crd` generated it (api/crd.py). The operator
# compares it with its own at start: `helm upgrade` leaves CRDs as they were, and an API server with
# an older schema drops the status fields it does not know, silently (crd_freshness).
ANNOTATION_SCHEMA_DIGEST: Final = f"{GROUP}/schema-digest"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# Exit-code contract between trainer and operator (docs/environment.md).
EXIT_SUCCESS: Final = 0
# EX_TEMPFAIL from sysexits.h: the trainer saved a checkpoint after SIGTERM and stopped on purpose.
EXIT_CHECKPOINTED_ON_PREEMPTION: Final = 75
# EX_PROTOCOL, from a resident launcher (restart in place) whose generation broke without a
# checkpoint (a peer was lost, or the worker was fenced out as stale): retryable, like a signal.
EXIT_GENERATION_FAILED: Final = 76
# EX_CONFIG, from the trainer: its config is valid but cannot split this world size (global batch,
# tp x pp). An elastic gang skips that size from then on and retries (rules/elastic.py); a fixed one fails.
EXIT_WORLD_SIZE_UNUSABLE: Final = 78
# The trainer's stderr line with exit 78 (the termination message, FallbackToLogsOnError): 78 alone is
# os.EX_CONFIG, which any script may use; only the trainer container with this line means the size.
WORLD_SIZE_UNUSABLE_MARKER: Final = "phalanx-trainer: world size unusable"
# The same, for a world smaller than tp x pp: no smaller world is usable either.
WORLD_SIZE_TOO_SMALL_MARKER: Final = "phalanx-trainer: world size too small"
# status.elasticUnusableSizes keeps at most this many sizes (the largest: those growth aims at).
MAX_UNUSABLE_SIZES: Final = 64
# 1-127 (other than the code above) are permanent unless listed in spec.runPolicy.retryableExitCodes;
# 128-255 (killed by a signal, including OOM kills) are retryable failures.
FIRST_SIGNAL_EXIT_CODE: Final = 128

DEFAULT_RENDEZVOUS_PORT: Final = 29500
DEFAULT_METRICS_PORT: Final = 9400
# With spec.runPolicy.hangTimeoutSeconds, the trainer's collective timeout is that plus this, and
# never below the floor: the operator's Hang verdict (which names the silent pods) comes first and
# the trainer's timeout is the backstop. The floor is NCCL's own default: every collective gets the
# timeout, the ones of a checkpoint restore or a final save on slow storage too, which the hang
# bound leaves out.
HANG_COLLECTIVE_MARGIN_SECONDS: Final = 30
HANG_COLLECTIVE_FLOOR_SECONDS: Final = 600
DEFAULT_CONTROL_PORT: Final = 9399  # the resident launcher's control server (restart in place)
DEFAULT_CHECKPOINT_PATH: Final = "/checkpoints"

# The environment contract: variables the operator sets in every trainer container.
ENV_MASTER_ADDR: Final = "MASTER_ADDR"
ENV_MASTER_PORT: Final = "MASTER_PORT"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"  # processes (replicas x procsPerReplica), not pods
ENV_NNODES: Final = "NNODES"
ENV_NODE_RANK: Final = "NODE_RANK"
ENV_NPROC_PER_NODE: Final = "NPROC_PER_NODE"
ENV_PET_NNODES: Final = "PET_NNODES"
ENV_PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
ENV_PET_NODE_RANK: Final = "PET_NODE_RANK"
ENV_PET_MASTER_ADDR: Final = "PET_MASTER_ADDR"
ENV_PET_MASTER_PORT: Final = "PET_MASTER_PORT"
ENV_JOB_NAME: Final = "PHALANX_JOB_NAME"
ENV_JOB_UID: Final = "PHALANX_JOB_UID"
ENV_ATTEMPT: Final = "PHALANX_ATTEMPT"
ENV_CHECKPOINT_DIR: Final = "PHALANX_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL: Final = "PHALANX_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINT_KEEP: Final = "PHALANX_CHECKPOINT_KEEP"
ENV_METRICS_PORT: Final = "PHALANX_METRICS_PORT"
ENV_RENDEZVOUS_TIMEOUT: Final = "PHALANX_RENDEZVOUS_TIMEOUT_SECONDS"
# Beyond the gang timeout, what a replacement pod may take to start and reach the rendezvous.
REPLACEMENT_START_MARGIN_SECONDS: Final = 60
ENV_PREEMPTION_EXIT_CODE: Final = "PHALANX_PREEMPTION_EXIT_CODE"
ENV_GRACE_PERIOD: Final = "PHALANX_TERMINATION_GRACE_SECONDS"
# Restart in place: the pod's launcher stays resident and restarts its workers per generation.
ENV_RESTART_IN_PLACE: Final = "PHALANX_RESTART_IN_PLACE"
ENV_GENERATION: Final = "PHALANX_GENERATION"
ENV_CONTROL_PORT: Final = "PHALANX_CONTROL_PORT"
ENV_CONTROL_TOKEN: Final = "PHALANX_CONTROL_TOKEN"
ENV_SPARE: Final = "PHALANX_SPARE"
ENV_COLLECTIVE_TIMEOUT: Final = "PHALANX_COLLECTIVE_TIMEOUT_SECONDS"
ENV_GENERATION_WAIT: Final = "PHALANX_GENERATION_WAIT_SECONDS"

# spec.runPolicy.restartStrategy, and status.lastRecovery.path of a recovery that took that path.
RESTART_STRATEGY_FULL: Final = "FullRestart"
RESTART_STRATEGY_IN_PLACE: Final = "InPlace"
# status.lastRecovery.path of an in-place recovery in which a warm spare took the lost rank.
RECOVERY_PATH_IN_PLACE_SPARE: Final = "InPlaceSpare"
MAX_SPARES: Final = 16
# A warm spare's readiness probe (GET /generation on the control port) runs this often.
SPARE_READINESS_PERIOD_SECONDS: Final = 2
# A spare lost while standing by (or refused by the API server) is replaced at once the first time,
# then after this long, doubled each time in a row, up to the cap (status.spares.nextCreateTime).
SPARE_BACKOFF_SECONDS: Final = 5.0
SPARE_BACKOFF_MAX_SECONDS: Final = 300.0
# What keeps a pod's processes across a restart in place (spec.runPolicy.inPlaceLauncher): the
# trainer image's resident launcher (told each generation by the operator), or torchrun's elastic
# agent (it re-forms the gang by itself: c10d rendezvous, builders/torchrun_env.py).
IN_PLACE_LAUNCHER_PHALANX: Final = "Phalanx"
IN_PLACE_LAUNCHER_TORCHRUN: Final = "Torchrun"
RESIDENT_TORCHRUN: Final = "torchrun"  # the resident-launcher annotation's value for a torchrun agent
# The resident launcher's control endpoint the operator POSTs a restart generation to.
GENERATION_PATH: Final = "/generation"

# Names the operator owns: a template that sets one of these is rejected at admission.
# torchrun's elastic agent (bring-your-own trainer, docs/torchrun.md). torchrun reads each CLI flag
# from PET_<FLAG> (torch/distributed/argparse_util.py); builders/torchrun_env.py sets these.
ENV_PET_RDZV_BACKEND: Final = "PET_RDZV_BACKEND"
ENV_PET_RDZV_ENDPOINT: Final = "PET_RDZV_ENDPOINT"
ENV_PET_RDZV_ID: Final = "PET_RDZV_ID"
ENV_PET_RDZV_CONF: Final = "PET_RDZV_CONF"
ENV_PET_MAX_RESTARTS: Final = "PET_MAX_RESTARTS"
ENV_PET_LOCAL_ADDR: Final = "PET_LOCAL_ADDR"
TORCHRUN_ELASTIC_ENV_NAMES: Final = (
    ENV_PET_RDZV_BACKEND,
    ENV_PET_RDZV_ENDPOINT,
    ENV_PET_RDZV_ID,
    ENV_PET_RDZV_CONF,
    ENV_PET_MAX_RESTARTS,
    ENV_PET_LOCAL_ADDR,
)
# c10d is the rendezvous that lets a surviving agent re-form the gang with a replacement agent;
# torchrun's default ("static") only restarts a gang whose members all stay the same processes.
TORCHRUN_RDZV_BACKEND: Final = "c10d"
# A dead agent stays a member of the rendezvous until it has missed this many heartbeats of this
# interval (torch's defaults: 5 s x 3 = 15 s), and the survivors wait that long for it to be dropped.
TORCHRUN_KEEP_ALIVE_INTERVAL_SECONDS: Final = 1
TORCHRUN_KEEP_ALIVE_MAX_ATTEMPTS: Final = 5
DEFAULT_TORCHRUN_MAX_RESTARTS: Final = 3
# An agent's restart budget lasts the pod's whole life and every in-place recovery spends one on
# every kept agent (its workers fail with the lost peer): the operator keeps the job's budget
# (backoffLimit, preemptions free), so the agents get one they never reach.
TORCHRUN_IN_PLACE_MAX_RESTARTS: Final = 1_000_000
# torch's agent on group rank 0 otherwise serves one store to its workers for the pod's whole life,
# and a restarted worker finds the previous generation's gloo/NCCL addresses in it (connection
# refused, or a hang). Off, rank 0's worker hosts a fresh store for every rendezvous round.
ENV_TORCH_DISABLE_SHARED_RDZV_STORE: Final = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

RESERVED_ENV_NAMES: Final = (
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_WORLD_SIZE,
    "RANK",
    "LOCAL_RANK",
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_NPROC_PER_NODE,
    ENV_PET_NNODES,
    ENV_PET_NPROC_PER_NODE,
    ENV_PET_NODE_RANK,
    ENV_PET_MASTER_ADDR,
    ENV_PET_MASTER_PORT,
    ENV_JOB_NAME,
    ENV_JOB_UID,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_INTERVAL,
    ENV_CHECKPOINT_KEEP,
    ENV_METRICS_PORT,
    ENV_RENDEZVOUS_TIMEOUT,
    ENV_PREEMPTION_EXIT_CODE,
    ENV_GRACE_PERIOD,
    ENV_RESTART_IN_PLACE,
    ENV_GENERATION,
    ENV_CONTROL_PORT,
    ENV_CONTROL_TOKEN,
    ENV_SPARE,
    ENV_COLLECTIVE_TIMEOUT,
    ENV_GENERATION_WAIT,
    *TORCHRUN_ELASTIC_ENV_NAMES,
    ENV_TORCH_DISABLE_SHARED_RDZV_STORE,
)

# NCCL defaults the user may override through the template's env.
NCCL_DEFAULTS: Final = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "NCCL_ASYNC_ERROR_HANDLING": "1",
}

GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"

# Operator setting: seconds a node may be not Ready before gangs with pods there restart elsewhere.
ENV_NODE_LOST_AFTER: Final = "PHALANX_NODE_LOST_AFTER_SECONDS"
# The longest wait before a failed reconcile is tried again (doubling from 2 s up to it).
ENV_RETRY_MAX_SECONDS: Final = "PHALANX_RETRY_MAX_SECONDS"
RETRY_MAX_SECONDS: Final = 60.0
# The least seconds between two writes of a running job's status.progress (policy/progress_writes.py).
ENV_PROGRESS_STATUS_SECONDS: Final = "PHALANX_PROGRESS_STATUS_SECONDS"

# Progress endpoint the trainer's local rank 0 of global rank 0 serves (JSON, see docs/environment.md).
PROGRESS_PATH: Final = "/progress"
# Where the progress poller reads a job's rank 0 ({ip}: its pod IP, {port}: the trainer's port).
PROGRESS_URL_TEMPLATE: Final = "http://{ip}:{port}" + PROGRESS_PATH
# Benchmarks only (bench/steady_state.py; checked at start by policy/progress_url.py): poll a stand-in server instead, as
# http://127.0.0.1:8000/{ip}/progress, since kwok's simulated pods serve nothing.
ENV_PROGRESS_URL_TEMPLATE: Final = "PHALANX_PROGRESS_URL_TEMPLATE"
