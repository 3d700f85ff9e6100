#!/usr/bin/env bash
# Builds the S3-compatible server the tests run (versitygw, go.mod's `tool` line) into a cache outside
# the checkout. Its posix backend keeps buckets as directories and objects as files.
#
#   tools/s3/build.sh                 build once, then reuse; prints the bin dir last
#   tools/s3/build.sh --print-bin-dir print where the binary lives (built or not) and exit
#
# The cache key hashes go.mod, go.sum, this script and the Go version, so changing the pin (or the
# way it is built) builds into a new directory and never mixes versions.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}/s3-tools"
package="github.com/versity/versitygw/cmd/versitygw"

cache_key() {
  { cat "${here}/go.mod" "${here}/go.sum" "${here}/build.sh"; go env GOVERSION; } | sha256sum | cut -c1-16
}

build_all() {
  local bin_dir="$1" version start_all=${SECONDS}
  version="$(cd "${here}" && go list -m -f '{{.Version}}' github.com/versity/versitygw)"

  mkdir -p "${cache_root}"
  # Built beside the target so the final rename is atomic; removed if anything fails.
  staging="$(mktemp -d "${cache_root}/.tmp.XXXXXX")"
  trap 'rm -rf "${staging}"' EXIT

  echo "==> s3 tools: building versitygw ${version}"
  echo "    into ${bin_dir}"
  echo "    (first time only: ~5 min on 2 cores, ~0.5 GB of Go module and build cache)"
  # Without these it reports version "git".
  (cd "${here}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.Version=${version} -X main.Build=gomod" \
    -o "${staging}/bin/versitygw" "${package}")

  # Readers see either no directory or a complete one; a concurrent build that finished first wins.
  mkdir -p "$(dirname "${bin_dir}")"
  mv -T "${staging}/bin" "${bin_dir}" 2>/dev/null || [[ -x "${bin_dir}/versitygw" ]]
  echo "==> s3 tools: done in $((SECONDS - start_all)) s ($(du -sh "${bin_dir}" | cut -f1))"
}

main() {
  if ! command -v go >/dev/null; then
    echo "error: Go 1.26+ is needed to build the S3 server (tools/s3/go.mod); install the golang toolchain" >&2
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
    echo "==> s3 tools: cached in ${bin_dir}"
  else
    build_all "${bin_dir}"
  fi
  echo "${bin_dir}"
}

# Everything runs from functions, parsed in full before the first line runs: editing this file
# while a build is under way cannot change what that build does.
main "$@"
