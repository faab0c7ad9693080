#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL 15 cluster, then stop and delete it.
#
#   scripts/with-postgres.sh pytest -q
#
# The cluster lives in a fresh temp dir, listens on a free loopback port with its
# socket inside that dir, and is stopped however the command ends (trap). initdb
# refuses root, so as root (CI) the cluster runs as the `postgres` OS user via
# runuser. The command sees:
#   HYPERPLACE_TEST_POSTGRES_URL  postgresql+psycopg://... of an empty database
#   HYPERPLACE_TEST_PGDATA        the data dir, and HYPERPLACE_TEST_PG_CTL a pg_ctl
#                                  wrapper, so fault tests can stop/start the server.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
if [ ! -x "$PG_BIN/initdb" ]; then
  echo "PostgreSQL server binaries not found in $PG_BIN (Debian: apt-get install postgresql-15)" >&2
  exit 1
fi

workdir=$(mktemp -d /tmp/hyperplace-pg.XXXXXX)
chmod 755 "$workdir"
as_pg=()
if [ "$(id -u)" = "0" ]; then
  chown postgres: "$workdir"
  as_pg=(runuser -u postgres --)
fi
pgdata="$workdir/data"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')

cleanup() {
  "${as_pg[@]}" "$PG_BIN/pg_ctl" -D "$pgdata" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

"${as_pg[@]}" "$PG_BIN/initdb" -D "$pgdata" -U postgres --auth=trust -E UTF8 --no-locale >"$workdir/initdb.log" 2>&1 \
  || { cat "$workdir/initdb.log" >&2; exit 1; }
pg_options="-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$workdir -c fsync=off -c full_page_writes=off -c synchronous_commit=on -c max_connections=200"
"${as_pg[@]}" "$PG_BIN/pg_ctl" -D "$pgdata" -o "$pg_options" -l "$workdir/server.log" -w -t 60 start >/dev/null
"${as_pg[@]}" "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres hyperplace_test

# A pg_ctl wrapper fault tests can call as: "$HYPERPLACE_TEST_PG_CTL" stop -m immediate / start
cat >"$workdir/pg_ctl" <<WRAP
#!/usr/bin/env bash
if [ "\$1" = "start" ]; then
  exec ${as_pg[*]} "$PG_BIN/pg_ctl" -D "$pgdata" -o "$pg_options" -l "$workdir/server.log" -w -t 60 start
fi
exec ${as_pg[*]} "$PG_BIN/pg_ctl" -D "$pgdata" -w "\$@"
WRAP
chmod 755 "$workdir/pg_ctl"

export HYPERPLACE_TEST_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:$port/hyperplace_test"
export HYPERPLACE_TEST_PGDATA="$pgdata"
export HYPERPLACE_TEST_PG_CTL="$workdir/pg_ctl"
echo "PostgreSQL 15 test cluster on 127.0.0.1:$port ($workdir)"
set +e
"$@"
status=$?
set -e
exit $status
