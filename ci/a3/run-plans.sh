#!/usr/bin/env bash
# Runs the phase plans on two A3 nodes: `run-plans.sh leader` on node 0, `run-plans.sh follower`
# on node 1 (started at the same time; the follower retries until the leader listens).
#
# Environment:
#   PLANS        plans to run, in order (default: all eight phase plans)
#   TARGETS      target set (default: a3-high)
#   BUDGET       seconds a plan may be estimated to take before it is refused (default: 5400)
#   TCPX_LEADER  follower: the leader's host name or address (required)
#   TCPX_PLAN_PORT  plan port (default 5310)
#   TCPX_RUN_TOKEN  both: the run token leader and follower prove to each other (required: the
#                leader listens on 0.0.0.0; the same secret on both nodes, e.g. a repository secret)
#   TCPX_RUN     the tcpx-run binary (default: target/release/tcpx-run)
#   SUDO         prefix for plans that change IRQ affinity (e.g. "sudo -n"; empty when root)
#   FAIL_ON_CRITERIA  1: a failed criterion (exit 1) fails the job; default 0 (reported only)
#
# Exit status: 2 when any plan could not complete (or the follower failed), 1 when a criterion
# failed and FAIL_ON_CRITERIA=1, else 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
role="${1:?usage: run-plans.sh leader|follower}"
PLANS="${PLANS:-phase1_affinity phase1_window phase1_chunk irq_matrix phase2_single_process phase3_multi_nic phase3_multi_channel phase3_final_tuning}"
TARGETS="${TARGETS:-a3-high}"
BUDGET="${BUDGET:-5400}"
BIN="${TCPX_RUN:-target/release/tcpx-run}"
SUDO="${SUDO:-}"
[ -x "$BIN" ] || { echo "run-plans: $BIN not found: cargo build --release -p tcpx-run first" >&2; exit 2; }

case "$role" in
leader)
  worst=0
  summary=()
  for p in $PLANS; do
    prefix=""
    # Only the IRQ matrix writes /proc/irq; it alone gets the sudo prefix.
    [ "$p" = irq_matrix ] && prefix="$SUDO"
    echo "==> plan $p (leader)"
    $prefix "$BIN" "plans/$p.rhai" --targets "$TARGETS" --listen 0.0.0.0 \
      --budget "$BUDGET" --follower-timeout 900 --reports reports
    rc=$?
    summary+=("$p: exit $rc")
    [ "$rc" -gt "$worst" ] && worst=$rc
  done
  printf '%s\n' "${summary[@]}"
  cargo xtask report || true
  if [ "$worst" -ge 2 ]; then exit 2; fi
  if [ "$worst" -eq 1 ] && [ "${FAIL_ON_CRITERIA:-0}" = 1 ]; then exit 1; fi
  exit 0
  ;;
follower)
  : "${TCPX_LEADER:?set TCPX_LEADER to the host name or address of the leader node}"
  failed=0
  for p in $PLANS; do
    prefix=""
    [ "$p" = irq_matrix ] && prefix="$SUDO"
    echo "==> plan $p (follower of $TCPX_LEADER)"
    $prefix "$BIN" follow --leader "$TCPX_LEADER" --connect-timeout 900 || failed=1
  done
  exit $((failed * 2))
  ;;
*)
  echo "usage: run-plans.sh leader|follower" >&2
  exit 2
  ;;
esac
