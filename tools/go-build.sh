# Shared by tools/kube, tools/node and tools/s3 build.sh (sourced, never run): builds the binaries a
# pinned go.mod names into a content-keyed cache outside the checkout.
#
# The sourcing script sets `here` (its directory), `label`, `cache_root`, `binaries` ("name|package"),
# `tags` (Go build tags, may be empty) and `first_time` (what a first build costs), and defines
# `prepare` (sets `building`, what is built, and whatever `ldflags_for` needs) and `ldflags_for NAME`.
#
# The cache key hashes go.mod, go.sum, both scripts and the Go version, so changing a pin (or the way
# a binary is built) builds into a new directory and never mixes versions.

go_build_script="${BASH_SOURCE[0]}"

cache_key() {
  { cat "${here}/go.mod" "${here}/go.sum" "${here}/build.sh" "${go_build_script}"; go env GOVERSION; } |
    sha256sum | cut -c1-16
}

module_version() { (cd "${here}" && go list -m -f '{{.Version}}' "$1"); }

build_all() {
  local bin_dir="$1"
  prepare
  mkdir -p "${cache_root}"
  # Built beside the target so the final rename is atomic; removed if anything fails.
  staging="$(mktemp -d "${cache_root}/.tmp.XXXXXX")"
  trap 'rm -rf "${staging}"' EXIT

  echo "==> ${label}: building ${building}"
  echo "    into ${bin_dir}"
  echo "    (first time only: ${first_time})"
  local start_all=${SECONDS} start entry name
  # Fetch every module first, so the per-binary lines below are not interleaved with download notes.
  echo "    fetching modules ..."
  (cd "${here}" && CGO_ENABLED=0 go list -tags "${tags}" -deps "${binaries[@]#*|}" >/dev/null)
  echo "    modules ready in $((SECONDS - start_all)) s"
  for entry in "${binaries[@]}"; do
    name="${entry%%|*}"
    start=${SECONDS}
    printf '    %-24s ' "${name}"
    (cd "${here}" && CGO_ENABLED=0 go build -trimpath -tags "${tags}" -ldflags "-s -w $(ldflags_for "${name}")" \
      -o "${staging}/bin/${name}" "${entry#*|}")
    echo "built in $((SECONDS - start)) s"
  done

  # Readers see either no directory or a complete one; a concurrent build that finished first wins.
  mkdir -p "$(dirname "${bin_dir}")"
  mv -T "${staging}/bin" "${bin_dir}" 2>/dev/null || [[ -x "${bin_dir}/${binaries[0]%%|*}" ]]
  echo "==> ${label}: done in $((SECONDS - start_all)) s ($(du -sh "${bin_dir}" | cut -f1))"
}

main() {
  if ! command -v go >/dev/null; then
    echo "error: Go 1.26+ is needed to build the ${label} (tools/${here##*/}/go.mod); install the golang toolchain" >&2
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
    echo "==> ${label}: cached in ${bin_dir}"
  else
    build_all "${bin_dir}"
  fi
  echo "${bin_dir}"
}
