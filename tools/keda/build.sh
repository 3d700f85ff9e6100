#!/usr/bin/env bash
# Builds the KEDA operator and its metrics adapter (go.mod's `tool` block) into a cache outside the
# checkout; the building itself is ../go-build.sh. KEDA's CRDs come from the same pinned module: they are
# copied from the Go module cache into `crds/` beside the bin dir, for the tests to apply (never checked in).
#
#   tools/keda/build.sh                 build once, then reuse; prints the bin dir last
#   tools/keda/build.sh --print-bin-dir print where the binaries live (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="keda"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/keda"
first_time="~11 min on 2 cores with the Go build cache other tools left (~15 min of CPU), ~1.5 GB of Go module and build cache"
tags=""

# name|package: the output binary and the package it is built from.
binaries=(
  "keda-operator|github.com/kedacore/keda/v2/cmd/operator"
  "keda-adapter|github.com/kedacore/keda/v2/cmd/adapter"
)

prepare() {
  version="$(module_version github.com/kedacore/keda/v2)"
  building="KEDA ${version} (operator, metrics adapter)"
}

# Without this it reports version "main".
ldflags_for() { echo "-X github.com/kedacore/keda/v2/version.Version=${version#v}"; }

# The CRDs of the pinned release, beside the bin dir; staged and renamed, like the binaries.
install_crds() {
  local target="$1/../crds" source staged
  [[ -d "${target}" ]] && return
  source="$(cd "${here}" && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)/config/crd/bases"
  staged="$(mktemp -d "${cache_root}/.crds.XXXXXX")"
  cp "${source}"/*.yaml "${staged}/"
  chmod 755 "${staged}"
  chmod 644 "${staged}"/*.yaml
  mv -T "${staged}" "${target}" 2>/dev/null || rm -rf "${staged}"
}

run() {
  main "$@"
  if [[ $# -eq 0 ]]; then
    install_crds "$(main --print-bin-dir)"
  fi
}

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"
# Everything runs from functions, parsed in full before this line runs: editing the scripts while a
# build is under way cannot change what that build does.
run "$@"
