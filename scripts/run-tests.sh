#!/usr/bin/env bash
# Every test, in two groups run at the same time (`make test` calls this):
#   fast: unit, service (SQLite and PostgreSQL) and API tests — mostly CPU;
#   e2e:  end-to-end and browser tests with real containers — mostly waiting on them.
# They share no state: each PostgreSQL test makes its own database, each e2e server
# takes a flock-locked port block (tests/helpers.port_block), each group starts its own
# private `podman system service` and labels what it makes with its own installation id.
# Lines are prefixed with the group's name as they come; each group's summary is
# printed again at the end. Exits non-zero when either group fails.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST="${PYTEST:-.venv/bin/pytest}"
work="$(mktemp -d /tmp/gyt-XXXXXX)"
trap 'rm -rf "$work"' EXIT

run_group() {
  local name="$1"
  shift
  # Own temporary roots (short: unix socket paths are limited to 108 bytes); no shared
  # cache directory between the two processes.
  "$PYTEST" -q -ra --durations=10 -p no:cacheprovider --basetemp="$work/$name" "$@" \
    >"$work/$name.log" 2>&1
  echo $? >"$work/$name.rc"
}

run_group fast tests/unit tests/service tests/api &
fast_pid=$!
run_group e2e tests/e2e tests/console &
e2e_pid=$!

# Show progress while both run, each line once, prefixed with its group.
show() {
  local name="$1" offset_file="$work/$1.shown"
  local shown
  shown="$(cat "$offset_file" 2>/dev/null || echo 0)"
  local total
  total="$(wc -l <"$work/$name.log" 2>/dev/null || echo 0)"
  if [ "$total" -gt "$shown" ]; then
    sed -n "$((shown + 1)),${total}p" "$work/$name.log" | sed "s/^/[$name] /"
    echo "$total" >"$offset_file"
  fi
}
while kill -0 "$fast_pid" 2>/dev/null || kill -0 "$e2e_pid" 2>/dev/null; do
  sleep 20
  show fast
  show e2e
done
wait "$fast_pid" "$e2e_pid"
show fast
show e2e

status=0
for name in fast e2e; do
  rc="$(cat "$work/$name.rc" 2>/dev/null || echo 1)"
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
exit "$status"
