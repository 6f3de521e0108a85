#!/usr/bin/env bash
# Undo deploy/hub/setup.sh: stop the hub, end every process of the users it created, remove
# those users with their homes, the cgroups, the deployment folder (exchange included), and
# give the repository's folders their modes back.
#   deploy/hub/teardown.sh [--root DIR]            (DIR defaults to /srv/zerocourse-hub)
set -uo pipefail            # no -e: go on removing what is left when one step fails
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=/srv/zerocourse-hub
[ "${1:-}" = --root ] && ROOT=$2
[ "$(id -u)" = 0 ] || { echo "teardown.sh: must run as root: sudo $0 $*" >&2; exit 1; }
[ -f "$ROOT/hub.json" ] || { echo "teardown.sh: no deployment in $ROOT (nothing to do)"; exit 0; }

"$HERE/hub.sh" stop "$ROOT"
mapfile -t USERS < <(cat "$ROOT/users.created" 2>/dev/null)
for u in "${USERS[@]}"; do
  id -u "$u" >/dev/null 2>&1 || continue
  # Servers, kernels, fork servers, ranks: everything running as this user (created by setup.sh).
  for _ in $(seq 20); do pkill -KILL -u "$u" 2>/dev/null || break; sleep 0.25; done
  for cg in /sys/fs/cgroup/{memory,cpu,pids}/zerocourse-hub/"$u" /sys/fs/cgroup/zerocourse-hub/"$u"; do
    [ -d "$cg" ] && rmdir "$cg" 2>/dev/null
  done
  userdel --remove "$u" 2>/dev/null || userdel "$u"
  getent group "$u" >/dev/null && groupdel "$u" 2>/dev/null
  rm -rf "/home/$u"
done
for top in /sys/fs/cgroup/{memory,cpu,pids}/zerocourse-hub /sys/fs/cgroup/zerocourse-hub; do
  [ -d "$top" ] && rmdir "$top" 2>/dev/null
done
while read -r mode path; do chmod "$mode" "$path"; done < "$ROOT/repo-modes" 2>/dev/null
while read -r d; do setfacl -x g:zerocourse-hub "$d"; done < "$ROOT/acl-granted" 2>/dev/null
getent group zerocourse-hub >/dev/null && groupdel zerocourse-hub
rm -rf "$ROOT"
echo "removed the hub in $ROOT and users: ${USERS[*]:-none}"
