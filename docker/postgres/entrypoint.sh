#!/bin/sh
# Start PostgreSQL; on an empty data folder first create the cluster, with POSTGRES_USER as
# its superuser (password POSTGRES_PASSWORD, required) and the database POSTGRES_DB.
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    # The password goes through a file of the container's own, never the command line.
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    # Local socket: trust (only this container's processes reach it). TCP: password only.
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 \
        --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        # A server on the socket only, so nothing connects before the database exists.
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
        createdb -U "$user" "$db"
        pg_ctl -D "$PGDATA" -m fast -w stop
    fi
fi
exec postgres -D "$PGDATA" "$@"
