#!/usr/bin/env bash
# Checks (and, as root on Debian or Ubuntu, installs) the system packages that `make demo` and
# `make test` need beyond the README's requirements, before any long step starts.
#
#   libnss-wrapper  the development node resolves pod DNS names (name.svc.cluster.local) through it
#
# Not root: prints one line with the exact command to run and exits 1.
set -euo pipefail

# package -> a file it installs, so the check needs no dpkg (the file is what the node preloads)
# (Debian's multiarch directory, as phalanx/devnode/preflight.py looks for it)
declare -A PROVIDES=(
  [libnss-wrapper]="/usr/lib/$(uname -m)-linux-gnu/libnss_wrapper.so"
)

missing=()
for pkg in "${!PROVIDES[@]}"; do
  [[ -e "${PROVIDES[$pkg]}" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

install_cmd="apt-get update && apt-get install -y ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "system-deps: missing ${missing[*]} (the development node needs them); run: sudo sh -c '${install_cmd}'" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "system-deps: missing ${missing[*]}; this is not a Debian-like system, install them with your package manager" >&2
  exit 1
fi
echo "system-deps: installing ${missing[*]} (apt-get)" >&2
log=$(mktemp -t phalanx-system-deps.XXXXXX)
if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >"$log" 2>&1; then
  echo "system-deps: apt-get could not install ${missing[*]}; see $log, then run: ${install_cmd}" >&2
  exit 1
fi
rm -f "$log"
for pkg in "${missing[@]}"; do
  [[ -e "${PROVIDES[$pkg]}" ]] || { echo "system-deps: ${pkg} installed but ${PROVIDES[$pkg]} is absent" >&2; exit 1; }
done
echo "system-deps: installed ${missing[*]}" >&2
