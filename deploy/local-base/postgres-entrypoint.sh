#!/bin/sh
# Entry point of the postgres:16 stand-in (Containerfile.postgres): on first start, a cluster
# whose superuser is $POSTGRES_USER with $POSTGRES_PASSWORD and a database $POSTGRES_DB (as the
# official image makes); then the server on every interface, password authentication for TCP.
set -eu
user=${POSTGRES_USER:-postgres}
database=${POSTGRES_DB:-$user}
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  password=$(mktemp)
  printf '%s' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}" >"$password"
  chown postgres "$password"
  runuser -u postgres -- initdb -D "$PGDATA" -U "$user" --pwfile="$password" \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C
  rm -f "$password"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$database" != postgres ]; then
    runuser -u postgres -- pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start
    runuser -u postgres -- createdb -U "$user" "$database"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -w stop
  fi
fi
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*' \
  -c unix_socket_directories=/var/run/postgresql
