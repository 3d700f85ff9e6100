#!/usr/bin/env bash
# Builds the Prometheus server the autoscaling tests scrape the engine pods with (go.mod's `tool` line)
# into a cache outside the checkout; the building itself is ../go-build.sh. Built without its web UI's
# assets (the `builtinassets` tag): the tests use only the HTTP API.
#
#   tools/prometheus/build.sh                 build once, then reuse; prints the bin dir last
#   tools/prometheus/build.sh --print-bin-dir print where the binary lives (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="prometheus"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/prometheus"
first_time="~6.5 min on 2 cores with the Go build cache other tools left (~11 min of CPU), ~1 GB of Go module and build cache"
tags=""

# name|package: the output binary and the package it is built from.
binaries=(
  "prometheus|github.com/prometheus/prometheus/cmd/prometheus"
)

prepare() {
  version="$(module_version github.com/prometheus/prometheus)"
  # The module's v0.MMPP.P tags stand for a release the module's VERSION file names (v0.316.0 is 3.16.0).
  # Downloaded first: a module not yet in the module cache (a fresh machine) has no directory to read.
  (cd "${here}" && go mod download github.com/prometheus/prometheus)
  release="$(cat "$(cd "${here}" && go list -m -f '{{.Dir}}' github.com/prometheus/prometheus)/VERSION")"
  building="prometheus ${release} (${version})"
}

# Without this it reports no version.
ldflags_for() { echo "-X github.com/prometheus/common/version.Version=${release}"; }

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"
# Everything runs from functions, parsed in full before this line runs: editing the scripts while a
# build is under way cannot change what that build does.
main "$@"
