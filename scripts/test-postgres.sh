#!/usr/bin/env bash
# Start a throwaway PostgreSQL for the test suite (Debian's packages) and print its
# SQLAlchemy URL on stdout. Prints nothing when PostgreSQL cannot be started here.
set -uo pipefail
PORT=${GPUYARD_TEST_PG_PORT:-55432}
DIR=${GPUYARD_TEST_PG_DIR:-/tmp/gpuyard-test-pg}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$BIN" ] || exit 0
URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"
run_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if ! run_pg "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; then
  if [ ! -f "$DIR/PG_VERSION" ]; then
    mkdir -p "$DIR"; [ "$(id -u)" = 0 ] && chown postgres "$DIR"
    run_pg "$BIN/initdb" -D "$DIR" -U postgres --auth=trust -E UTF8 >/dev/null 2>&1 || exit 0
  fi
  run_pg "$BIN/pg_ctl" -D "$DIR" -l "$DIR/log" -w -t 30 \
    -o "-p $PORT -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null 2>&1 || exit 0
fi
echo "$URL"
