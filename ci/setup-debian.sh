#!/usr/bin/env bash
# Installs the Debian 12 packages tcpx-lab needs to build and test: hwloc and udev headers for
# tcpx-topo (hwlocality), pkg-config to find them, chromium for the report's browser test,
# iproute2 (ip, tc) for the emulated fabric's namespace tests (nftables and iptables for its loss
# fault where the kernel has no sch_netem), python3-venv for the tcpx_lab
# Python package, Slurm (slurmctld, slurmd, slurm-client, munge) and Open MPI (openmpi-bin) for
# the tests that start real launchers (crates/tcpx-run/tests/launcher_*.rs; their daemons run
# only there, in a namespace of the test's: none is started here); then a Python venv
# (target/py-venv, or $TCPX_PY_VENV) with maturin, pytest and numpy for that package's tests.
# Safe to run again: installs only what is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PACKAGES=(pkg-config libhwloc-dev libudev-dev chromium iproute2 nftables iptables python3-venv python3-pip)
# Optional: where they cannot be installed, the launcher tests skip and say so.
LAUNCHERS=(slurmctld slurmd slurm-client munge openmpi-bin)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
missing_launchers=()
for p in "${LAUNCHERS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing_launchers+=("$p")
done
if [ $((${#missing[@]} + ${#missing_launchers[@]})) -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "==> installing: ${missing[*]} ${missing_launchers[*]}"
  $SUDO apt-get update -qq
  # The packages' scripts would start munged, slurmd and slurmctld as system services (slurmd
  # and slurmctld listen on every address): refused while installing, where no policy says so
  # already (Debian's container images ship one).
  POLICY=/usr/sbin/policy-rc.d
  if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY.tcpx-setup" >/dev/null
    $SUDO chmod 755 "$POLICY.tcpx-setup"
    $SUDO mv "$POLICY.tcpx-setup" "$POLICY"
    trap '$SUDO rm -f "$POLICY"' EXIT
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if [ ${#missing_launchers[@]} -gt 0 ] &&
    ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing_launchers[@]}"; then
    echo "==> warning: could not install ${missing_launchers[*]}: the real-launcher tests will skip" >&2
  fi
fi

VENV="${TCPX_PY_VENV:-$ROOT/target/py-venv}"
if ! "$VENV/bin/python" -c 'import maturin, pytest, numpy' >/dev/null 2>&1; then
  echo "==> python venv $VENV: maturin, pytest, numpy"
  PY="$(command -v /usr/bin/python3 || command -v python3)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check 'maturin>=1.5,<2' pytest numpy
fi
