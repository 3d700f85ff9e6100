#!/usr/bin/env bash
# Builds the real node's pinned tools (go.mod's `tool` block: containerd, its runc shim, ctr, crictl)
# into a cache outside the checkout. kubelet and kube-proxy come from tools/kube (the same Kubernetes
# module as the control plane).
#
#   tools/node/build.sh                 build once, then reuse; prints the bin dir last
#   tools/node/build.sh --print-bin-dir print where the binaries live (built or not) and exit
#
# The cache key hashes go.mod, go.sum, this script and the Go version, so changing a pin (or the
# way a binary is built) builds into a new directory and never mixes versions.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/node-tools"

# name|package: the output binary and the package it is built from.
binaries=(
  "containerd|github.com/containerd/containerd/v2/cmd/containerd"
  "containerd-shim-runc-v2|github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
  "ctr|github.com/containerd/containerd/v2/cmd/ctr"
  "crictl|sigs.k8s.io/cri-tools/cmd/crictl"
)

cache_key() {
  { cat "${here}/go.mod" "${here}/go.sum" "${here}/build.sh"; go env GOVERSION; } | sha256sum | cut -c1-16
}

module_version() { (cd "${here}" && go list -m -f '{{.Version}}' "$1"); }

build_all() {
  local bin_dir="$1"
  local containerd_version crictl_version
  containerd_version="$(module_version github.com/containerd/containerd/v2)"
  crictl_version="$(module_version sigs.k8s.io/cri-tools)"

  # Without these the binaries report an empty version (the kubelet shows it as the runtime's version).
  local containerd_ldflags crictl_ldflags
  containerd_ldflags="-X github.com/containerd/containerd/v2/version.Version=${containerd_version}"
  containerd_ldflags+=" -X github.com/containerd/containerd/v2/version.Revision=gomod"
  crictl_ldflags="-X sigs.k8s.io/cri-tools/pkg/version.Version=${crictl_version}"
  # The node stores images on overlayfs; these snapshotters need cgo libraries or kernel modules it lacks.
  local tags="no_btrfs no_devmapper no_zfs"

  mkdir -p "${cache_root}"
  # Built beside the target so the final rename is atomic; removed if anything fails.
  staging="$(mktemp -d "${cache_root}/.tmp.XXXXXX")"
  trap 'rm -rf "${staging}"' EXIT

  echo "==> node tools: building containerd ${containerd_version}, crictl ${crictl_version}"
  echo "    into ${bin_dir}"
  echo "    (first time only: ~5 min on 2 cores, ~1 GB of Go module and build cache)"
  local start_all=${SECONDS} start entry name extra
  echo "    fetching modules ..."
  (cd "${here}" && CGO_ENABLED=0 go list -tags "${tags}" -deps "${binaries[@]#*|}" >/dev/null)
  echo "    modules ready in $((SECONDS - start_all)) s"
  for entry in "${binaries[@]}"; do
    name="${entry%%|*}"
    case "${name}" in
      crictl) extra="${crictl_ldflags}" ;;
      *) extra="${containerd_ldflags}" ;;
    esac
    start=${SECONDS}
    printf '    %-24s ' "${name}"
    (cd "${here}" && CGO_ENABLED=0 go build -trimpath -tags "${tags}" -ldflags "-s -w ${extra}" \
      -o "${staging}/bin/${name}" "${entry#*|}")
    echo "built in $((SECONDS - start)) s"
  done

  # Readers see either no directory or a complete one; a concurrent build that finished first wins.
  mkdir -p "$(dirname "${bin_dir}")"
  mv -T "${staging}/bin" "${bin_dir}" 2>/dev/null || [[ -x "${bin_dir}/crictl" ]]
  echo "==> node tools: done in $((SECONDS - start_all)) s ($(du -sh "${bin_dir}" | cut -f1))"
}

main() {
  if ! command -v go >/dev/null; then
    echo "error: Go 1.26+ is needed to build the node tools (tools/node/go.mod); install the golang toolchain" >&2
    exit 1
  fi
  local bin_dir
  bin_dir="${cache_root}/$(cache_key)/bin"
  case "${1:-}" in
    --print-bin-dir)
      echo "${bin_dir}"
      return
      ;;
    "") ;;
    *)
      echo "usage: $0 [--print-bin-dir]" >&2
      exit 2
      ;;
  esac
  if [[ -d "${bin_dir}" ]]; then
    echo "==> node tools: cached in ${bin_dir}"
  else
    build_all "${bin_dir}"
  fi
  echo "${bin_dir}"
}

# Everything runs from functions, parsed in full before the first line runs: editing this file
# while a build is under way cannot change what that build does.
main "$@"
