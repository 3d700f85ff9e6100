#!/usr/bin/env bash
# Runs a tool's build script (tools/NAME/build.sh) with Go's build and module caches in a directory of its own,
# removed when the script exits: each tool is built once into its content-keyed cache, and nothing reads those
# Go caches again (left in ~/.cache/go-build and ~/go/pkg/mod they took 22 GB, and a fresh machine's image
# build then found too little room).
#
#   tools/go-scratch.sh tools/kube/build.sh [ARGS...]
set -euo pipefail

cache="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}"
mkdir -p "${cache}"
scratch="$(mktemp -d "${cache}/.go-scratch.XXXXXX")"
# Go writes its module cache read-only; -modcacherw lets the removal below delete it.
trap 'rm -rf "${scratch}"' EXIT
export GOCACHE="${scratch}/build" GOMODCACHE="${scratch}/mod" GOFLAGS="${GOFLAGS:+${GOFLAGS} }-modcacherw"
"$@"
