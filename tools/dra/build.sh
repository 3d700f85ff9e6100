#!/usr/bin/env bash
# Builds the real node's simulated Neuron DRA kubelet plugin (main.go, against the pinned
# k8s.io/dynamic-resource-allocation) into a cache outside the checkout; the building itself is ../go-build.sh.
#
#   tools/dra/build.sh                 build once, then reuse; prints the bin dir last
#   tools/dra/build.sh --print-bin-dir print where the binary lives (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="dra tools"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/dra-tools"
first_time="~2 min on 2 cores"
tags=""

# name|package: the output binary and the package it is built from.
binaries=(
  "neuron-dra-sim|."
)

prepare() {
  building="neuron-dra-sim (k8s.io/dynamic-resource-allocation $(module_version k8s.io/dynamic-resource-allocation))"
}

ldflags_for() { echo ""; }

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"

# The plugin is this directory's own code: its source is part of the key too. Everything runs from functions,
# parsed in full before `main` runs: editing the scripts while a build is under way cannot change what it does.
cache_key() {
  { cat "${here}/go.mod" "${here}/go.sum" "${here}/build.sh" "${here}/main.go" "${go_build_script}"; go env GOVERSION; } |
    sha256sum | cut -c1-16
}

main "$@"
