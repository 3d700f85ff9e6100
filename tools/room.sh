#!/usr/bin/env bash
# Checks, before the first long step of `make test` or `make demo`, that the disk holding the cache has room for
# what the run still has to install and build, and says in one line what to delete when it has not.
#
# Each figure is what that step holds at its peak, measured on a fresh machine (docs/development.md, "What a
# first run costs"): the venvs with uv's cache, the Go tools' build (three at a time, each with caches of its own
# that go when it is built: tools/go-scratch.sh), the engine image's first build while it commits its
# dependencies' layer, and the real node's copy of the images.
set -euo pipefail

cache="${NEURONFLEET_CACHE:-${HOME}/.cache/neuronfleet}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "${cache}"

need=0
why=()
add() { need=$((need + $1)); why+=("$2: $1 GB"); }
[[ -f "${root}/.venv/.synced" ]] || add 14 "venv and uv's cache"
# `make demo` names the tools it builds (ROOM_TOOLS) and needs no compat venv (ROOM_COMPAT=no).
if [[ "${ROOM_COMPAT:-yes}" != no ]]; then
  [[ -f "${root}/compat/vllm-0.29/.venv/.synced" ]] || add 5 "vLLM 0.29's venv"
fi
missing_tools=0
for tool in ${ROOM_TOOLS:-kube node s3 dra prometheus keda argocd gie envoy}; do
  [[ -d "$(NEURONFLEET_CACHE="${cache}" "${root}/tools/${tool}/build.sh" --print-bin-dir 2>/dev/null)" ]] ||
    missing_tools=$((missing_tools + 1))
done
((missing_tools == 0)) || add 15 "${missing_tools} Go tools to build"
[[ -f "${cache}/images/layout/index.json" ]] || add 35 "the images and the node's copy"
add 5 "room to run the suites"

free=$(($(df --output=avail -B1 "${cache}" | tail -n 1) / 1000000000))
if ((free < need)); then
  echo "error: this run needs about ${need} GB free under ${cache} ($(IFS=,; echo "${why[*]}" | sed "s/,/, /g")), there are ${free} GB;" \
    "delete Go's caches (go clean -cache -modcache), uv's (uv cache clean) or old builds under ${cache}" >&2
  exit 2
fi
echo "==> room: ${free} GB free under ${cache}, this run needs about ${need} GB ($(IFS=,; echo "${why[*]}" | sed "s/,/, /g"))"
