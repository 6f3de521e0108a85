#!/usr/bin/env bash
# Start, stop or check the hub of a deployment made by setup.sh (no systemd needed).
#   deploy/hub/hub.sh start|stop|status [HUB_ROOT]       (HUB_ROOT defaults to /srv/zerocourse-hub)
set -euo pipefail
cmd=${1:-}; ROOT=${2:-${ZEROCOURSE_HUB_ROOT:-/srv/zerocourse-hub}}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$ROOT/hub.json" ] || { echo "hub.sh: $ROOT/hub.json missing: run deploy/hub/setup.sh first" >&2; exit 2; }
setting() { python3 -c "import json,sys; print(json.load(open('$ROOT/hub.json'))['$1'])"; }
PIDFILE=$ROOT/hub.session        # the hub's session id: the hub and its proxy live in it
url() { echo "http://$(setting ip):$(setting port)/hub/health"; }

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

case "$cmd" in
start)
  running && { echo "hub already running (session $(cat "$PIDFILE"))"; exit 0; }
  VENV=$(setting venv); cd "$ROOT"
  # Own session (setsid): `stop` can end the hub and its proxy together, whoever started it.
  ZEROCOURSE_HUB_ROOT=$ROOT PATH="$VENV/bin:$PATH" setsid "$VENV/bin/jupyterhub" \
      -f "$HERE/jupyterhub_config.py" >>"$ROOT/jupyterhub.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 120); do          # 60 s: the hub starts the proxy and the idle culler first
    if curl -fsS -m 2 "$(url)" >/dev/null 2>&1; then u=$(url); echo "hub up: ${u%/hub/health}"; exit 0; fi
    running || break
    sleep 0.5
  done
  echo "hub.sh: the hub did not come up; last lines of $ROOT/jupyterhub.log:" >&2
  tail -n 30 "$ROOT/jupyterhub.log" >&2
  "$0" stop "$ROOT" >/dev/null 2>&1 || true
  exit 1 ;;
stop)
  [ -f "$PIDFILE" ] || { echo "hub not running"; exit 0; }
  sid=$(cat "$PIDFILE")
  # The hub's children (proxy, idle culler, servers) run in sessions of their own: note them.
  children=$(pgrep -P "$sid" || true)
  # SIGTERM: the hub stops every learner's server and the proxy (cleanup_servers/proxy).
  kill -TERM "$sid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$sid" 2>/dev/null || break; sleep 0.5; done
  # Whatever is left in its session is killed, and the proxy, which JupyterHub starts in a
  # session of its own (its pid file is in ROOT, the hub's working folder).
  pkill -KILL -s "$sid" 2>/dev/null || true
  for pid in $children; do kill -KILL "$pid" 2>/dev/null || true; done
  if [ -f "$ROOT/jupyterhub-proxy.pid" ]; then
    kill -KILL "$(cat "$ROOT/jupyterhub-proxy.pid")" 2>/dev/null || true
    rm -f "$ROOT/jupyterhub-proxy.pid"
  fi
  rm -f "$PIDFILE"; echo "hub stopped" ;;
status)
  if running; then echo "running (session $(cat "$PIDFILE")), $(url)"; else echo "not running"; exit 3; fi ;;
*) echo "usage: $0 start|stop|status [HUB_ROOT]" >&2; exit 2 ;;
esac
