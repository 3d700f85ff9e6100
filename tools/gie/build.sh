#!/usr/bin/env bash
# Builds the Gateway API Inference Extension's Endpoint Picker into a cache outside the checkout: GIE's
# cmd/epp runner with our scorer registered (epp/, vetted, tested and built as cmd/neuronfleet-epp inside GIE's
# tree), and copies GIE's CRDs (config/crd/bases: the InferencePool, and the objectives and rewrites the picker
# also watches) into `crds/` beside the bin dir, for the rig; none of it is checked in. The build runs inside a
# copy of the module's own tree with GOWORK=off: its zip carries a go.work naming folders the zip lacks.
# The cache directory, its key and --print-bin-dir are ../go-build.sh's.
#
#   tools/gie/build.sh                 build once, then reuse; prints the bin dir last
#   tools/gie/build.sh --print-bin-dir print where the binary lives (built or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="endpoint picker"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/gie"
first_time="~7 min cold (longer on busy shared cores), ~1 GB of Go module and build cache; the binary is ~85 MB"
module="sigs.k8s.io/gateway-api-inference-extension"
# What go-build.sh's main() checks for a complete bin dir.
binaries=("epp|./cmd/neuronfleet-epp")

# go-build.sh's build_all compiles packages of the pinning module; this one compiles inside GIE's.
build_epp() {
  local bin_dir="$1" start_all=${SECONDS} version tree
  version="$(module_version "${module}")"
  mkdir -p "${cache_root}"
  # Built beside the target so the final rename is atomic; removed if anything fails.
  staging="$(mktemp -d "${cache_root}/.tmp.XXXXXX")"
  trap 'rm -rf "${staging}"' EXIT
  echo "==> ${label}: building the GIE ${version} Endpoint Picker"
  echo "    into ${bin_dir}"
  echo "    (first time only: ${first_time})"
  # Checked against go.sum here, then copied: the module cache is read-only.
  (cd "${here}" && go mod download "${module}")
  tree="$(cd "${here}" && go list -m -f '{{.Dir}}' "${module}")"
  cp -r "${tree}" "${staging}/src"
  chmod -R u+w "${staging}/src"
  (cd "${staging}/src" && GOWORK=off go mod download)
  echo "    modules ready in $((SECONDS - start_all)) s"
  cp -r "${here}/epp" "${staging}/src/cmd/neuronfleet-epp"
  (cd "${staging}/src" && GOWORK=off go vet ./cmd/neuronfleet-epp && GOWORK=off go test ./cmd/neuronfleet-epp)
  (cd "${staging}/src" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "${staging}/bin/epp" ./cmd/neuronfleet-epp)
  rm -rf "${staging}/src"
  mkdir -p "$(dirname "${bin_dir}")"
  # Readers see either no directory or a complete one; a concurrent build that finished first wins.
  mv -T "${staging}/bin" "${bin_dir}" 2>/dev/null || [[ -x "${bin_dir}/epp" ]]
  echo "==> ${label}: done in $((SECONDS - start_all)) s ($(du -sh "${bin_dir}" | cut -f1))"
}

# The CRDs of the pinned release, beside the bin dir; staged and renamed, like the binary.
install_crds() {
  local bin_dir="$1" tree staged
  [[ -d "${bin_dir}/../crds" ]] && return
  # The module's tree: downloaded into this run's scratch module cache (tools/go-scratch.sh) when not there.
  (cd "${here}" && go mod download "${module}")
  tree="$(cd "${here}" && go list -m -f '{{.Dir}}' "${module}")/config/crd/bases"
  staged="$(mktemp -d "${cache_root}/.crds.XXXXXX")"
  cp "${tree}"/inference.networking.*.yaml "${staged}/"
  chmod 755 "${staged}"
  chmod 644 "${staged}"/*.yaml
  mv -T "${staged}" "${bin_dir}/../crds" 2>/dev/null || rm -rf "${staged}"
}

run() {
  main "$@"
  if [[ $# -eq 0 ]]; then
    install_crds "$(main --print-bin-dir)"
  fi
}

# shellcheck source=tools/go-build.sh
source "${here}/../go-build.sh"
# The picker's main and scorer are this directory's own code: their source is part of the key too.
cache_key() {
  { cat "${here}/go.mod" "${here}/go.sum" "${here}/build.sh" "${here}"/epp/*.go "${go_build_script}"; go env GOVERSION; } |
    sha256sum | cut -c1-16
}
# go-build.sh's main() builds with build_all: here that is the picker's own build.
build_all() { build_epp "$@"; }
# Everything runs from functions, parsed in full before this line runs: editing the scripts while a
# build is under way cannot change what that build does.
run "$@"
