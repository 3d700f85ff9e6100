#!/usr/bin/env bash
# Builds the real node's pinned tools (go.mod's `tool` block: containerd, its runc shim, ctr, crictl)
# into a cache outside the checkout; the building itself is ../go-build.sh. kubelet and kube-proxy come
# from tools/kube (the same Kubernetes module as the control plane).
#
#   tools/node/build.sh                 build once, then reuse; prints the bin dir last
#   tools/node/build.sh --print-bin-dir print where the binaries live (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="node tools"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/node-tools"
first_time="~5 min on 2 cores, ~1 GB of Go module and build cache"
# The node stores images on overlayfs; these snapshotters need cgo libraries or kernel modules it lacks.
tags="no_btrfs no_devmapper no_zfs"

# name|package: the output binary and the package it is built from.
binaries=(
  "containerd|github.com/containerd/containerd/v2/cmd/containerd"
  "containerd-shim-runc-v2|github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
  "ctr|github.com/containerd/containerd/v2/cmd/ctr"
  "crictl|sigs.k8s.io/cri-tools/cmd/crictl"
)

prepare() {
  local containerd_version crictl_version
  containerd_version="$(module_version github.com/containerd/containerd/v2)"
  crictl_version="$(module_version sigs.k8s.io/cri-tools)"
  building="containerd ${containerd_version}, crictl ${crictl_version}"
  # Without these the binaries report an empty version (the kubelet shows it as the runtime's version).
  containerd_ldflags="-X github.com/containerd/containerd/v2/version.Version=${containerd_version}"
  containerd_ldflags+=" -X github.com/containerd/containerd/v2/version.Revision=gomod"
  crictl_ldflags="-X sigs.k8s.io/cri-tools/pkg/version.Version=${crictl_version}"
}

ldflags_for() {
  case "$1" in
    crictl) echo "${crictl_ldflags}" ;;
    *) echo "${containerd_ldflags}" ;;
  esac
}

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"
# Everything runs from functions, parsed in full before this line runs: editing the scripts while a
# build is under way cannot change what that build does.
main "$@"
