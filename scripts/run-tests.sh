#!/usr/bin/env bash
# Every test, in groups run at the same time (`make test` calls this). Two kinds:
#   fast: unit, service (SQLite and PostgreSQL) and API tests — mostly CPU;
#   e2e:  end-to-end and browser tests with real containers, and the runtime contract
#         suite (the in-memory and the Podman runtime alike) — mostly waiting on them.
# Each kind's test files are dealt into groups of about equal measured time
# (scripts/suite_groups.py, by tests/durations.json; SUITE_GROUPS, default
# "fast=1 e2e=1" on 2 cores, says how many), one pytest process each. They share no state: each
# PostgreSQL test makes its own database, each e2e server takes a flock-locked port
# block (tests/helpers.port_block), each simulated host claims its own namespace
# (tests/e2e/podman_host.py), each group starts its own private `podman system
# service` and labels what it makes with its own installation id.
# Lines are prefixed with the group's name as they come; each group's summary is
# printed again at the end, then the ten slowest tests of all groups together
# (scripts/slowest_tests.py). Exits non-zero when any group fails, or runs no test
# (every test skipped, or none collected: scripts/group_ran.py reads its JUnit report),
# so a CI machine missing a part cannot look green.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST="${PYTEST:-.venv/bin/pytest}"
PYTHON="${PYTHON:-python3}"
work="$(mktemp -d /tmp/gyt-XXXXXX)"

# Bytecode caches: an environment with PYTHONDONTWRITEBYTECODE set (this machine's is)
# makes every process of the suite (the groups' pytest, hundreds of CLI, server and
# client subprocesses) compile gpuyard's modules and rewrite the test modules' asserts
# from source again. They are written beside the sources (ignored by git), and compiled
# once here so the groups do not all do it at their start.
unset PYTHONDONTWRITEBYTECODE
"$(dirname "$PYTEST")/python" -m compileall -q -j 0 src tests >/dev/null 2>&1 || true

# Each group's pytest, in the background. A shell without job control starts background
# commands with SIGINT ignored; `env --default-signal=INT` gives it back, so Ctrl-C (or
# the TERM handler below) ends a group through pytest's own teardown, which removes
# the containers and services its tests made.
start_group() {
  local name="$1"
  shift
  # Own temporary roots (short: unix socket paths are limited to 108 bytes); no shared
  # cache directory between the processes. The JUnit report tells how many ran.
  env --default-signal=INT "$PYTEST" -q -ra -p no:cacheprovider \
    --basetemp="$work/$name" --junitxml="$work/$name.xml" "$@" >"$work/$name.log" 2>&1 &
}
# The groups: each kind's files dealt by measured seconds (scripts/suite_groups.py,
# tests/durations.json), one pytest process each. SUITE_GROUPS sets how many of each.
if ! "$PYTHON" scripts/suite_groups.py ${SUITE_GROUPS:-fast=1 e2e=1} >"$work/groups" 2>"$work/groups.log"; then
  cat "$work/groups.log"
  exit 1
fi
cat "$work/groups.log"
names=()
pids=()
while read -r name files; do
  # shellcheck disable=SC2086 # the files: one word each
  start_group "$name" $files
  names+=("$name")
  pids+=("$!")
done <"$work/groups"

# Ctrl-C reaches every group from the terminal (same process group): wait for their
# teardown. A TERM (a CI timeout) is passed on to them as an interrupt.
trap 'wait "${pids[@]}"; rm -rf "$work"; exit 130' INT
trap 'kill -INT "${pids[@]}" 2>/dev/null; wait "${pids[@]}"; rm -rf "$work"; exit 143' TERM

# Show progress while they run, each line once, prefixed with its group.
show() {
  local name="$1" shown total
  shown="$(cat "$work/$name.shown" 2>/dev/null || echo 0)"
  total="$(wc -l <"$work/$name.log" 2>/dev/null || echo 0)"
  if [ "$total" -gt "$shown" ]; then
    sed -n "$((shown + 1)),${total}p" "$work/$name.log" | sed "s/^/[$name] /"
    echo "$total" >"$work/$name.shown"
  fi
}
running() {
  local pid
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
while running; do
  sleep "${PROGRESS_EVERY_S:-20}" &
  wait $! # (a trap runs at once, not after the sleep)
  for name in "${names[@]}"; do show "$name"; done
done
rcs=()
for pid in "${pids[@]}"; do
  wait "$pid"
  rcs+=("$?")
done
for name in "${names[@]}"; do show "$name"; done

status=0
for i in "${!names[@]}"; do
  name="${names[$i]}" rc="${rcs[$i]}"
  echo
  echo "=== $name: exit $rc ==="
  # The summary: pytest's short summary to the end (or the end, if it never came).
  if grep -q '=* short test summary info =*' "$work/$name.log"; then
    sed -n '/=* short test summary info =*/,$p' "$work/$name.log"
  else
    tail -n 3 "$work/$name.log"
  fi
  [ "$rc" = 0 ] || status=1
  if [ "$rc" = 5 ]; then # pytest's exit code for "no test collected"
    echo "$name: FAILED, pytest collected no test (exit 5)"
  fi
  "$PYTHON" scripts/group_ran.py "$name" "$work/$name.xml" || status=1
done
# The ten slowest of all groups together; DURATIONS_OUT: where to write each file's
# seconds (what tests/durations.json holds, to deal the groups by).
echo
reports=()
for name in "${names[@]}"; do reports+=("$work/$name.xml"); done
"$PYTHON" scripts/slowest_tests.py ${DURATIONS_OUT:+--files "$DURATIONS_OUT"} "${reports[@]}"
if [ "$status" = 0 ]; then
  rm -rf "$work"
else
  # What a failed test left (servers' homes and logs, temporary files) stays for a look.
  echo "kept for a look: $work (each test's temporary files, servers' logs)"
fi
exit "$status"
