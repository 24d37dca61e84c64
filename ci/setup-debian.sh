#!/usr/bin/env bash
# Installs the Debian 12 packages tcpx-lab needs to build and test: hwloc and udev headers for
# tcpx-topo (hwlocality), pkg-config to find them, chromium for the report's browser test,
# iproute2 (ip, tc) for the emulated fabric's namespace tests.
# Safe to run again: installs only what is missing.
set -euo pipefail
PACKAGES=(pkg-config libhwloc-dev libudev-dev chromium iproute2)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "==> installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
