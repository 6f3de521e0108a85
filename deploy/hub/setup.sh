#!/usr/bin/env bash
# Set up the course's JupyterHub on this Linux server (as root), then start it.
#
#   deploy/hub/setup.sh USERS_FILE [--root DIR] [--ip IP] [--port PORT] [--mem-gib N]
#                       [--cpus N] [--nproc N] [--cull-idle SECONDS] [--no-start]
#                       [--grant-traverse]
#
# USERS_FILE: one "learner NAME" or "instructor NAME" a line (exactly one instructor; # comments).
# Creates those Linux users (passwords: set them afterwards with passwd or chpasswd), the nbgrader
# exchange, the instructor's course folder, per-role Jupyter settings, installs JupyterHub into
# the course's .venv and configurable-http-proxy (npm) beside it, and starts the hub.
# Learners' servers run the course's .venv, so its Python (the interpreter the venv links to)
# and the repository must be reachable by every user. Where a folder above them is closed to
# others (pyenv under /root), setup stops and names it, or with --grant-traverse gives only the
# hub's users (group zerocourse-hub) permission to pass through it (an ACL, removed by teardown).
# Undo everything with deploy/hub/teardown.sh [--root DIR].
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VENV=$REPO/.venv
die() { echo "setup.sh: $*" >&2; exit 1; }
ARGS="$*"                   # for the messages: the loop below consumes them

USERS_FILE=""; ROOT=/srv/zerocourse-hub; IP=0.0.0.0; PORT=8000; MEM_GIB=3; CPUS=2; NPROC=512
CULL=3600; START=1; GRANT=0; GROUP=zerocourse-hub
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT=$2; shift 2 ;;  --ip) IP=$2; shift 2 ;;  --port) PORT=$2; shift 2 ;;
    --mem-gib) MEM_GIB=$2; shift 2 ;;  --cpus) CPUS=$2; shift 2 ;;  --nproc) NPROC=$2; shift 2 ;;
    --cull-idle) CULL=$2; shift 2 ;;  --no-start) START=0; shift ;;  --grant-traverse) GRANT=1; shift ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) USERS_FILE=$1; shift ;;
  esac
done

# --- checks first: nothing is changed unless every one passes ---------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (it creates users and folders): sudo $0 $ARGS"
[ -n "$USERS_FILE" ] && [ -r "$USERS_FILE" ] || die "no readable USERS_FILE given (see deploy/hub/users.example)"
command -v node >/dev/null && command -v npm >/dev/null ||
  die "node and npm are missing (configurable-http-proxy needs them): apt-get install nodejs npm"
command -v useradd >/dev/null || die "useradd missing: apt-get install passwd"
[ -e "$ROOT/hub.json" ] && die "$ROOT is already a deployment: deploy/hub/teardown.sh --root $ROOT first"
bad=$(awk '!/^[[:space:]]*(#|$)/ && !($1=="learner"||$1=="instructor") {print NR": "$0}' "$USERS_FILE")
[ -z "$bad" ] || die "$USERS_FILE: lines must be 'learner NAME' or 'instructor NAME'; not: $bad"
mapfile -t LEARNERS < <(awk '$1=="learner"{print $2}' "$USERS_FILE")
mapfile -t INSTRUCTORS < <(awk '$1=="instructor"{print $2}' "$USERS_FILE")
[ ${#INSTRUCTORS[@]} = 1 ] || die "$USERS_FILE must name exactly one instructor (found ${#INSTRUCTORS[@]})"
[ ${#LEARNERS[@]} -ge 1 ] || die "$USERS_FILE names no learner"
INSTRUCTOR=${INSTRUCTORS[0]}
for u in "${LEARNERS[@]}" "$INSTRUCTOR"; do
  [[ $u =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "user name '$u' is not a plain Linux name (a-z 0-9 _ -)"
  id "$u" >/dev/null 2>&1 && die "user '$u' already exists: remove it or pick another name (setup only creates new users, so teardown can remove them)"
done
getent group "$GROUP" >/dev/null && die "group $GROUP already exists: is another deployment set up? (teardown.sh removes it)"
[ -x "$VENV/bin/python" ] || make -C "$REPO" setup
# Folders above the interpreter and the repository that other users cannot pass through.
BLOCKING=()
for target in "$(readlink -f "$VENV/bin/python")" "$REPO/zerocourse"; do
  d=$(dirname "$target")
  while [ "$d" != / ]; do
    [ "$(( 0$(stat -c %a "$d") & 1 ))" = 1 ] || BLOCKING+=("$d")
    d=$(dirname "$d")
  done
done
mapfile -t BLOCKING < <(printf '%s\n' "${BLOCKING[@]}" | sort -u | sed '/^$/d')
if [ ${#BLOCKING[@]} -gt 0 ] && [ "$GRANT" = 0 ]; then
  die "learners could not run the course's .venv: other users cannot pass through ${BLOCKING[*]} (the venv's Python is $(readlink -f "$VENV/bin/python")). Install the course with a Python outside them, or rerun with --grant-traverse (an ACL letting only the hub's users through)"
fi
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$PORT" $((PORT + 1)) $((PORT + 2)); do
  port_busy "$p" && die "port $p is in use (the hub uses --port, +1 for its API, +2 for the proxy's): choose another --port"
done

# --- software: the course's .venv, JupyterHub in it, the proxy beside it -------------------------
"$VENV/bin/python" -c "import jupyterhub, jupyterhub_idle_culler" 2>/dev/null ||
  "$VENV/bin/pip" install --quiet jupyterhub jupyterhub-idle-culler
PROXY=$VENV/hub-proxy/node_modules/.bin/configurable-http-proxy
[ -x "$PROXY" ] || timeout 600 npm install --silent --no-audit --no-fund --prefix "$VENV/hub-proxy" configurable-http-proxy
[ -x "$PROXY" ] || die "npm did not install configurable-http-proxy into $VENV/hub-proxy"

# --- the deployment folder: settings (readable), secrets (root only), the exchange -------------
mkdir -p "$ROOT/secrets" "$ROOT/exchange" "$ROOT/jupyter/learner/labconfig" "$ROOT/jupyter/instructor"
chmod 755 "$ROOT" "$ROOT/jupyter"; chmod 700 "$ROOT/secrets"
# nbgrader's exchange: everyone writes (release, submit), the sticky bit keeps others' files safe.
chmod 1777 "$ROOT/exchange"
openssl rand -hex 32 > "$ROOT/secrets/proxy_token" 2>/dev/null || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$ROOT/secrets/proxy_token"
ln -sf secrets/proxy_token "$ROOT/proxy_token"
COURSE=/home/$INSTRUCTOR/zero-by-hand
py_list() { printf '"%s",' "$@" | sed 's/,$//'; }
cat > "$ROOT/hub.json" <<JSON
{"ip": "$IP", "port": $PORT, "hub_port": $((PORT + 1)), "proxy_api_port": $((PORT + 2)),
 "repo": "$REPO", "venv": "$VENV", "proxy": "$PROXY", "exchange": "$ROOT/exchange",
 "learners": [$(py_list "${LEARNERS[@]}")], "instructor": "$INSTRUCTOR", "course": "$COURSE",
 "mem_limit": $((MEM_GIB * 1024 * 1024 * 1024)), "cpu_limit": $CPUS, "nproc_limit": $NPROC,
 "cull_idle_s": $CULL}
JSON

# --- users: private homes, one shared group (for the traverse ACL) ------------------------------
groupadd "$GROUP"
for u in "${LEARNERS[@]}" "$INSTRUCTOR"; do
  useradd --create-home --shell /bin/bash --user-group --groups "$GROUP" "$u"
  chmod 700 "/home/$u"
  echo "$u" >> "$ROOT/users.created"     # teardown removes exactly these
done

# --- Jupyter settings per role (the hub points JUPYTER_CONFIG_PATH at one of them) -------------
# Learners: only the Assignments tab (fetch, validate, submit, feedback); no Formgrader,
# no Create Assignment toolbar, no Courses list, neither as lab plugins nor as server handlers.
cat > "$ROOT/jupyter/learner/nbgrader_config.py" <<PY
c = get_config()
c.CourseDirectory.course_id = "zero-by-hand"
c.Exchange.root = "$ROOT/exchange"
# Validate runs the notebook, whose launches take longer than nbgrader's default 30 s a cell.
c.Execute.timeout = 150
PY
cat > "$ROOT/jupyter/learner/jupyter_server_config.json" <<JSON
{"ServerApp": {"jpserver_extensions": {
   "nbgrader.server_extensions.formgrader": false,
   "nbgrader.server_extensions.course_list": false,
   "nbgrader.server_extensions.assignment_list": true,
   "nbgrader.server_extensions.validate_assignment": true}},
 "MappingKernelManager": {"cull_idle_timeout": $CULL, "cull_interval": 120}}
JSON
cat > "$ROOT/jupyter/learner/labconfig/page_config.json" <<JSON
{"disabledExtensions": {"@jupyter/nbgrader:formgrader": true,
                        "@jupyter/nbgrader:create-assignment": true,
                        "@jupyter/nbgrader:course-list": true}}
JSON
# The instructor: everything nbgrader has, on the course folder below.
cat > "$ROOT/jupyter/instructor/nbgrader_config.py" <<PY
c = get_config()
load_subconfig("$COURSE/nbgrader_config.py")
PY
# Formgrader is a page in an iframe of JupyterLab: JupyterHub (>= 4.1) forbids framing a
# single-user server ("frame-ancestors 'none'"), so the instructor's server allows its own pages.
cat > "$ROOT/jupyter/instructor/jupyter_server_config.json" <<JSON
{"ServerApp": {"tornado_settings": {"headers": {"Content-Security-Policy": "frame-ancestors 'self'"}}},
 "MappingKernelManager": {"cull_idle_timeout": $CULL, "cull_interval": 120}}
JSON
# Its server shows submissions as `make formgrader` does: sanitized, under a CSP that runs no
# inline script but the server's own (autograder/formgrader_csp.py).
cat > "$ROOT/jupyter/instructor/jupyter_server_config.py" <<PY
import sys
sys.path.insert(0, "$REPO")
from autograder.formgrader_csp import configure
configure(get_config())
PY
chmod -R a+rX "$ROOT/jupyter"

# --- the instructor's course folder: nbgrader's source/ is the course's solutions/ --------------
mkdir -p "$COURSE/source"
cp -r "$REPO"/solutions/*/ "$COURSE/source/"
cp -r "$REPO/autograder/notes" "$COURSE/notes"      # the instructor's notes, readable only here
cat > "$COURSE/nbgrader_config.py" <<PY
c = get_config()
# The course's own settings (stubs, timeouts, split grading, feedback without hidden tests)...
load_subconfig("$REPO/autograder/nbgrader_config.py")
# ...on this folder: source/ -> release/ -> the exchange -> submitted/ -> autograded/ -> feedback/
c.CourseDirectory.root = "$COURSE"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.db_url = "sqlite:///$COURSE/gradebook.db"
c.CourseDirectory.course_id = "zero-by-hand"
c.Exchange.root = "$ROOT/exchange"
PY
chown -R "$INSTRUCTOR:$INSTRUCTOR" "$COURSE"; chmod 700 "$COURSE"

# --- the repository: learners run its .venv and zerocourse/, never read instructor material ---
# solutions, tests (bug fixtures), history, the instructor notes (hidden-test tables, rubrics,
# quiz answers; rubric.py reads them as root) and test artifacts (solved notebooks' outputs).
# Modes saved, teardown restores them; no kernel imports anything from these folders.
: > "$ROOT/repo-modes"
for d in solutions tests .git .ci autograder/notes artifacts; do
  [ -e "$REPO/$d" ] || continue
  stat -c '%a %n' "$REPO/$d" >> "$ROOT/repo-modes"
  chmod o-rwx "$REPO/$d"
done

if [ ${#BLOCKING[@]} -gt 0 ]; then
  command -v setfacl >/dev/null || { apt-get update -qq >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq acl >/dev/null; }
  command -v setfacl >/dev/null || die "setfacl missing: apt-get install acl"
  for d in "${BLOCKING[@]}"; do
    setfacl -m "g:$GROUP:x" "$d"        # pass through only: no listing, no reading
    echo "$d" >> "$ROOT/acl-granted"
  done
fi

# A systemd unit for servers that have systemd (this script itself does not need it).
cat > "$ROOT/zerocourse-hub.service" <<UNIT
[Unit]
Description=ZeRO by hand JupyterHub
After=network.target
[Service]
Environment=ZEROCOURSE_HUB_ROOT=$ROOT PATH=$VENV/bin:/usr/local/bin:/usr/bin:/bin
ExecStart=$VENV/bin/jupyterhub -f $HERE/jupyterhub_config.py
WorkingDirectory=$ROOT
[Install]
WantedBy=multi-user.target
UNIT

echo "set up $ROOT for ${#LEARNERS[@]} learner(s) and instructor $INSTRUCTOR; set passwords: passwd NAME"
if [ "$START" = 1 ]; then (cd "$ROOT" && "$HERE/hub.sh" start "$ROOT"); fi
