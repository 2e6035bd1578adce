#!/usr/bin/env bash
# Installs the Debian packages the lab and the tests need, if any is missing. Idempotent; needs root.
set -euo pipefail
pkgs=(slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin gcc make python3-venv procps nginx-light openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "rebound: missing Debian packages: ${missing[*]}" >&2
  echo "rebound: run this as root (sudo make ...), or install them first: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "rebound: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
