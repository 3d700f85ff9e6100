#!/usr/bin/env bash
# Builds Argo CD (one binary for every component, chosen with ARGOCD_BINARY_NAME) into a cache outside the
# checkout. go.mod pins the version and go.sum its checksums; the build runs inside a copy of the module's
# own tree, where its go.mod's replace directives apply (they would not from a `tool` block). Its CRDs
# (manifests/crds) are copied into `crds/` beside the bin dir, for the rig to apply, and the repo server's
# and application controller's workload manifests into `workloads/`, whose environment (from argocd-cm
# and argocd-cmd-params-cm) the rig gives its processes; none of it is checked in.
# The cache directory, its key and --print-bin-dir are ../go-build.sh's.
#
#   tools/argocd/build.sh                 build once, then reuse; prints the bin dir last
#   tools/argocd/build.sh --print-bin-dir print where the binary lives (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="argocd"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/argocd"
first_time="~13 min cold (longer on busy shared cores), ~1 GB of Go module and build cache; the binary is ~200 MB"
module="github.com/argoproj/argo-cd/v3"
# What go-build.sh's main() checks for a complete bin dir.
binaries=("argocd|./cmd")

# go-build.sh's build_all compiles packages of the pinning module; this one compiles inside Argo CD's.
build_argocd() {
  local bin_dir="$1" start_all=${SECONDS} version tree
  version="$(module_version "${module}")"
  mkdir -p "${cache_root}"
  # Built beside the target so the final rename is atomic; removed if anything fails.
  staging="$(mktemp -d "${cache_root}/.tmp.XXXXXX")"
  trap 'rm -rf "${staging}"' EXIT
  echo "==> ${label}: building Argo CD ${version} (every component in one binary)"
  echo "    into ${bin_dir}"
  echo "    (first time only: ${first_time})"
  # Checked against go.sum here, then copied: the module cache is read-only.
  (cd "${here}" && go mod download "${module}")
  tree="$(cd "${here}" && go list -m -f '{{.Dir}}' "${module}")"
  cp -r "${tree}" "${staging}/src"
  chmod -R u+w "${staging}/src"
  (cd "${staging}/src" && go mod download)
  echo "    modules ready in $((SECONDS - start_all)) s"
  # The -X values are what Argo CD's Makefile sets; without them it reports version 99.99.99.
  (cd "${staging}/src" && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X ${module}/common.version=${version#v} -X ${module}/common.gitTag=${version}" \
    -o "${staging}/bin/argocd" ./cmd)
  rm -rf "${staging}/src"
  mkdir -p "$(dirname "${bin_dir}")"
  # Readers see either no directory or a complete one; a concurrent build that finished first wins.
  mv -T "${staging}/bin" "${bin_dir}" 2>/dev/null || [[ -x "${bin_dir}/argocd" ]]
  echo "==> ${label}: done in $((SECONDS - start_all)) s ($(du -sh "${bin_dir}" | cut -f1))"
}

# The CRDs and the two workloads of the pinned release, beside the bin dir; staged and renamed, like the binary.
install_manifests() {
  local bin_dir="$1" tree staged
  tree="$(cd "${here}" && go list -m -f '{{.Dir}}' "${module}")/manifests"
  if [[ ! -d "${bin_dir}/../crds" ]]; then
    staged="$(mktemp -d "${cache_root}/.crds.XXXXXX")"
    cp "${tree}"/crds/*-crd.yaml "${staged}/"
    publish "${staged}" "${bin_dir}/../crds"
  fi
  if [[ ! -d "${bin_dir}/../workloads" ]]; then
    staged="$(mktemp -d "${cache_root}/.workloads.XXXXXX")"
    cp "${tree}/base/repo-server/argocd-repo-server-deployment.yaml" \
      "${tree}/base/application-controller/argocd-application-controller-statefulset.yaml" "${staged}/"
    publish "${staged}" "${bin_dir}/../workloads"
  fi
}

publish() {
  chmod 755 "$1"
  chmod 644 "$1"/*.yaml
  mv -T "$1" "$2" 2>/dev/null || rm -rf "$1"
}

run() {
  main "$@"
  if [[ $# -eq 0 ]]; then
    install_manifests "$(main --print-bin-dir)"
  fi
}

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"
# go-build.sh's main() builds with build_all: here that is Argo CD's own build.
build_all() { build_argocd "$@"; }
# Everything runs from functions, parsed in full before this line runs: editing the scripts while a
# build is under way cannot change what that build does.
run "$@"
