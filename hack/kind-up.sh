#!/usr/bin/env bash
# Phalanx on kind, for machines with a Docker engine:
#   create the cluster from kind/cluster.yaml (1 control plane + 2 workers), build both images,
#   load them into the nodes, install the chart, submit an example TrainingJob and wait for it.
#
#   hack/kind-up.sh [EXAMPLE.yaml]      # default: examples/quickstart.yaml
#   hack/kind-up.sh --dry-run [...]     # print the commands instead of running them
#
# Environment: KIND_CLUSTER_NAME (phalanx), PHALANX_IMAGE_TAG (dev), PHALANX_NAMESPACE
# (phalanx-system), KIND, DOCKER, HELM, KUBECTL (binaries; helm falls back to hack/cluster-bin.sh's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi
EXAMPLE="${1:-examples/quickstart.yaml}"
CLUSTER="${KIND_CLUSTER_NAME:-phalanx}"
TAG="${PHALANX_IMAGE_TAG:-dev}"
NAMESPACE="${PHALANX_NAMESPACE:-phalanx-system}"
OPERATOR_IMAGE="phalanx-operator:${TAG}"
TRAINER_IMAGE="phalanx-trainer:${TAG}"
KIND="${KIND:-kind}"
DOCKER="${DOCKER:-docker}"
KUBECTL="${KUBECTL:-kubectl}"
HELM="${HELM:-}"
if [[ -z "$HELM" ]]; then
  if command -v helm >/dev/null; then HELM=helm; else HELM="$(bash hack/cluster-bin.sh --print-dir)/helm"; fi
fi
CONTEXT="kind-${CLUSTER}"

log() { printf '[kind-up] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
run() {
  if (( DRY_RUN )); then printf '%q ' "$@"; printf '\n'; else "$@"; fi
}
need() {  # need BINARY HINT
  command -v "$1" >/dev/null && return 0
  if (( DRY_RUN )); then log "warning: $1 not found ($2)"; else die "$1 not found: $2"; fi
}

need "$DOCKER" "kind runs its nodes as Docker containers; install Docker"
need "$KIND" "go install sigs.k8s.io/kind@v0.33.0"
need "$KUBECTL" "bash hack/cluster-bin.sh builds one into $(bash hack/cluster-bin.sh --print-dir)"
need "$HELM" "bash hack/cluster-bin.sh builds one"
[[ -f "$EXAMPLE" ]] || (( DRY_RUN )) || die "example $EXAMPLE not found"
if (( ! DRY_RUN )); then
  "$DOCKER" info >/dev/null 2>&1 || die "the Docker engine is not running (kind cannot create nodes without it)"
fi

if (( ! DRY_RUN )) && "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "kind cluster $CLUSTER exists; reusing it"
else
  log "creating kind cluster $CLUSTER"
  run "$KIND" create cluster --name "$CLUSTER" --config kind/cluster.yaml --wait 180s
fi

log "building $OPERATOR_IMAGE and $TRAINER_IMAGE"
run "$DOCKER" build --tag "$OPERATOR_IMAGE" --file Dockerfile .
run "$DOCKER" build --tag "$TRAINER_IMAGE" --file trainer-image/Dockerfile trainer-image
run "$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"

log "installing the chart into $NAMESPACE"
run "$HELM" upgrade --install phalanx charts/phalanx \
  --kube-context "$CONTEXT" --namespace "$NAMESPACE" --create-namespace \
  --set image.repository=phalanx-operator --set image.tag="$TAG" --set image.pullPolicy=Never \
  --wait --timeout 5m

log "submitting $EXAMPLE with image $TRAINER_IMAGE"
if (( DRY_RUN )); then
  echo "sed 's#image: .*phalanx-trainer.*#image: ${TRAINER_IMAGE}#' $EXAMPLE | $KUBECTL --context $CONTEXT apply -f -"
  exit 0
fi
job="$(sed "s#image: .*phalanx-trainer.*#image: ${TRAINER_IMAGE}#" "$EXAMPLE" \
  | "$KUBECTL" --context "$CONTEXT" apply -f - -o name | grep -m1 trainingjob)"
log "waiting for $job to succeed (kubectl --context $CONTEXT get trainingjobs -w to follow)"
"$KUBECTL" --context "$CONTEXT" wait "$job" --for=jsonpath='{.status.phase}'=Succeeded --timeout=20m
log "done: $job Succeeded"
