#!/usr/bin/env bash
# Builds the pinned control-plane tools and the real node's kubelet and kube-proxy (go.mod's `tool`
# block) into a cache outside the checkout.
#
#   tools/kube/build.sh                 build once, then reuse; prints the bin dir last
#   tools/kube/build.sh --print-bin-dir print where the binaries live (built or not) and exit
#
# The cache key hashes go.mod, go.sum, this script and the Go version, so changing a pin (or the
# way a binary is built) builds into a new directory and never mixes versions.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/kube-tools"

# name|package: the output binary and the package it is built from.
binaries=(
  "etcd|go.etcd.io/etcd/server/v3"
  "kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler|k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl|k8s.io/kubernetes/cmd/kubectl"
  "kubelet|k8s.io/kubernetes/cmd/kubelet"
  "kube-proxy|k8s.io/kubernetes/cmd/kube-proxy"
  "kwok|sigs.k8s.io/kwok/cmd/kwok"
  "helm|helm.sh/helm/v3/cmd/helm"
)

cache_key() {
  { cat "${here}/go.mod" "${here}/go.sum" "${here}/build.sh"; go env GOVERSION; } | sha256sum | cut -c1-16
}

module_version() { (cd "${here}" && go list -m -f '{{.Version}}' "$1"); }

build_all() {
  local bin_dir="$1"
  local kube_version helm_version kwok_version helm_k8s_minor kube_major kube_minor
  kube_version="$(module_version k8s.io/kubernetes)"
  helm_version="$(module_version helm.sh/helm/v3)"
  kwok_version="$(module_version sigs.k8s.io/kwok)"
  helm_k8s_minor="$(module_version k8s.io/client-go | cut -d. -f2)"
  IFS=. read -r kube_major kube_minor _ <<<"${kube_version#v}"

  # Without these the binaries report v0.0.0, and version-gated clients (helm's kubeVersion checks) misbehave.
  local kube_ldflags="" helm_ldflags kwok_ldflags pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X ${pkg}.gitVersion=${kube_version} -X ${pkg}.gitMajor=${kube_major}"
    kube_ldflags+=" -X ${pkg}.gitMinor=${kube_minor} -X ${pkg}.gitTreeState=clean"
  done
  helm_ldflags="-X helm.sh/helm/v3/internal/version.version=${helm_version}"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${helm_k8s_minor}"
  done
  kwok_ldflags="-X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version}"

  mkdir -p "${cache_root}"
  # Built beside the target so the final rename is atomic; removed if anything fails.
  staging="$(mktemp -d "${cache_root}/.tmp.XXXXXX")"
  trap 'rm -rf "${staging}"' EXIT

  echo "==> kube tools: building Kubernetes ${kube_version}, etcd, kwok ${kwok_version}, helm ${helm_version}"
  echo "    into ${bin_dir}"
  echo "    (first time only: ~20 min on 2 cores, ~5 GB of Go module and build cache)"
  local start_all=${SECONDS} start entry name extra
  # Fetch every module first, so the per-binary lines below are not interleaved with download notes.
  echo "    fetching modules ..."
  (cd "${here}" && CGO_ENABLED=0 go list -deps "${binaries[@]#*|}" >/dev/null)
  echo "    modules ready in $((SECONDS - start_all)) s"
  for entry in "${binaries[@]}"; do
    name="${entry%%|*}"
    case "${name}" in
      kube-* | kubectl | kubelet) extra="${kube_ldflags}" ;;
      helm) extra="${helm_ldflags}" ;;
      kwok) extra="${kwok_ldflags}" ;;
      *) extra="" ;;
    esac
    start=${SECONDS}
    printf '    %-24s ' "${name}"
    (cd "${here}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w ${extra}" -o "${staging}/bin/${name}" "${entry#*|}")
    echo "built in $((SECONDS - start)) s"
  done

  # Readers see either no directory or a complete one; a concurrent build that finished first wins.
  mkdir -p "$(dirname "${bin_dir}")"
  mv -T "${staging}/bin" "${bin_dir}" 2>/dev/null || [[ -x "${bin_dir}/helm" ]]
  echo "==> kube tools: done in $((SECONDS - start_all)) s ($(du -sh "${bin_dir}" | cut -f1))"
}

main() {
  if ! command -v go >/dev/null; then
    echo "error: Go 1.26+ is needed to build the kube tools (tools/kube/go.mod); install the golang toolchain" >&2
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
    echo "==> kube tools: cached in ${bin_dir}"
  else
    build_all "${bin_dir}"
  fi
  echo "${bin_dir}"
}

# Everything runs from functions, parsed in full before the first line runs: editing this file
# while a build is under way cannot change what that build does.
main "$@"
