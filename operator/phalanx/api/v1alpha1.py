"""TrainingJob, phalanx.dev/v1alpha1: the contract users write against.

Every field's description, default, bounds and cross-field rule lives here; `make crd` turns this
module into crds/phalanx.dev_trainingjobs.yaml, the chart's copy and docs/api.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from phalanx import constants as c
from phalanx.api.schema import Rule, api_field

# The longest pod name is "<job>-worker-<index>" and must be a DNS label (63 characters):
# 63 - len("-worker-") - 5 digits of index leaves 50.
MAX_JOB_NAME_LENGTH = 50
MAX_REPLICAS = 10_000

_RESERVED_LIST = "[" + ", ".join(f"'{n}'" for n in c.RESERVED_ENV_NAMES) + "]"


@dataclass
class EnvVar:
    """An environment variable of a container (Kubernetes' EnvVar)."""

    __kubernetes_type__ = "io.k8s.api.core.v1.EnvVar"
    name: str = api_field("Variable name.", required=True, max_length=256)
    value: str | None = api_field("Variable value.", max_length=32768)


@dataclass
class Container:
    """A container of the pod template (Kubernetes' Container), checked at admission."""

    __kubernetes_type__ = "io.k8s.api.core.v1.Container"
    __rules__ = (
        Rule(
            f"!has(self.env) || self.env.all(e, !(e.name in {_RESERVED_LIST}))",
            "env sets a name the operator owns (MASTER_ADDR, WORLD_SIZE, RANK, PET_*, PHALANX_*); "
            "remove it: Phalanx sets it from spec (see docs/environment.md)",
            reason="FieldValueForbidden",
        ),
    )
    name: str = api_field(
        "Container name; the one named 'trainer' runs training.", required=True, max_length=63
    )
    image: str | None = api_field("Container image.", max_length=1024)
    env: list[EnvVar] | None = api_field("Environment variables.", max_items=256)


@dataclass
class PodSpecTemplate:
    """The pod spec of the template: Kubernetes' PodSpec (1.36), checked at admission; the operator
    adds what gang scheduling and rendezvous need."""

    __kubernetes_type__ = "io.k8s.api.core.v1.PodSpec"
    __rules__ = (
        Rule(
            "self.containers.exists(x, x.name == 'trainer')",
            "needs a container named 'trainer': add one to spec.template.spec.containers",
            field_path=".containers",
            reason="FieldValueRequired",
        ),
    )
    containers: list[Container] = api_field(
        "Containers of each pod; exactly one must be named 'trainer'.",
        required=True,
        max_items=16,
        factory=list,
    )
    restart_policy: str | None = api_field(
        "Must be Never or unset: the operator decides restarts, all pods of a gang together.",
        enum=("Never",),
    )


@dataclass
class EmbeddedMetadata:
    """Metadata of the pods made from the template: labels and annotations only (names, owners and
    the rest are the operator's)."""

    labels: dict[str, str] | None = api_field("Labels, added to the operator's own.")
    annotations: dict[str, str] | None = api_field("Annotations.")


@dataclass
class PodTemplate:
    """The pod template every worker is made from (a PodTemplateSpec)."""

    metadata: EmbeddedMetadata | None = api_field("Labels and annotations for the pods.")
    spec: PodSpecTemplate = api_field("The pod spec.", required=True, factory=PodSpecTemplate)


@dataclass
class MigDevice:
    """A MIG slice per pod, requested as nvidia.com/mig-<profile> (the device plugin's mixed strategy)."""

    profile: str = api_field(
        "MIG profile, for example 1g.10gb or 3g.40gb.",
        required=True,
        pattern=r"^[1-9]g\.[0-9]+gb(\+me)?$",
        example="1g.10gb",
        default="",
    )
    count: int = api_field("MIG devices of this profile per pod.", default=1, minimum=1, maximum=7)


@dataclass
class Resources:
    """Accelerators per pod. Set gpus or mig, not both; cpu and memory go in the template."""

    __rules__ = (
        Rule(
            "!(has(self.gpus) && self.gpus > 0 && has(self.mig))",
            "set either gpus or mig, not both: a pod gets whole GPUs or MIG slices",
            reason="FieldValueForbidden",
        ),
    )
    gpus: int | None = api_field("nvidia.com/gpu per pod (requests = limits).", minimum=0, maximum=64)
    mig: MigDevice | None = api_field("A MIG device per pod instead of whole GPUs.")


@dataclass
class Rendezvous:
    """Where rank 0 listens for torch.distributed's rendezvous."""

    port: int = api_field("MASTER_PORT.", default=c.DEFAULT_RENDEZVOUS_PORT, minimum=1024, maximum=65535)
    timeout_seconds: int = api_field(
        "How long workers wait for rank 0's address to resolve and accept connections. Restarting in "
        "place, at least terminationGracePeriodSeconds + the gang timeout + 60: the kept ranks wait "
        "for the replacement pod.",
        default=600, minimum=10, maximum=86400,
    )  # fmt: skip


@dataclass
class Nccl:
    """NCCL settings. Any other NCCL_* or TORCH_NCCL_* variable passes through the template's env."""

    debug: str | None = api_field("NCCL_DEBUG.", enum=("VERSION", "WARN", "INFO", "TRACE"))
    socket_ifname: str | None = api_field("NCCL_SOCKET_IFNAME, for example eth0 or ^lo.", max_length=256)
    ib_disable: bool | None = api_field("NCCL_IB_DISABLE: true turns InfiniBand off.")


@dataclass
class PersistentVolumeClaimSource:
    """An existing PersistentVolumeClaim."""

    claim_name: str = api_field("Claim name.", required=True, default="", max_length=253)
    read_only: bool | None = api_field("Mount read-only (checkpoints cannot be written then).")


@dataclass
class HostPathSource:
    """A directory on the node (single-node development only)."""

    path: str = api_field("Path on the node.", required=True, default="", max_length=4096)
    type: str | None = api_field("hostPath type.", enum=("", "DirectoryOrCreate", "Directory"))


@dataclass
class EmptyDirSource:
    """Scratch space that lives as long as the pod: checkpoints do not survive a gang restart."""

    medium: str | None = api_field("'' or Memory.", enum=("", "Memory"))
    size_limit: str | None = api_field("Size limit, for example 10Gi.", max_length=64)


@dataclass
class CheckpointVolume:
    """A volume source for checkpoints (one of the listed kinds; others pass through unchanged)."""

    __preserve_unknown__ = True
    __rules__ = (
        Rule(
            "(has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + "
            "(has(self.emptyDir) ? 1 : 0) <= 1",
            "give exactly one volume source (persistentVolumeClaim, hostPath or emptyDir)",
        ),
    )
    persistent_volume_claim: PersistentVolumeClaimSource | None = api_field(
        "A PersistentVolumeClaim (recommended)."
    )
    host_path: HostPathSource | None = api_field("A node directory.")
    empty_dir: EmptyDirSource | None = api_field("A pod-lifetime directory.")


@dataclass
class Checkpoint:
    """Where and how often the trainer checkpoints; the volume is mounted at `path` in every pod."""

    path: str = api_field(
        "Mount path, exported as PHALANX_CHECKPOINT_DIR.", default=c.DEFAULT_CHECKPOINT_PATH,
        pattern="^/.*", max_length=4096,
    )  # fmt: skip
    volume: CheckpointVolume | None = api_field("Volume for checkpoints; without one nothing is mounted.")
    interval_steps: int | None = api_field("Checkpoint every N steps.", minimum=1)
    keep: int = api_field("Complete checkpoints kept (the newest is never deleted).", default=3, minimum=2,
                          maximum=1000)  # fmt: skip


@dataclass
class Gang:
    """All-or-nothing admission of the job's pods."""

    min_available: int | None = api_field(
        "Deprecated, kept so stored jobs stay valid: must equal replicas when set, and is refused "
        "with spec.elastic. A gang that may run smaller is spec.elastic.minReplicas.",
        minimum=1,
    )
    timeout_seconds: int = api_field(
        "builtin provider: admitted pods that are not all Running by then are torn down and requeued "
        "with backoff; 0 turns this off. volcano and coscheduling: the PodGroup's own timeout.",
        default=300, minimum=0, maximum=86400,
        rules=(Rule("self == 0 || self >= 10", "must be 0 (off) or at least 10 seconds"),),
    )  # fmt: skip


@dataclass
class Topology:
    """Place the gang within domains of a node label (gang/topology.py)."""

    key: str = api_field(
        "The node label whose values are the domains: topology.kubernetes.io/zone, a rack label, "
        "nvidia.com/gpu.clique (an NVLink domain).",
        required=True, max_length=317, extra={"minLength": 1},
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    )  # fmt: skip
    mode: str = api_field(
        "Required: the gang (or each group) within one domain, or wait; Preferred: as few domains as "
        "possible.",
        default="Required", enum=("Required", "Preferred"),
    )  # fmt: skip
    group_size: int | None = api_field(
        "Required only: each run of this many consecutive ranks shares one domain (the last run may "
        "be shorter); unset, the whole gang does.",
        minimum=1, maximum=MAX_REPLICAS,
    )  # fmt: skip


@dataclass
class Elastic:
    """A gang whose size may change: it starts when minReplicas fit, grows towards maxReplicas at a
    checkpoint when room appears, and shrinks instead of waiting when a node is lost
    (docs/elastic.md)."""

    __rules__ = (
        Rule(
            "self.minReplicas <= self.maxReplicas",
            "spec.elastic.minReplicas must be at most spec.elastic.maxReplicas: lower minReplicas or "
            "raise maxReplicas",
            field_path=".minReplicas",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.replicasMultipleOf) || (self.minReplicas % self.replicasMultipleOf == 0 && "
            "self.maxReplicas % self.replicasMultipleOf == 0)",
            "spec.elastic.minReplicas and spec.elastic.maxReplicas must be multiples of "
            "spec.elastic.replicasMultipleOf: every size the gang takes is one",
            field_path=".replicasMultipleOf",
            reason="FieldValueInvalid",
        ),
    )
    min_replicas: int = api_field(
        "The smallest gang that may train: the job is admitted once this many pods fit.",
        required=True, default=1, minimum=1, maximum=MAX_REPLICAS,
    )  # fmt: skip
    max_replicas: int = api_field(
        "The largest gang: it grows to this (or to spec.replicas when set) as room appears.",
        required=True, default=1, minimum=1, maximum=MAX_REPLICAS,
    )  # fmt: skip
    replicas_multiple_of: int | None = api_field(
        "Every size the gang takes is a multiple of this (the room is rounded down to one): sizes the "
        "trainer can use, say ones that divide data.globalBatchSize and fit tp x pp (docs/elastic.md).",
        minimum=1, maximum=MAX_REPLICAS,
    )  # fmt: skip


@dataclass
class Scheduling:
    """How the gang is scheduled."""

    provider: str = api_field(
        "builtin: the operator admits whole gangs (scheduling gates); volcano or coscheduling: a PodGroup "
        "for that scheduler; none: plain pods.",
        default="builtin",
        enum=("builtin", "volcano", "coscheduling", "none"),
    )
    gang: Gang = api_field("Gang settings.", factory=Gang, default={})
    priority_class_name: str | None = api_field("PriorityClass of the pods.", max_length=253)
    queue: str | None = api_field("Queue name (Volcano queue; informational for builtin).", max_length=253)
    topology: Topology | None = api_field(
        "builtin provider only: keep the gang within domains of a node label; ranks are consecutive "
        "per domain.",
    )
    expected_run_seconds: int | None = api_field(
        "How long the job runs once started, at most (builtin provider): with it the gang may start "
        "early on room a blocked gang holds idle, when it ends before that gang can start; and, while "
        "its first attempt runs, a gang waiting for its nodes is admitted up to 2 s before it ends.",
        minimum=1, maximum=31_536_000,
    )  # fmt: skip


@dataclass
class RunPolicy:
    """Restarts, deadlines, clean-up and suspension."""

    backoff_limit: int = api_field(
        "Gang restarts after retryable failures and hangs before the job fails (preemptions are not "
        "counted).",
        default=3, minimum=0, maximum=1000,
    )  # fmt: skip
    active_deadline_seconds: int | None = api_field(
        "Fail the job after running this long (status.startTime; the clock stops while suspended and "
        "restarts on resume, as for batch/v1 Job).",
        minimum=1,
    )
    ttl_seconds_after_finished: int | None = api_field(
        "Delete the job this long after it finished.", minimum=0
    )
    suspend: bool = api_field("true deletes the pods and keeps the job; false resumes it.", default=False)
    termination_grace_period_seconds: int = api_field(
        "SIGTERM-to-SIGKILL time of every pod: the trainer's emergency checkpoint must fit inside.",
        default=60, minimum=1, maximum=3600,
    )  # fmt: skip
    retryable_exit_codes: list[int] | None = api_field(
        "Exit codes 1-127 that are retryable failures rather than permanent ones.", max_items=64,
        extra={"items": {"minimum": 1, "maximum": 127}},
    )  # fmt: skip
    restart_strategy: str = api_field(
        "How a gang recovers when some of its pods are disrupted. FullRestart: every pod is replaced. "
        "InPlace: the pods still running are kept (their resident launchers start the next restart "
        "generation, imports done) and only the lost pods are replaced; the operator falls back to "
        "FullRestart, with an InPlaceFallback event, when that cannot work (docs/reliability.md).",
        default=c.RESTART_STRATEGY_FULL, enum=(c.RESTART_STRATEGY_FULL, c.RESTART_STRATEGY_IN_PLACE),
    )  # fmt: skip
    in_place_launcher: str = api_field(
        "With InPlace, what the trainer container runs. Phalanx: the trainer image (its resident "
        "launcher takes each restart generation from the operator). Torchrun: a plain `torchrun "
        "script.py`; its pods get torchrun's elastic settings (c10d rendezvous on worker-0; the "
        "operator keeps the restart budget) and the agents take the replacement pod in by themselves "
        "(docs/torchrun.md).",
        default=c.IN_PLACE_LAUNCHER_PHALANX, enum=(c.IN_PLACE_LAUNCHER_PHALANX, c.IN_PLACE_LAUNCHER_TORCHRUN),
    )  # fmt: skip
    hang_timeout_seconds: int | None = api_field(
        "Restart the gang (reason Hang) when rank 0 reports no new step for this long; the trainer's "
        "collective timeout is set 30 s above it, at least 600 s. Unset: 20 x the step time, at "
        "least 300 s, and the trainer keeps its own timeout.",
        minimum=10, maximum=86400,
    )  # fmt: skip


# A shape field may change in an update that starts from, or goes to, a suspended job: the pods of the
# running attempt are deleted on suspension, and a resumed job starts a new attempt from the new spec.
# Testing oldSelf is what lets a queue (Kueue) unsuspend and inject node selectors, tolerations,
# affinity or scheduling gates into the template in one update, as batch/v1 Job and JobSet allow.
_SUSPENDED_BEFORE_OR_AFTER = "oldSelf.runPolicy.suspend || self.runPolicy.suspend"
_IMMUTABLE_WHILE_ACTIVE = (
    Rule(
        # Adding or removing replicas is a change too: a job may be stored without it (derived).
        "(has(self.replicas) == has(oldSelf.replicas) && "
        "(!has(self.replicas) || self.replicas == oldSelf.replicas)) || "
        f"{_SUSPENDED_BEFORE_OR_AFTER}",
        "spec.replicas can change only while the job is suspended (set spec.runPolicy.suspend: true first)",
        field_path=".replicas",
    ),
    Rule(
        "(has(self.elastic) == has(oldSelf.elastic) && (!has(self.elastic) || self.elastic == oldSelf.elastic)) "
        f"|| {_SUSPENDED_BEFORE_OR_AFTER}",
        "spec.elastic can change only while the job is suspended (set spec.runPolicy.suspend: true first)",
        field_path=".elastic",
    ),
    Rule(
        "(has(self.procsPerReplica) == has(oldSelf.procsPerReplica) && "
        "(!has(self.procsPerReplica) || self.procsPerReplica == oldSelf.procsPerReplica)) || "
        f"{_SUSPENDED_BEFORE_OR_AFTER}",
        "spec.procsPerReplica can change only while the job is suspended",
        field_path=".procsPerReplica",
    ),
    Rule(
        f"self.resources == oldSelf.resources || {_SUSPENDED_BEFORE_OR_AFTER}",
        "spec.resources can change only while the job is suspended",
        field_path=".resources",
    ),
    Rule(
        f"self.template == oldSelf.template || {_SUSPENDED_BEFORE_OR_AFTER}",
        "spec.template can change only while the job is suspended (nodeSelector, tolerations, affinity "
        "and schedulingGates too: a queue sets them in the update that unsuspends it)",
        field_path=".template",
    ),
    Rule(
        "(has(self.scheduling.topology) == has(oldSelf.scheduling.topology) && "
        "(!has(self.scheduling.topology) || self.scheduling.topology == oldSelf.scheduling.topology)) || "
        f"{_SUSPENDED_BEFORE_OR_AFTER}",
        "spec.scheduling.topology can change only while the job is suspended: the running gang was "
        "placed, and its ranks numbered, by the domains it names",
        field_path=".scheduling.topology",
    ),
    Rule(
        "self.scheduling.provider == oldSelf.scheduling.provider",
        "spec.scheduling.provider cannot change; delete and recreate the job",
        field_path=".scheduling.provider",
    ),
)


@dataclass
class TrainingJobSpec:
    """What to run: a gang of identical pods, each running procsPerReplica training processes."""

    __rules__ = (
        Rule(
            "!has(self.scheduling.gang.minAvailable) || has(self.elastic) || "
            "self.scheduling.gang.minAvailable == (has(self.replicas) ? self.replicas : 1)",
            "spec.scheduling.gang.minAvailable must equal spec.replicas or be left out: WORLD_SIZE is "
            "fixed, so a smaller gang would hold GPUs it cannot train on; for a gang that may run "
            "smaller use spec.elastic.minReplicas",
            field_path=".scheduling.gang.minAvailable",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.elastic) || !has(self.scheduling.gang.minAvailable)",
            "spec.scheduling.gang.minAvailable cannot be set with spec.elastic: remove it, "
            "spec.elastic.minReplicas is the smallest gang",
            field_path=".scheduling.gang.minAvailable",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.elastic) || !has(self.replicas) || "
            "(self.replicas >= self.elastic.minReplicas && self.replicas <= self.elastic.maxReplicas)",
            "spec.replicas must lie within [spec.elastic.minReplicas, spec.elastic.maxReplicas]: "
            "change it, or leave it out (it is then maxReplicas)",
            field_path=".replicas",
            reason="FieldValueInvalid",
        ),
        Rule(
            "!has(self.elastic) || self.scheduling.provider == 'builtin'",
            "spec.elastic needs spec.scheduling.provider builtin: the operator sizes the gang to the "
            "room it finds, which volcano and coscheduling PodGroups cannot follow",
            field_path=".elastic",
            reason="FieldValueForbidden",
        ),
        Rule(
            f"!has(self.elastic) || self.runPolicy.restartStrategy != '{c.RESTART_STRATEGY_IN_PLACE}'",
            "spec.elastic needs spec.runPolicy.restartStrategy FullRestart: a resize changes "
            "WORLD_SIZE, which every rank must restart to learn",
            field_path=".runPolicy.restartStrategy",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.elastic) || !has(self.scheduling.topology) || self.scheduling.topology.mode != 'Required'",
            "spec.elastic cannot be used with spec.scheduling.topology mode Required: an elastic attempt is "
            "sized by the free room, not by what one domain holds; use mode Preferred",
            field_path=".elastic",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.scheduling.topology) || self.scheduling.provider == 'builtin'",
            "spec.scheduling.topology needs spec.scheduling.provider builtin (the operator places the "
            "gang); with volcano or coscheduling use that scheduler's own topology settings",
            field_path=".scheduling.topology",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.scheduling.topology) || !has(self.scheduling.topology.groupSize) || "
            "self.scheduling.topology.mode == 'Required'",
            "spec.scheduling.topology.groupSize needs mode Required (Preferred already packs the gang "
            "into as few domains as it can)",
            field_path=".scheduling.topology.groupSize",
            reason="FieldValueInvalid",
        ),
        Rule(
            f"!has(self.spares) || self.spares == 0 || self.runPolicy.restartStrategy == '{c.RESTART_STRATEGY_IN_PLACE}'",
            f"spec.spares needs spec.runPolicy.restartStrategy {c.RESTART_STRATEGY_IN_PLACE}: a spare takes a "
            f"lost rank only in an in-place restart; set restartStrategy: {c.RESTART_STRATEGY_IN_PLACE} or "
            "remove spec.spares",
            field_path=".spares",
            reason="FieldValueForbidden",
        ),
        Rule(
            f"!has(self.spares) || self.spares == 0 || self.runPolicy.inPlaceLauncher != '{c.IN_PLACE_LAUNCHER_TORCHRUN}'",
            f"spec.spares needs spec.runPolicy.inPlaceLauncher {c.IN_PLACE_LAUNCHER_PHALANX}: a spare is told its "
            "rank by the operator, which torchrun's elastic agent does not take; remove spec.spares",
            field_path=".spares",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.spares) || self.spares == 0 || !has(self.elastic)",
            "spec.spares cannot be used with spec.elastic: an elastic gang resizes by a full restart; "
            "remove one of them",
            field_path=".spares",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.spares) || self.spares == 0 || self.scheduling.provider == 'builtin'",
            "spec.spares needs spec.scheduling.provider builtin: the operator admits the spares with the "
            "gang, which volcano and coscheduling PodGroups do not count",
            field_path=".spares",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.spares) || self.spares == 0 || (has(self.replicas) && self.replicas > 1)",
            "spec.spares needs spec.replicas 2 or more: with one replica the only rank is rank 0, whose "
            "loss always restarts the whole gang (it hosts the rendezvous), so a spare would never take "
            "over; remove spec.spares",
            field_path=".spares",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.spares) || self.spares == 0 || !has(self.scheduling.topology) || "
            "(self.scheduling.topology.mode != 'Required' && !has(self.scheduling.topology.groupSize))",
            "spec.spares cannot be used with spec.scheduling.topology mode Required or groupSize yet: the "
            "spares would be placed apart from the gang, in a domain of their own; use topology mode "
            "Preferred without groupSize, or remove spec.spares",
            field_path=".spares",
            reason="FieldValueForbidden",
        ),
        *_IMMUTABLE_WHILE_ACTIVE,
        Rule(
            "has(self.managedBy) == has(oldSelf.managedBy) && "
            "(!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",
            "spec.managedBy is immutable (set, changed or removed): delete and re-create the job to hand "
            "it to another controller",
            field_path=".managedBy",
        ),
    )
    # No schema default: with spec.elastic it is derived from maxReplicas (__post_init__). Jobs stored
    # before keep the 1 the API server defaulted in.
    replicas: int = api_field(
        "Pods in the gang (nodes); 1 when left out, or spec.elastic.maxReplicas. WORLD_SIZE = replicas x "
        "procsPerReplica; with spec.elastic, the size it grows to (status.currentReplicas is the size "
        "running now).",
        minimum=1, maximum=MAX_REPLICAS,
    )  # fmt: skip
    spares: int = api_field(
        "Warm standby pods (restartStrategy InPlace, replicas 2 or more): created once the workers are "
        "admitted and admitted best effort after them (never holding the workers back), counted against "
        "capacity, each with its resident launcher's imports done and no worker. A lost rank is taken "
        "over by a spare at once and a new spare is created in the background; losing an idle spare "
        "disturbs nobody (docs/reliability.md).",
        default=0, minimum=0, maximum=c.MAX_SPARES,
    )  # fmt: skip
    procs_per_replica: int | None = api_field(
        "Training processes per pod; default resources.gpus when set, else 1.", minimum=1, maximum=64
    )
    resources: Resources = api_field("Accelerators per pod.", factory=Resources, default={})
    template: PodTemplate = api_field("Pod template; its 'trainer' container runs training.", required=True,
                                      factory=PodTemplate, default={})  # fmt: skip
    rendezvous: Rendezvous = api_field("torch.distributed rendezvous.", factory=Rendezvous, default={})
    nccl: Nccl | None = api_field("NCCL environment.")
    checkpoint: Checkpoint = api_field("Checkpoint volume and policy.", factory=Checkpoint, default={})
    scheduling: Scheduling = api_field("Gang scheduling, priority, queue.", factory=Scheduling, default={})
    run_policy: RunPolicy = api_field("Restarts, deadline, TTL, suspend.", factory=RunPolicy, default={})
    managed_by: str | None = api_field(
        f"The controller that runs this job: unset or {c.CONTROLLER_NAME} for this operator; any other "
        "value (a MultiKueue manager's, say) and this operator leaves the job alone. Immutable.",
        max_length=63,
    )
    elastic: Elastic | None = api_field(
        "builtin provider only: let the gang run at any size in [minReplicas, maxReplicas] (docs/elastic.md)."
    )

    def __post_init__(self) -> None:
        if self.replicas is None:
            self.replicas = self.elastic.max_replicas if self.elastic is not None else 1

    @property
    def effective_procs_per_replica(self) -> int:
        if self.procs_per_replica is not None:
            return self.procs_per_replica
        if self.resources.gpus:
            return self.resources.gpus
        return 1

    @property
    def world_size(self) -> int:
        return self.replicas * self.effective_procs_per_replica

    @property
    def min_available(self) -> int:
        """Every replica: admission refuses a smaller minAvailable (a job stored before that rule
        existed is still ganged whole, since its trainer needs every rank)."""
        return self.replicas


@dataclass
class Condition:
    """A metav1.Condition."""

    type: str = api_field("Condition type.", required=True, default="")
    status: str = api_field("True, False or Unknown.", required=True, default="Unknown",
                            enum=("True", "False", "Unknown"))  # fmt: skip
    reason: str = api_field("Machine-readable CamelCase reason.", default="")
    message: str = api_field("What a person should know.", default="")
    last_transition_time: str | None = api_field("When status last changed (RFC 3339).")
    observed_generation: int | None = api_field("spec generation this condition reflects.")


@dataclass
class Restarts:
    """Gang restarts by cause."""

    failures: int = api_field("Restarts after retryable failures (count against backoffLimit).", default=0)
    preemptions: int = api_field(
        "Restarts after preemption, eviction or node loss (do not count).", default=0
    )
    hangs: int = api_field(
        "Restarts after no step came within the hang bound (count against backoffLimit with failures).",
        default=0,
    )
    # No default (as resizes): only jobs in a Kueue queue have it.
    requeues: int | None = api_field(
        "Kueue: restarts after an eviction other than a preemption (PodsReadyTimeout, AdmissionCheck, a "
        "stopped queue, deactivation; do not count)."
    )
    # No default: the API server would add it to every job's status, elastic or not.
    resizes: int | None = api_field("spec.elastic: restarts to grow the gang at a checkpoint (do not count).")


@dataclass
class ReplicaCounts:
    """Pods of the current attempt by state."""

    active: int = api_field("Pods created and not finished.", default=0)
    ready: int = api_field("Pods Running and Ready.", default=0)
    succeeded: int = api_field("Pods that exited 0.", default=0)
    failed: int = api_field("Pods that failed.", default=0)


@dataclass
class BadNode:
    """A node on which this job's pods failed for reasons of the infrastructure (policy/bad_nodes.py)."""

    node: str | None = api_field("The node's name.")
    failures: int | None = api_field("Infrastructure failures of this job's pods there.")
    reasons: list[str] | None = api_field(
        "NodeLost, DeviceError or Hang, newest last (at most 4).", max_items=4
    )
    last_failure_time: str | None = api_field("When the newest one was booked (RFC 3339).")
    avoided_until: str | None = api_field(
        "At 2 failures: the job's next pods keep off the node until this time (RFC 3339)."
    )


@dataclass
class StragglerRank:
    """A rank the trainer reports slower than its peers (docs/trainer.md "Stragglers")."""

    rank: int | None = api_field("Global rank.")
    pod: str | None = api_field("The pod it runs in.")
    node: str | None = api_field("The node that pod runs on.")
    ratio: str | None = api_field(
        "Its data wait + forward time over the other ranks' median when first reported (text)."
    )
    steps: int | None = api_field("Logged steps in a row it had been over the factor when first reported.")


@dataclass
class AdmissionRecord:
    """Who admitted the gang: the built-in gang admission, or Kueue through the job's Workload."""

    by: str = api_field("Builtin or Kueue.", enum=("Builtin", "Kueue"), required=True)
    cluster_queue: str | None = api_field(
        "The Kueue ClusterQueue whose quota the gang holds.", max_length=253
    )
    workload: str | None = api_field("The job's Kueue Workload.", max_length=253)
    waited_seconds: int | None = api_field(
        "Seconds the gang waited for this admission (Kueue: since it was queued or requeued).", minimum=0
    )


@dataclass
class LastCheckpoint:
    """The newest complete checkpoint the trainer reported."""

    step: int | None = api_field("Training step of the checkpoint.")
    time: str | None = api_field("When it was committed (RFC 3339), by the trainer's clock.")
    observed_time: str | None = api_field(
        "When the operator first saw it (RFC 3339, the operator's clock): what an elastic gang's "
        "growth compares with admittedTime."
    )


@dataclass
class ElasticCap:
    """After an elastic attempt was torn down for not starting (GangTimeout, CreateRefused): the room
    it was sized from was not real, so the next attempts stay below it for a while."""

    replicas: int | None = api_field("The largest size a new attempt may take until `until`.")
    until: str | None = api_field("When the cap lifts (RFC 3339); the gang does not grow before then.")


@dataclass
class Progress:
    """Training progress read from the trainer's /progress endpoint."""

    step: int | None = api_field("Current step.")
    total_steps: int | None = api_field("Steps to run.")
    percent: int | None = api_field("step / totalSteps in percent.")
    eta_seconds: int | None = api_field("Estimated seconds to finish.")
    loss: str | None = api_field("Latest loss (as text, to keep the schema integer-only).")
    tokens_per_second: str | None = api_field("Throughput (as text).")


# Milliseconds of a long wait, device-seconds of a big gang: past int32 within weeks.
INT64: Final = {"format": "int64"}


@dataclass
class RecoveryPhases:
    """Milliseconds from the disruption to the end of each phase of a recovery."""

    pods_stopped: int | None = api_field(
        "The old attempt's pods are gone (SIGTERM checkpoint saved).", extra=INT64
    )
    pods_running: int | None = api_field("Every pod of the new attempt runs.", extra=INT64)
    rendezvous_done: int | None = api_field(
        "The trainer's process group is up (reported by the trainer).", extra=INT64
    )
    state_restored: int | None = api_field("The checkpoint is loaded (reported by the trainer).", extra=INT64)
    first_step: int | None = api_field("The first training step of the new attempt is done.", extra=INT64)


@dataclass
class LastRecovery:
    """The timeline of the newest gang restart, from the disruption to the first step."""

    attempt: int | None = api_field("The attempt that recovers.")
    reason: str | None = api_field("Why the gang restarted: Preempted, FailureRestart or a node's loss.")
    path: str | None = api_field(
        "How it recovers: FullRestart (every pod replaced), InPlace (only the lost pods replaced) or "
        "InPlaceSpare (in place, a warm spare taking the lost rank: no pod replaced)."
    )
    disrupted_time: str | None = api_field("When the operator saw the disruption (RFC 3339, milliseconds).")
    phases_milliseconds: RecoveryPhases | None = api_field("When each phase ended, since disruptedTime.")
    step_at_disruption: int | None = api_field(
        "The last step the trainer had reported when it was disrupted."
    )
    resumed_from_step: int | None = api_field("The checkpoint step the new attempt resumed from (trainer).")
    summary: str | None = api_field("The total and the phases in one line, once the first step is done.")
    trainer_reported: bool | None = api_field(
        "False when the trainer reported no start-up times: the timeline then ends at podsRunning."
    )


@dataclass
class GoodputRemainders:
    """Device-milliseconds below one device-second, per total, carried to the next booking."""

    allocated: int | None = api_field("Of allocatedSeconds.")
    productive: int | None = api_field("Of productiveSeconds.")
    waiting_for_admission: int | None = api_field("Of waitingForAdmissionSeconds.")
    startup: int | None = api_field("Of startupSeconds.")
    recovery: int | None = api_field("Of recoverySeconds.")
    redone_steps: int | None = api_field("Of redoneStepsSeconds.")
    checkpoint_stalls: int | None = api_field("Of checkpointStallsSeconds.")
    standby_spares: int | None = api_field("Of standbySparesSeconds.")


@dataclass
class Goodput:
    """Device time of the gang since the job was created, and the share of it that trained."""

    ratio: str | None = api_field(
        "Productive device time / (devices x wall time since creation + standbySparesSeconds), 0 to 1 (as text)."
    )
    unit: str | None = api_field(
        "What is counted: the accelerator resource, or cpu when the pods ask for none."
    )
    devices: str | None = api_field(
        "How many of `unit` the whole gang holds (replicas x per pod; its spares are counted apart)."
    )
    allocated_seconds: int | None = api_field(
        "Device-seconds the gang's pods held their devices.", extra=INT64
    )
    productive_seconds: int | None = api_field("Device-seconds of kept training steps.", extra=INT64)
    waiting_for_admission_seconds: int | None = api_field(
        "Device-seconds waited before the first admission.", extra=INT64
    )
    startup_seconds: int | None = api_field(
        "Device-seconds from admission to the first step of the first attempt.", extra=INT64
    )
    recovery_seconds: int | None = api_field(
        "Device-seconds from each disruption to the first step after it.", extra=INT64
    )
    redone_steps_seconds: int | None = api_field(
        "Device-seconds of steps trained, lost at a restart, and redone.", extra=INT64
    )
    checkpoint_stalls_seconds: int | None = api_field(
        "Device-seconds the training loop waited for saves.", extra=INT64
    )
    standby_spares_seconds: int | None = api_field(
        "Device-seconds warm spares (spec.spares) held standing by: counted as allocated, never as productive.",
        extra=INT64,
    )
    remainder_milliseconds: GoodputRemainders | None = api_field(
        "The fraction of each total below one device-second (bookkeeping: short stalls add up)."
    )
    accounted_time: str | None = api_field("Booked up to this time (RFC 3339, milliseconds).")
    step_milliseconds: int | None = api_field("The newest step time the trainer reported (for redone steps).")
    stalls_reported: str | None = api_field(
        "attempt:seconds of checkpoint stalls already booked (bookkeeping)."
    )


@dataclass
class KeptPod:
    """A pod of an earlier attempt that the in-place attempt keeps."""

    name: str = api_field("Pod name.", required=True, default="")
    uid: str = api_field("Pod uid: a pod recreated under the name is not the kept one.", required=True,
                         default="")  # fmt: skip
    rank: int | None = api_field(
        "A warm spare taking a lost rank: the replica index it takes (absent for a pod that keeps its own)."
    )


@dataclass
class ReplacedPod:
    """A replacement the in-place attempt deleted before it ran, to create it again elsewhere."""

    name: str = api_field("Pod name.", required=True, default="")
    uid: str = api_field("Pod uid: the pod created again under the name is the attempt's own.", required=True,
                         default="")  # fmt: skip


@dataclass
class Spares:
    """spec.spares: the warm standby pods."""

    desired: int | None = api_field("spec.spares.")
    ready: int | None = api_field("Spares running idle, ready to take a rank.")
    summary: str | None = api_field("ready/desired, for `kubectl get`.")
    pods: list[str] | None = api_field("The idle spares' names.", max_items=c.MAX_SPARES)
    message: str | None = api_field(
        "Why fewer spares stand by than asked for, if known: the API server refused one (quota), the "
        "workers are not admitted yet, or spares are ignored (Kueue)."
    )
    failures: int | None = api_field(
        "Spares lost while standing by, or refused, in a row (reset once all are ready): the backoff."
    )
    next_create_time: str | None = api_field(
        "No spare is created before then (RFC 3339): the backoff after a spare lost or refused."
    )


@dataclass
class InPlace:
    """The attempt that restarts in place, and the pods it keeps (they count as its own)."""

    attempt: int | None = api_field("The in-place attempt (the restart generation its pods run).")
    kept_pods: list[KeptPod] | None = api_field("The running pods kept from the disrupted attempt.")
    time: str | None = api_field("When the in-place restart began (RFC 3339).")
    replaced_pods: list[ReplacedPod] | None = api_field(
        "Replacements deleted before they ran, their admitted node having stopped taking pods: no "
        "longer the attempt's pods; each is created again and placed anew."
    )
    stop: str | None = api_field(
        "How the kept pods stop their workers: checkpoint (a preemption: every rank agrees on a step "
        "and saves) or now (a failure: the lost rank can agree on nothing; the newest checkpoint is "
        "loaded).",
        enum=("checkpoint", "now"),
    )


@dataclass
class TrainingJobStatus:
    """Observed state, written by the operator only."""

    phase: str | None = api_field(
        "Pending, Admitted, Running, Restarting, Succeeded, Failed or Suspended.",
        enum=("Pending", "Admitted", "Running", "Restarting", "Succeeded", "Failed", "Suspended"),
    )
    conditions: list[Condition] | None = api_field(
        "Admitted, PodsCreated, Preempted, Running, Restarting, Succeeded, Failed, Suspended, with reasons.",
        extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    attempt: int | None = api_field("Current attempt: 0 first, +1 on every gang restart.")
    restarts: Restarts | None = api_field("Restarts by cause.")
    replicas: ReplicaCounts | None = api_field("Pods of the current attempt by state.")
    current_replicas: int | None = api_field(
        "The gang's size in the current attempt: spec.replicas, or with spec.elastic the size it was "
        "admitted at (WORLD_SIZE = currentReplicas x procsPerReplica)."
    )
    ready_summary: str | None = api_field("ready/replicas, for `kubectl get`.")
    start_time: str | None = api_field(
        "When the job started running; reset on resume. activeDeadlineSeconds counts from it."
    )
    completion_time: str | None = api_field("When the job finished.")
    admitted_time: str | None = api_field("When the current attempt was admitted.")
    requeue_after: str | None = api_field(
        "The current attempt may not be admitted before this time (backoff)."
    )
    gang_timeouts: int | None = api_field("Times the gang was torn down for not starting in time.")
    created_attempt: int | None = api_field("The attempt whose pods have all been created.")
    elastic_cap: ElasticCap | None = api_field(
        "spec.elastic: the size cap after an attempt was torn down for not starting (absent otherwise)."
    )
    elastic_unusable_sizes: list[int] | None = api_field(
        "spec.elastic: sizes (pods) whose world size the trainer could not split (it exited 78); sizing "
        "and growth skip them.",
        max_items=c.MAX_UNUSABLE_SIZES,
    )
    sized_attempt: int | None = api_field(
        "The attempt currentReplicas was chosen for: recorded before its first pod is created, so the "
        "size is not chosen again while its pods are not seen yet."
    )
    admission_message: str | None = api_field("Why the gang waits for admission (builtin provider).")
    admission: AdmissionRecord | None = api_field(
        "Who admitted the current attempt's gang (Builtin or Kueue), from which ClusterQueue, after how long."
    )
    last_checkpoint: LastCheckpoint | None = api_field("Newest checkpoint reported by the trainer.")
    progress: Progress | None = api_field("Training progress.")
    last_recovery: LastRecovery | None = api_field("Timeline of the newest gang restart.")
    in_place: InPlace | None = api_field(
        "spec.runPolicy.restartStrategy InPlace: the current attempt's kept pods (absent otherwise)."
    )
    spares: Spares | None = api_field("spec.spares: the warm standby pods (absent without spares).")
    goodput: Goodput | None = api_field("Goodput and device time by cause (kept up to date while it runs).")
    bad_nodes: list[BadNode] | None = api_field(
        "Nodes this job's pods failed on for reasons of the infrastructure; avoided at 2 failures.",
        max_items=16,
    )
    stragglers: list[StragglerRank] | None = api_field(
        "Ranks of the running attempt slower than their peers (the Straggler condition).", max_items=8
    )
    observed_generation: int | None = api_field("spec generation last acted on.")
    message: str | None = api_field("The latest condition's message, for a quick look.")


@dataclass
class TrainingJob:
    """A distributed training job: a gang of pods that runs, is preempted and recovers as one."""

    __rules__ = (
        Rule(
            f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
            f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters: pods are named "
            "<name>-worker-<index> and must fit a 63-character DNS label",
            reason="FieldValueInvalid",
        ),
        Rule(
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "metadata.name must start with a letter and hold only lowercase letters, digits and '-': "
            "it names the job's headless Service (a DNS-1035 label)",
            reason="FieldValueInvalid",
        ),
    )
    api_version: str | None = api_field("phalanx.dev/v1alpha1", json_name="apiVersion")
    kind: str | None = api_field("TrainingJob")
    metadata: dict[str, Any] | None = api_field("Standard object metadata.", extra={"type": "object"})
    spec: TrainingJobSpec = api_field("Desired state.", required=True, factory=TrainingJobSpec, default={})
    status: TrainingJobStatus | None = api_field("Observed state.")
