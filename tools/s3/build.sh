#!/usr/bin/env bash
# Builds the S3-compatible server the tests run (versitygw, go.mod's `tool` line) into a cache outside
# the checkout; the building itself is ../go-build.sh. Its posix backend keeps buckets as directories
# and objects as files.
#
#   tools/s3/build.sh                 build once, then reuse; prints the bin dir last
#   tools/s3/build.sh --print-bin-dir print where the binary lives (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="s3 tools"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/s3-tools"
first_time="~5 min on 2 cores, ~0.5 GB of Go module and build cache"
tags=""

# name|package: the output binary and the package it is built from.
binaries=(
  "versitygw|github.com/versity/versitygw/cmd/versitygw"
)

prepare() {
  version="$(module_version github.com/versity/versitygw)"
  building="versitygw ${version}"
}

# Without these it reports version "git".
ldflags_for() { echo "-X main.Version=${version} -X main.Build=gomod"; }

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"
# Everything runs from functions, parsed in full before this line runs: editing the scripts while a
# build is under way cannot change what that build does.
main "$@"
