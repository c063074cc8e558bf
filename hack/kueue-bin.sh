#!/usr/bin/env bash
# Builds Kueue's manager from its Go module into a cache outside the repo, with the module's CRDs and
# webhook manifests beside it, so the local cluster can run a real Kueue (phalanx dev up --kueue).
#
#   $PHALANX_CACHE/kueue-<version>/bin/kueue        the manager (sigs.k8s.io/kueue/cmd/kueue)
#   $PHALANX_CACHE/kueue-<version>/crd/              config/components/crd of the same module (bases/
#                                                    and the conversion-webhook patches it lists)
#   $PHALANX_CACHE/kueue-<version>/webhook/manifests.yaml   config/components/webhook/manifests.yaml
#
# sigs.k8s.io/kueue's go.mod has no replace directives, so `go install pkg@version` builds it as
# released (its own go.mod picks every dependency). Set PHALANX_KUEUE_DIR to a directory with the
# same layout to skip the build entirely.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
CACHE="${PHALANX_CACHE:-$HOME/.cache/phalanx}"
KEY="kueue-${KUEUE_VERSION}"
DIR="${CACHE}/${KEY}"

# Prints the first missing piece of a layout, nothing when the layout is whole.
missing_piece() {
  local d=$1
  [[ -x "$d/bin/kueue" ]] || { echo "bin/kueue"; return; }
  compgen -G "$d/crd/bases/*.yaml" >/dev/null || { echo "crd/bases/*.yaml"; return; }
  [[ -s "$d/crd/kustomization.yaml" ]] || { echo "crd/kustomization.yaml"; return; }
  [[ -s "$d/webhook/manifests.yaml" ]] || { echo "webhook/manifests.yaml"; return; }
}

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "${PHALANX_KUEUE_DIR:-$DIR}"; exit 0
fi

if [[ -n "${PHALANX_KUEUE_DIR:-}" ]]; then
  gap=$(missing_piece "${PHALANX_KUEUE_DIR}")
  [[ -z "$gap" ]] || { echo "PHALANX_KUEUE_DIR=${PHALANX_KUEUE_DIR} lacks $gap" >&2; exit 1; }
  echo "${PHALANX_KUEUE_DIR}"; exit 0
fi

if [[ -z "$(missing_piece "$DIR")" ]]; then echo "kueue ${KUEUE_VERSION} cached in ${DIR}" >&2; echo "${DIR}"; exit 0; fi

command -v go >/dev/null || { echo "go is required to build Kueue (or set PHALANX_KUEUE_DIR)" >&2; exit 1; }
command -v flock >/dev/null || { echo "flock (util-linux) is required to build Kueue" >&2; exit 1; }
mkdir -p "${DIR}"
# One build at a time per cache: a second caller waits here, then finds the build done.
exec 9>"${DIR}/.lock"
if ! flock -n 9; then
  echo "[kueue-bin] another build into ${DIR} is running; waiting for it" >&2
  flock 9
fi
if [[ -z "$(missing_piece "$DIR")" ]]; then echo "kueue ${KUEUE_VERSION} cached in ${DIR}" >&2; echo "${DIR}"; exit 0; fi

START=$(date +%s)
log() { printf '[kueue-bin %4ss] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }

# Prints a progress line every 100 packages compiled (go install -v names each package it builds).
progress() {
  local n=0
  while IFS= read -r line; do
    n=$((n + 1))
    if (( n % 100 == 0 )); then log "kueue: $n packages compiled"; fi
    # compiler messages only (a package path such as k8s.io/.../errors is not one)
    case "$line" in *.go:[0-9]*|*cannot\ *|*undefined:*|go:\ *) echo "$line" >&2;; esac
  done
  log "kueue: $n packages compiled"
}

# Everything is assembled in STAGE and moved into DIR piece by piece, each piece only once whole.
STAGE="${DIR}/stage"
rm -rf "${STAGE}" && mkdir -p "${STAGE}/bin"
log "building Kueue ${KUEUE_VERSION} into ${DIR} (missing: $(missing_piece "$DIR"))"
log "resolving sigs.k8s.io/kueue@${KUEUE_VERSION}"
# GOFLAGS=-mod=... is refused by `go install pkg@version`; the module's own go.mod decides instead.
SRC=$(env -u GOFLAGS go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
[[ -d "$SRC/config/components/crd/bases" ]] || { log "FAILED: no config/components/crd/bases in ${SRC:-the module}"; exit 1; }
mkdir -p "${STAGE}/webhook"
cp -r "$SRC/config/components/crd" "${STAGE}/crd"
cp "$SRC/config/components/webhook/manifests.yaml" "${STAGE}/webhook/"
chmod -R u+w "${STAGE}"  # the module cache is read-only; the cache copy may be replaced later
for piece in crd webhook; do rm -rf "${DIR:?}/$piece"; mv "${STAGE}/$piece" "${DIR}/$piece"; done

if [[ ! -x "${DIR}/bin/kueue" ]]; then
  log "compiling sigs.k8s.io/kueue/cmd/kueue (the long part)"
  ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}"
  (env -u GOFLAGS GOBIN="${STAGE}/bin" CGO_ENABLED=0 \
    go install -v -trimpath -buildvcs=false -ldflags "$ldflags" "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}" 2>&1) | progress
  [[ -x "${STAGE}/bin/kueue" ]] || { log "FAILED: go install produced no kueue binary"; exit 1; }
  mkdir -p "${DIR}/bin"
  mv -f "${STAGE}/bin/kueue" "${DIR}/bin/kueue"
fi
rm -rf "${STAGE}"
gap=$(missing_piece "$DIR")
[[ -z "$gap" ]] || { log "FAILED: ${DIR} lacks $gap"; exit 1; }
log "done: kueue ${KUEUE_VERSION} in ${DIR}"
echo "${DIR}"
