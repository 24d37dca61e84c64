#!/usr/bin/env bash
# Installs the Debian 12 packages tcpx-lab needs to build and test: hwloc and udev headers for
# tcpx-topo (hwlocality), pkg-config to find them, chromium for the report's browser test,
# iproute2 (ip, tc) for the emulated fabric's namespace tests (nftables and iptables for its loss
# fault where the kernel has no sch_netem), python3-venv for the tcpx_lab
# Python package; then a Python venv (target/py-venv, or $TCPX_PY_VENV) with maturin, pytest and
# numpy for that package's tests.
# Safe to run again: installs only what is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PACKAGES=(pkg-config libhwloc-dev libudev-dev chromium iproute2 nftables iptables python3-venv python3-pip)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "==> installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

VENV="${TCPX_PY_VENV:-$ROOT/target/py-venv}"
if ! "$VENV/bin/python" -c 'import maturin, pytest, numpy' >/dev/null 2>&1; then
  echo "==> python venv $VENV: maturin, pytest, numpy"
  PY="$(command -v /usr/bin/python3 || command -v python3)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check 'maturin>=1.5,<2' pytest numpy
fi
