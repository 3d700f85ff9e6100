#!/usr/bin/env bash
# Times the stages of `make test` and prints them as one table at the end, so every run shows where
# its minutes went and which of them came from a cache.
#
#   tools/stages.sh run NAME CACHED_REGEX COMMAND...  run COMMAND (output passed through), record its
#                                                     wall time, and "cache" when its output matched
#                                                     CACHED_REGEX ("-" for stages that have no cache)
#   tools/stages.sh note NAME FROM                    record NAME as taking no time, unless it ran
#                                                     (a make target that was up to date: FROM "cache")
#   tools/stages.sh table                             print the recorded stages, their sum, and the wall
#                                                     time since the reset (stages run side by side
#                                                     with make -j overlap, so the sum exceeds it)
#   tools/stages.sh reset                             forget them (the start of a run)
#
# The record is the file $NEURONFLEET_STAGES (one tab-separated line a stage), which the Makefile sets;
# with NEURONFLEET_STAGE_PREFIX set, each output line starts with it in brackets (for make -j).
set -uo pipefail

record="${NEURONFLEET_STAGES:?NEURONFLEET_STAGES names the file the stages are recorded in}"

now() { date +%s.%N; }

run() {
  local name="$1" cached="$2" output start rc source
  shift 2
  output="$(mktemp)"
  start="$(now)"
  if [[ -n "${NEURONFLEET_STAGE_PREFIX:-}" ]]; then
    # Stages built side by side (make -j): each line says whose it is.
    "$@" 2>&1 | tee "${output}" | sed -u "s/^/[${NEURONFLEET_STAGE_PREFIX}] /"
  else
    "$@" 2>&1 | tee "${output}"
  fi
  rc=${PIPESTATUS[0]}
  source="built"
  if [[ "${cached}" == "-" ]]; then
    source="-"
  elif grep -qE -- "${cached}" "${output}"; then
    source="cache"
  fi
  [[ ${rc} -eq 0 ]] || source="FAILED (exit ${rc})"
  rm -f "${output}"
  printf '%s\t%s\t%s\n' "${name}" "$(awk -v a="${start}" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }')" \
    "${source}" >>"${record}"
  return "${rc}"
}

note() {
  cut -f1 "${record}" 2>/dev/null | grep -qxF -- "$1" || printf '%s\t0\t%s\n' "$1" "$2" >>"${record}"
}

table() {
  [[ -s "${record}" ]] || return 0
  awk -F'\t' '
    function clock(s) { return sprintf("%d:%02d", int(s / 60), s % 60) }
    BEGIN { printf "\n%-28s %8s  %s\n", "stage", "wall", "from" }
    { printf "%-28s %8s  %s\n", $1, clock($2), $3; total += $2 }
    END { printf "%-28s %8s  %s\n", "sum of the stages", clock(total), "(those built side by side overlap)" }
  ' "${record}"
  if [[ -s "${record}.start" ]]; then
    awk -v a="$(cat "${record}.start")" -v b="$(now)" \
      'BEGIN { s = b - a; printf "%-28s %8s\n", "wall, start to end", sprintf("%d:%02d", int(s / 60), s % 60) }'
  fi
}

case "${1:-}" in
  run)
    shift
    [[ $# -ge 3 ]] || { echo "usage: $0 run NAME CACHED_REGEX COMMAND..." >&2; exit 2; }
    run "$@"
    ;;
  note)
    [[ $# -eq 3 ]] || { echo "usage: $0 note NAME FROM" >&2; exit 2; }
    note "$2" "$3"
    ;;
  table) table ;;
  reset) rm -f "${record}" && now >"${record}.start" ;;
  *)
    echo "usage: $0 run NAME CACHED_REGEX COMMAND... | table | reset" >&2
    exit 2
    ;;
esac
