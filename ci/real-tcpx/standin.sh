# Sourced by the real-tcpx scripts: tcpx-lab's rxdm stand-in (tcpx-rxdm-standin) serving a
# temporary prefix, stopped and the prefix removed when the script exits. Needs $bin (the
# directory holding tcpx-rxdm-standin) and $logs (where standin.log goes); sets $prefix.
prefix=$(mktemp -d /tmp/rxdm-XXXXXX)
standin_pid=
cleanup() {
  [ -n "$standin_pid" ] && kill -TERM "$standin_pid" 2>/dev/null && wait "$standin_pid" 2>/dev/null
  rm -rf "$prefix"
}
trap cleanup EXIT

start_standin() { # $1: accept|refuse, $2: record file; (re)starts it, 1 when it does not come up
  if [ -n "$standin_pid" ]; then kill -TERM "$standin_pid"; wait "$standin_pid"; standin_pid=; fi
  local mode=(); [ "$1" = refuse ] && mode=(--refuse)
  "$bin/tcpx-rxdm-standin" --prefix "$prefix" --record "$2" "${mode[@]}" 2>>"$logs/standin.log" &
  standin_pid=$!
  for _ in $(seq 200); do [ -S "$prefix/rxdm_application_registry" ] && return 0; sleep 0.05; done
  echo "stand-in did not come up (see standin.log)"; return 1
}
