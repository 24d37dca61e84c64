#!/usr/bin/env bash
# Runs the same deterministic tcpx-run commands with two binaries and compares what each printed
# and its exit status: help texts, the topology and IRQ views of the fixture trees, every plan's
# dry run, and refusals of bad input. Timings are not among them (they differ run to run).
#
#   ci/compare-outputs.sh OLD_BINARY NEW_BINARY
#
# Build the old one from a worktree, e.g.
#   git worktree add /tmp/old <commit> && cargo build --manifest-path /tmp/old/Cargo.toml \
#     -p tcpx-run --target-dir /tmp/old-target
# Exit status 0 when every command printed the same, 1 otherwise (the differences are shown).
set -u
old=${1:?usage: compare-outputs.sh OLD_BINARY NEW_BINARY}
new=${2:?usage: compare-outputs.sh OLD_BINARY NEW_BINARY}
root=$(cd "$(dirname "$0")/.." && pwd)
fx="$root/crates/tcpx-topo/tests/fixtures"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One command per line, run through `bash -c` with $BIN set to the binary under test and the
# working directory a fresh copy of plans/.
commands=(
  '$BIN --help'
  '$BIN --version'
  '$BIN bench --help'
  '$BIN baseline --help'
  '$BIN doctor --help'
  '$BIN topo --help'
  '$BIN irq --help'
  '$BIN plan --help'
  '$BIN follow --help'
  '$BIN fleet --help'
  '$BIN fabric --help'
  '$BIN apply --help'
  '$BIN validate --help'
  '$BIN tune --help'
  '$BIN watch --help'
  "\$BIN topo --root $fx/a3-high"
  "\$BIN topo --root $fx/a3-high --json"
  "\$BIN topo --root $fx/single-socket-lo"
  "\$BIN irq --root $fx/a3-high show"
  "\$BIN irq --root $fx/a3-high --json show"
  "\$BIN irq --root $fx/a3-high plan"
  "\$BIN irq --root $fx/a3-high plan --spread whole-set"
  "\$BIN irq --root $fx/a3-high apply"
  '$BIN bench --size 0'
  '$BIN bench --channels 0'
  '$BIN bench --window 100000'
  '$BIN bench --transport carrier-pigeon'
  '$BIN bench --role client'
  '$BIN bench --timeout 999999'
  '$BIN fleet'
  '$BIN fleet --nodes 2 --rank 1'
  'TCPX_PLAN_PORT=seventy $BIN follow --leader 127.0.0.1 --connect-timeout 1'
  'TCPX_RUN_TOKEN=short $BIN follow --leader 127.0.0.1 --connect-timeout 1'
  '$BIN follow --leader 127.0.0.1 --connect-timeout 1 --token-file /nonexistent/token'
  '$BIN no-such-command'
  '$BIN apply --help'
  '$BIN apply /nonexistent/run'
  '$BIN watch /nonexistent/dir'
  '$BIN validate /nonexistent/tuned.env'
  '$BIN tune --budget 0'
  '$BIN apply plans'
  '$BIN apply plans --format slurm'
  '$BIN bench --samples-csv /dev/null/x.csv'
  '$BIN fleet --nodes 2 --rank 0 --listen 999.1.1.1'
  '$BIN fleet --nodes 1'
  '$BIN fleet --nodes 2 --rank 0 --nics lo --reps 0'
  '$BIN plans/no-such-plan.rhai'
  '$BIN plans/phase1_window.rhai --targets plans/targets/no-such.toml'
  '$BIN plans/phase1_window.rhai --targets plans/targets/loopback.toml --fabric no-such-fabric --dry-run'
  '$BIN watch plans'
  '$BIN watch plans --json'
)
for p in "$root"/plans/*.rhai; do
  commands+=("\$BIN plans/$(basename "$p") --dry-run --targets plans/targets/loopback.toml")
done

run() {
  local bin=$1 cmd=$2 out=$3
  rm -rf "$work/cwd" && mkdir -p "$work/cwd" && cp -r "$root/plans" "$work/cwd/"
  (cd "$work/cwd" && BIN=$bin RUST_LOG= timeout 60 bash -c "$cmd" >"$out.stdout" 2>"$out.stderr"
   echo "exit $?" >"$out.status")
  # The binary's own path and version appear in some texts: the same word for both.
  sed -i -e "s#$bin#BIN#g" "$out.stdout" "$out.stderr"
}

differ=0
for i in "${!commands[@]}"; do
  c=${commands[$i]}
  run "$old" "$c" "$work/old.$i"
  run "$new" "$c" "$work/new.$i"
  for part in status stdout stderr; do
    if ! cmp -s "$work/old.$i.$part" "$work/new.$i.$part"; then
      echo "DIFFERS ($part): $c"
      diff "$work/old.$i.$part" "$work/new.$i.$part" | head -20
      differ=1
    fi
  done
done
echo "compared ${#commands[@]} commands: $([ $differ = 0 ] && echo 'all the same' || echo 'some differ')"
exit $differ
