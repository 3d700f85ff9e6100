#!/usr/bin/env bash
# Installs the Debian packages in debian-packages.txt that are missing; does nothing when all are there.
# apt-get update runs once, and only when something is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "${here}/debian-packages.txt" | grep -v '^$')

missing=()
for package in "${wanted[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "${package}" 2>/dev/null || true)"
  [[ "${status}" == installed ]] || missing+=("${package}")
done

if ((${#missing[@]} == 0)); then
  echo "==> node packages: all ${#wanted[@]} installed"
  exit 0
fi
if ((EUID != 0)); then
  echo "error: missing Debian packages: ${missing[*]}" >&2
  echo "       install them as root (sudo make packages, or apt-get install ${missing[*]})" >&2
  exit 1
fi
start=${SECONDS}
echo "==> node packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "==> node packages: done in $((SECONDS - start)) s"
