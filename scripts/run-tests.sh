#!/usr/bin/env bash
# Every test, in two groups run at the same time (`make test` calls this):
#   fast: unit, service (SQLite and PostgreSQL) and API tests — mostly CPU;
#   e2e:  end-to-end and browser tests with real containers, and the runtime contract
#         suite (the in-memory and the Podman runtime alike) — mostly waiting on them.
# They share no state: each PostgreSQL test makes its own database, each e2e server
# takes a flock-locked port block (tests/helpers.port_block), each group starts its own
# private `podman system service` and labels what it makes with its own installation id.
# Lines are prefixed with the group's name as they come; each group's summary is
# printed again at the end. Exits non-zero when either group fails.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST="${PYTEST:-.venv/bin/pytest}"
work="$(mktemp -d /tmp/gyt-XXXXXX)"

# Each group's pytest, in the background. A shell without job control starts background
# commands with SIGINT ignored; `env --default-signal=INT` gives it back, so Ctrl-C (or
# the TERM handler below) ends a group through pytest's own teardown, which removes
# the containers and services its tests made.
start_group() {
  local name="$1"
  shift
  # Own temporary roots (short: unix socket paths are limited to 108 bytes); no shared
  # cache directory between the two processes.
  env --default-signal=INT "$PYTEST" -q -ra --durations=10 -p no:cacheprovider \
    --basetemp="$work/$name" "$@" >"$work/$name.log" 2>&1 &
}
start_group fast tests/unit tests/service tests/api
fast_pid=$!
start_group e2e tests/e2e tests/contract tests/console
e2e_pid=$!

# Ctrl-C reaches both groups from the terminal (same process group): wait for their
# teardown. A TERM (a CI timeout) is passed on to them as an interrupt.
trap 'wait "$fast_pid" "$e2e_pid"; rm -rf "$work"; exit 130' INT
trap 'kill -INT "$fast_pid" "$e2e_pid" 2>/dev/null; wait "$fast_pid" "$e2e_pid"; rm -rf "$work"; exit 143' TERM

# Show progress while both run, each line once, prefixed with its group.
show() {
  local name="$1" shown total
  shown="$(cat "$work/$name.shown" 2>/dev/null || echo 0)"
  total="$(wc -l <"$work/$name.log" 2>/dev/null || echo 0)"
  if [ "$total" -gt "$shown" ]; then
    sed -n "$((shown + 1)),${total}p" "$work/$name.log" | sed "s/^/[$name] /"
    echo "$total" >"$work/$name.shown"
  fi
}
while kill -0 "$fast_pid" 2>/dev/null || kill -0 "$e2e_pid" 2>/dev/null; do
  sleep "${PROGRESS_EVERY_S:-20}" &
  wait $! # (a trap runs at once, not after the sleep)
  show fast
  show e2e
done
wait "$fast_pid"
fast_rc=$?
wait "$e2e_pid"
e2e_rc=$?
show fast
show e2e

status=0
for name in fast e2e; do
  if [ "$name" = fast ]; then rc=$fast_rc; else rc=$e2e_rc; fi
  echo
  echo "=== $name: exit $rc ==="
  # The summary: from the durations table to the end (or the end, if it never came).
  if grep -q 'slowest .* durations' "$work/$name.log"; then
    sed -n '/slowest .* durations/,$p' "$work/$name.log"
  else
    tail -n 40 "$work/$name.log"
  fi
  [ "$rc" = 0 ] || status=1
done
if [ "$status" = 0 ]; then
  rm -rf "$work"
else
  # What a failed test left (servers' homes and logs, temporary files) stays for a look.
  echo "kept for a look: $work (each test's temporary files, servers' logs)"
fi
exit "$status"
