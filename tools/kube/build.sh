#!/usr/bin/env bash
# Builds the pinned control-plane tools and the real node's kubelet and kube-proxy (go.mod's `tool`
# block) into a cache outside the checkout; the building itself is ../go-build.sh.
#
#   tools/kube/build.sh                 build once, then reuse; prints the bin dir last
#   tools/kube/build.sh --print-bin-dir print where the binaries live (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="kube tools"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/kube-tools"
first_time="~20 min on 2 cores, ~5 GB of Go module and build cache"
tags=""

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

prepare() {
  local kube_version helm_version kwok_version helm_k8s_minor kube_major kube_minor pkg
  kube_version="$(module_version k8s.io/kubernetes)"
  helm_version="$(module_version helm.sh/helm/v3)"
  kwok_version="$(module_version sigs.k8s.io/kwok)"
  helm_k8s_minor="$(module_version k8s.io/client-go | cut -d. -f2)"
  IFS=. read -r kube_major kube_minor _ <<<"${kube_version#v}"
  building="Kubernetes ${kube_version}, etcd, kwok ${kwok_version}, helm ${helm_version}"

  # Without these the binaries report v0.0.0, and version-gated clients (helm's kubeVersion checks) misbehave.
  kube_ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X ${pkg}.gitVersion=${kube_version} -X ${pkg}.gitMajor=${kube_major}"
    kube_ldflags+=" -X ${pkg}.gitMinor=${kube_minor} -X ${pkg}.gitTreeState=clean"
  done
  helm_ldflags="-X helm.sh/helm/v3/internal/version.version=${helm_version}"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${helm_k8s_minor}"
  done
  kwok_ldflags="-X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version}"
}

ldflags_for() {
  case "$1" in
    kube-* | kubectl | kubelet) echo "${kube_ldflags}" ;;
    helm) echo "${helm_ldflags}" ;;
    kwok) echo "${kwok_ldflags}" ;;
    *) echo "" ;;
  esac
}

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"
# Everything runs from functions, parsed in full before this line runs: editing the scripts while a
# build is under way cannot change what that build does.
main "$@"
