"""The programs a task's own image runs on a cluster, as POSIX shell: a task image has no tracefleet Python (and
should not need any), but every Harbor task image is a Linux with `sh`, `find`, `tar`, `sort`, `comm` and
`timeout` (Debian's and Ubuntu's essential set; what Harbor's own test.sh files assume). The operator puts each
program in the container's command (`sh -c PROGRAM`), so what runs is visible in the pod spec and always matches
the operator's version; no file of ours has to be in the task image or in the bundle.

`LAUNCHER` (the harness pod's task container): records the root filesystem, says it is ready (with its working
directory), waits for the session program's launch request (tracefleet.runner.pod.task_image), runs it in its own
process group (killed on a `stop`), then writes the agent's change set: every file, link and folder on the
container's root filesystem whose ctime is after the launcher started (ctime cannot be set back by any program, so
`touch -d`, `cp -p` or an unpacked tarball do not hide a change), as a tar with owners and modes, and every path
deleted. The harness's exit status is written last. Mounts (the shared volume, /proc, the kubelet's /etc/hosts)
are not the root filesystem and are never in it; neither are /tests and /logs/verifier.

`VERIFIER` (in a FRESH container of the task image: the evaluator Job's task-image step on a cluster, `podman run`
of the task image locally, tracefleet.runner.containers.verifier): applies the change set (deletions first, then the
tar; nothing under the paths above, and none of the image's own programs: `_KEPT`), with /tests a fresh folder
holding a copy of the task's own tests/ and /logs/verifier a fresh folder, runs `bash /tests/test.sh` from the
working directory as [verifier].user under [verifier].timeout_sec with the hardened Python environment, and records
the exit status, the output and whether it timed out. It always exits 0: the verdict is read from what it left
(tracefleet.runner.containers.harbor_outcome.verdict_here).

The change set comes from the launcher on a cluster (the files whose ctime is after it started) and from the
container's layer diff locally (`podman diff`, read through `podman mount`): the same filesystem state reaches
test.sh. Ownership and modes are carried, a file's extended attributes only where tar keeps them, and a deletion
list read line by line cannot name a path holding a newline (such a deletion is not replayed).
"""

from __future__ import annotations

from tracefleet.contract import podenv
from tracefleet.contract import task_image as ti
from tracefleet.contract.harbor import CONTAINER_TESTS_DIR, CONTAINER_VERIFIER_LOGS, TEST_SCRIPT



def _prune() -> str:
    """find(1) arguments that skip the paths never part of the change set (and virtual filesystems)."""
    paths = (*ti.NEVER_CHANGED, "/proc", "/sys", "/dev")
    return " -o ".join(f"-path {p}" for p in paths)


_LISTING = f"""listing() {{ find / -xdev \\( {_prune()} \\) -prune -o -print 2>/dev/null | LC_ALL=C sort; }}"""

LAUNCHER = f"""set -u
L={ti.LAUNCH_DIR}
# the session container (another uid) writes its request, stop and done here
mkdir -p "$L" && chmod 0777 "$L"
if [ -n "${{{podenv.TASK_WORKDIR}:-}}" ]; then mkdir -p "${podenv.TASK_WORKDIR}" && cd "${podenv.TASK_WORKDIR}"; fi
{_LISTING}
# the working directory as the image has it, for the session's patch (not the whole root filesystem)
if [ "$(pwd)" != / ]; then tar -cpf "$L/{ti.WORKDIR_BEFORE}" . 2> /dev/null || rm -f "$L/{ti.WORKDIR_BEFORE}"; fi
: > "$L/.start"
listing > "$L/.before"
pwd > "$L/.ready" && mv "$L/.ready" "$L/{ti.READY}"
while [ ! -e "$L/{ti.REQUEST}" ]; do
  if [ -e "$L/{ti.DONE}" ]; then exit 0; fi
  sleep 0.2
done
# its own session and process group (setsid, util-linux), so a stop reaches everything it started
group=""
if command -v setsid > /dev/null 2>&1; then group=setsid; fi
$group sh -c 'sh "$1/{ti.REQUEST}" > "$1/{ti.HARNESS_STDOUT}" 2> "$1/{ti.HARNESS_STDERR}" < /dev/null; echo $? > "$1/.code"' sh "$L" &
pid=$!
stopped=""
while [ ! -e "$L/.code" ] && kill -0 "$pid" 2>/dev/null; do
  if [ -e "$L/{ti.STOP}" ] && [ -z "$stopped" ]; then kill -TERM -"$pid" 2>/dev/null || kill -TERM "$pid"; stopped=$(date +%s); fi
  if [ -n "$stopped" ] && [ $(( $(date +%s) - stopped )) -ge {ti.STOP_GRACE_S} ]; then kill -KILL -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; fi
  sleep 0.2
done
wait "$pid" 2>/dev/null
code=$(cat "$L/.code" 2>/dev/null || echo 137)
find / -mindepth 1 -xdev \\( {_prune()} \\) -prune -o -cnewer "$L/.start" -print0 2>/dev/null > "$L/.changed"
tar --null --no-recursion -T "$L/.changed" -cpf "$L/{ti.CHANGES}" 2> "$L/.tar.log"
listing > "$L/.after"
LC_ALL=C comm -23 "$L/.before" "$L/.after" > "$L/{ti.DELETED}"
echo "$code" > "$L/.exit" && mv "$L/.exit" "$L/{ti.EXIT_CODE}"
exit 0
"""

# tar member names have no leading '/'; anchored, so only these top-level paths (and what is under them) are skipped.
_TAR_EXCLUDES = " ".join(f"--exclude={p.lstrip('/')}" for p in ti.NEVER_CHANGED)
_DELETE_SKIP = "|".join(f"{p}|{p}/*" for p in (*ti.NEVER_CHANGED, "/proc", "/sys", "/dev"))
_SYSTEM = "|".join(f"{p}/*" for p in ti.SYSTEM_DIRS) + "|/etc/ld.so.*"
_PATH_DIRS = " ".join(ti.PROGRAM_DIRS)

# What of the change set is never applied (`kept`, run in the fresh container before anything is applied, so every
# test is against the image as built): a file or link the image holds under its system folders (its programs,
# libraries and Python: replaced or deleted by the agent, it stays the image's; an existing folder there is not
# excluded, which would exclude what the agent added in it), a new program in a folder on PATH named like one
# the image has (it would shadow it), and a Python startup hook (*.pth, sitecustomize.py, usercustomize.py) added
# under /usr. New files elsewhere under /usr stay (a package the agent installed is part of its work).
_KEPT = f"""kept() {{
  case "$1" in
    {_SYSTEM}) if [ -L "$1" ] || {{ [ -e "$1" ] && [ ! -d "$1" ]; }}; then return 0; fi ;;
  esac
  case "$1" in
    /usr/*.pth|/usr/*/sitecustomize.py|/usr/*/usercustomize.py) return 0 ;;
  esac
  d=${{1%/*}}; b=${{1##*/}}
  for dir in {_PATH_DIRS}; do
    if [ "$d" = "$dir" ]; then
      for other in {_PATH_DIRS}; do if [ -e "$other/$b" ]; then return 0; fi; done
    fi
  done
  return 1
}}"""

VERIFIER = f"""set -u
E={ti.EVAL_DIR}
if [ -e "$E/{ti.FETCH_ERROR}" ]; then exit 0; fi
{_KEPT}
: > "$E/.kept"
if [ -s "$E/{ti.CHANGES}" ]; then
  tar --quoting-style=literal -tf "$E/{ti.CHANGES}" | while IFS= read -r m; do
    p="/${{m#./}}"; p="${{p%/}}"
    if kept "$p"; then printf '%s\\n' "$m" >> "$E/.kept"; fi
  done
fi
if [ -s "$E/{ti.DELETED}" ]; then
  while IFS= read -r p; do
    case "$p" in {_DELETE_SKIP}|/) continue ;; esac
    if kept "$p"; then continue; fi
    rm -rf -- "$p" 2>/dev/null
  done < "$E/{ti.DELETED}"
fi
if [ -s "$E/{ti.CHANGES}" ]; then
  tar --anchored --no-wildcards --keep-directory-symlink {_TAR_EXCLUDES} -X "$E/.kept" -xpf "$E/{ti.CHANGES}" -C / 2> "$E/apply.log"
fi
# [verifier].user: the change set is applied as root (the agent may have written anywhere), test.sh runs as the user
as_user=""
if [ -n "${{{ti.VERIFIER_USER_ENV}:-}}" ] && [ "$(id -u)" = 0 ]; then
  u="${ti.VERIFIER_USER_ENV}"
  if ! uid=$(id -u "$u" 2>/dev/null); then
    echo "tracefleet: [verifier].user $u: no such user in the task image" > "$E/{ti.TEST_OUTPUT}"; exit 0
  fi
  gid=$(id -g "$u")
  if command -v setpriv > /dev/null 2>&1; then as_user="setpriv --reuid=$uid --regid=$gid --init-groups"
  else echo "tracefleet: [verifier].user $u: the task image has no setpriv to run test.sh as it" > "$E/{ti.TEST_OUTPUT}"; exit 0
  fi
fi
cp -R "$E/{ti.EVAL_TESTS}/." {CONTAINER_TESTS_DIR}/
if [ -n "${{{podenv.TASK_WORKDIR}:-}}" ]; then mkdir -p "${podenv.TASK_WORKDIR}" && cd "${podenv.TASK_WORKDIR}"; fi
start=$(date +%s)
timeout -k {ti.STOP_GRACE_S} "${podenv.VERIFIER_TIMEOUT_S}" $as_user bash {CONTAINER_TESTS_DIR}/{TEST_SCRIPT} > "$E/{ti.TEST_OUTPUT}" 2>&1 < /dev/null
code=$?
end=$(date +%s)
echo $(( end - start )) > "$E/{ti.DURATION}"
if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
  if [ $(( end - start )) -ge "${podenv.VERIFIER_TIMEOUT_S}" ]; then : > "$E/{ti.TIMED_OUT}"; fi
fi
echo "$code" > "$E/{ti.EXIT_CODE}"
ls -A {CONTAINER_VERIFIER_LOGS} > /dev/null
exit 0
"""
