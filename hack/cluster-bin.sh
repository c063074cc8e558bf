#!/usr/bin/env bash
# Builds the local cluster's binaries from Go modules into a cache outside the repo.
#
#   kube-apiserver, kube-scheduler, kube-controller-manager, kubectl  (k8s.io/kubernetes)
#   etcd (go.etcd.io/etcd/server/v3), kwok (sigs.k8s.io/kwok), helm (helm.sh/helm/v3)
#
# k8s.io/kubernetes and etcd's server module carry replace directives pointing into their own
# source trees, so `go install pkg@version` refuses them.  A throw-away wrapper module requires
# the release and maps every such directory replace onto the published module of the same release.
#
# The cache is keyed by version: $PHALANX_CACHE/k8s-<version>/bin.  Set PHALANX_CLUSTER_BIN to a
# directory holding all seven binaries to skip the build entirely.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${PHALANX_CACHE:-$HOME/.cache/phalanx}"
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
BIN="${CACHE}/${KEY}/bin"
WORK="${CACHE}/${KEY}/src"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok helm)

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "${PHALANX_CLUSTER_BIN:-$BIN}"; exit 0
fi

if [[ -n "${PHALANX_CLUSTER_BIN:-}" ]]; then
  for b in "${BINARIES[@]}"; do
    [[ -x "${PHALANX_CLUSTER_BIN}/$b" ]] || { echo "PHALANX_CLUSTER_BIN=${PHALANX_CLUSTER_BIN} lacks $b" >&2; exit 1; }
  done
  echo "${PHALANX_CLUSTER_BIN}"; exit 0
fi

# helm's offline default Kubernetes version is set at link time; a helm built without it (an older
# recipe) renders charts as if for v1.20.0, so it counts as missing until this stamp is there.
K8S_MINOR=$(echo "${K8S_VERSION#v}" | cut -d. -f2)
HELM_KUBE_STAMP="${BIN}/.helm-kube-1.${K8S_MINOR}"
missing=()
for b in "${BINARIES[@]}"; do [[ -x "${BIN}/$b" ]] || missing+=("$b"); done
if [[ -x "${BIN}/helm" && ! -e "${HELM_KUBE_STAMP}" ]]; then missing+=(helm); fi
if [[ ${#missing[@]} -eq 0 ]]; then echo "cluster binaries cached in ${BIN}" >&2; echo "${BIN}"; exit 0; fi

command -v go >/dev/null || { echo "go is required to build the cluster binaries (or set PHALANX_CLUSTER_BIN)" >&2; exit 1; }
mkdir -p "${BIN}" "${WORK}"
# One build at a time per cache: a second `make` (another checkout, a parallel test run) waits here,
# then finds the binaries and builds nothing.
exec 9>"${CACHE}/${KEY}/.lock"
if ! flock -n 9; then
  echo "[cluster-bin] another build into ${BIN} is running; waiting for it" >&2
  flock 9
fi
missing=()
for b in "${BINARIES[@]}"; do [[ -x "${BIN}/$b" ]] || missing+=("$b"); done
if [[ -x "${BIN}/helm" && ! -e "${HELM_KUBE_STAMP}" ]]; then missing+=(helm); fi
if [[ ${#missing[@]} -eq 0 ]]; then echo "cluster binaries cached in ${BIN}" >&2; echo "${BIN}"; exit 0; fi
# Each binary is linked into OUT and moved into BIN only once whole, so BIN never holds a partial one.
OUT="${WORK}/out"
rm -rf "${OUT}" && mkdir -p "${OUT}"
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
START=$(date +%s)

# Moves a freshly linked binary into BIN; fails (and stops the script) when the build produced none.
install_bin() {
  [[ -x "${OUT}/$1" ]] || { log "FAILED: go build produced no ${1}"; exit 1; }
  mv -f "${OUT}/$1" "${BIN}/$1"
}

log() { printf '[cluster-bin %4ss] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }

# Prints a progress line every 100 packages compiled (go build -v names each package it builds).
progress() {
  local label=$1 n=0
  while IFS= read -r line; do
    n=$((n + 1))
    if (( n % 100 == 0 )); then log "$label: $n packages compiled"; fi
    case "$line" in *error*|*cannot*|*undefined*|*.go:*) echo "$line" >&2;; esac
  done
  log "$label: $n packages compiled"
}

# staging_replaces MODFILE MINOR -> replace lines mapping ./staging/src/k8s.io/X onto k8s.io/X v0.MINOR.PATCH
wrapper_mod() {  # wrapper_mod DIR MODULE VERSION UPSTREAM_GOMOD MAPPING_CMD
  local dir=$1 module=$2 version=$3 upstream=$4
  mkdir -p "$dir"
  {
    echo "module phalanx.dev/clusterbin/$(basename "$dir")"
    echo
    grep -E '^go ' "$upstream"
    echo
    echo "require $module $version"
    echo
  } > "$dir/go.mod"
}

build_kubernetes() {
  local dir="${WORK}/kubernetes" upstream staging_version ldflags
  log "resolving k8s.io/kubernetes@${K8S_VERSION}"
  upstream=$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  wrapper_mod "$dir" k8s.io/kubernetes "${K8S_VERSION}" "$upstream"
  staging_version="v0.${K8S_VERSION#v1.}"
  grep -E '=> \./staging/src/' "$upstream" | while read -r name _arrow _path; do
    echo "replace $name => $name $staging_version"
  done >> "$dir/go.mod"
  local major minor
  major=$(echo "${K8S_VERSION#v}" | cut -d. -f1); minor=$(echo "${K8S_VERSION#v}" | cut -d. -f2)
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$dir" && echo 'package clusterbin' > doc.go && go mod download 2>&1 | tail -3 >&2 || true)
  log "compiling kube-apiserver kube-scheduler kube-controller-manager kubectl (the long part)"
  (cd "$dir" && go build -v -trimpath -ldflags "$ldflags" -o "${OUT}/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl 2>&1) | progress kubernetes
  for b in kube-apiserver kube-scheduler kube-controller-manager kubectl; do install_bin "$b"; done
}

build_etcd() {
  local dir="${WORK}/etcd" upstream
  log "resolving go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
  upstream=$(go mod download -json "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  wrapper_mod "$dir" go.etcd.io/etcd/server/v3 "${ETCD_VERSION}" "$upstream"
  for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
    echo "replace go.etcd.io/etcd/$m => go.etcd.io/etcd/$m ${ETCD_VERSION}" >> "$dir/go.mod"
  done
  (cd "$dir" && echo 'package clusterbin' > doc.go)
  (cd "$dir" && go build -v -trimpath -ldflags "-s -w" -o "${OUT}/etcd" go.etcd.io/etcd/server/v3 2>&1) | progress etcd
  install_bin etcd
}

build_plain() {  # build_plain NAME MODULE PACKAGE VERSION
  local name=$1 module=$2 pkg=$3 version=$4 dir="${WORK}/$1"
  mkdir -p "$dir"
  printf 'module phalanx.dev/clusterbin/%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$name" "$module" "$version" > "$dir/go.mod"
  echo 'package clusterbin' > "$dir/doc.go"
  local ldflags="-s -w"
  if [[ $name == helm ]]; then
    # as helm's own Makefile does, so `helm template` and `helm lint` default to the cluster's version
    ldflags+=" -X helm.sh/helm/v3/internal/version.version=${version}"
    local versioned
    for versioned in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      ldflags+=" -X ${versioned}.k8sVersionMajor=1 -X ${versioned}.k8sVersionMinor=${K8S_MINOR}"
    done
  fi
  [[ $name == kwok ]] && ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=${version}"
  (cd "$dir" && go build -v -trimpath -ldflags "$ldflags" -o "${OUT}/$name" "$pkg" 2>&1) | progress "$name"
  install_bin "$name"
}

log "building into ${BIN} (missing: ${missing[*]})"
[[ -x "${BIN}/etcd" ]] || build_etcd
[[ -x "${BIN}/kwok" ]] || build_plain kwok sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok "${KWOK_VERSION}"
if [[ ! -x "${BIN}/helm" || ! -e "${HELM_KUBE_STAMP}" ]]; then
  build_plain helm helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "${HELM_VERSION}"
  touch "${HELM_KUBE_STAMP}"
fi
if [[ ! -x "${BIN}/kube-apiserver" || ! -x "${BIN}/kubectl" || ! -x "${BIN}/kube-scheduler" || ! -x "${BIN}/kube-controller-manager" ]]; then
  build_kubernetes
fi
for b in "${BINARIES[@]}"; do
  [[ -x "${BIN}/$b" ]] || { log "FAILED: ${BIN}/$b was not produced"; exit 1; }
done
log "done: ${BINARIES[*]} in ${BIN}"
echo "${BIN}"
