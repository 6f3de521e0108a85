#!/usr/bin/env bash
# One grading round on the hub, as root: collect, autograde with the course's grader, hand
# feedback back through the exchange.
#   deploy/hub/grade.sh ASSIGNMENT [--root DIR]
# 1. `nbgrader collect` as the instructor: exchange inbound -> COURSE/submitted/<learner>/...
# 2. autograder/grade.py (sandboxed, as root: what `make grade` runs) -> ROOT/graded/ASSIGNMENT/
#    (grades.csv, feedback/, logs/); a root-owned folder, since the sandbox's users must reach it.
# 3. grade.py's feedback copied into COURSE/feedback/<learner>/ASSIGNMENT/ with the submission's
#    timestamp, then `nbgrader release_feedback` as the instructor: learners "Fetch Feedback".
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
AID=${1:-}; ROOT=/srv/zerocourse-hub
[ "${2:-}" = --root ] && ROOT=$3
die() { echo "grade.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (the grading sandbox needs it): sudo $0 $*"
[ -n "$AID" ] || die "usage: $0 ASSIGNMENT [--root DIR]"
[ -f "$ROOT/hub.json" ] || die "no deployment in $ROOT (deploy/hub/setup.sh first)"
get() { python3 -c "import json; print(json.load(open('$ROOT/hub.json'))['$1'])"; }
INSTRUCTOR=$(get instructor); COURSE=$(get course); VENV=$(get venv); REPO=$(get repo)
as_instructor() {   # nbgrader finds COURSE/nbgrader_config.py in its working folder
  (cd "$COURSE" && timeout 600 runuser -u "$INSTRUCTOR" -- env -i HOME="/home/$INSTRUCTOR" \
     USER="$INSTRUCTOR" PATH="$VENV/bin:/usr/bin:/bin" "$VENV/bin/nbgrader" "$@")
}

as_instructor collect "$AID"
OUT=$ROOT/graded/$AID
rm -rf "$OUT"; mkdir -p "$ROOT/graded"; chmod 700 "$ROOT/graded"
timeout 3600 "$VENV/bin/python" "$REPO/autograder/grade.py" "$COURSE/submitted" "$OUT"

for d in "$OUT"/feedback/*/"$AID"; do
  [ -d "$d" ] || continue
  learner=$(basename "$(dirname "$d")")
  dst=$COURSE/feedback/$learner/$AID
  rm -rf "$dst"; mkdir -p "$dst"
  cp "$d"/*.html "$dst/"
  # release_feedback names the file by a hash of the submission's secret: both come along.
  cp "$COURSE/submitted/$learner/$AID"/{timestamp.txt,submission_secret.txt} "$dst/"
done
cp "$OUT/grades.csv" "$COURSE/grades-$AID.csv"
chown -R "$INSTRUCTOR:$INSTRUCTOR" "$COURSE"
as_instructor release_feedback "$AID"
echo "graded $AID: $COURSE/grades-$AID.csv; feedback released"
