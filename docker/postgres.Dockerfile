# PostgreSQL from Debian's own packages, for MLflow's backend store where the public
# postgres image cannot be pulled (docker/smoke.sh builds it). It keeps that image's contract:
# POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB create the role and database on the first
# start, the data lives in /var/lib/postgresql/data, arguments go to `postgres`
# (e.g. -c port=5433), and pg_isready is on the PATH; so compose.yaml takes it as
# POSTGRES_IMAGE unchanged.
#   docker build -f docker/postgres.Dockerfile -t mtbert-postgres docker
ARG BASE=python:3.11-slim
FROM ${BASE}

COPY --chmod=0755 postgres/entrypoint.sh /usr/local/bin/postgres-entrypoint

# The major version is Debian's (15 in bookworm); the link gives its server binaries one path.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)" /usr/local/lib/postgresql-bin \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
 && chmod 0700 /var/lib/postgresql/data

ENV PATH=/usr/local/lib/postgresql-bin:$PATH \
    PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
ENTRYPOINT ["postgres-entrypoint"]
# Every interface of the container: other services reach it by name on the compose network.
CMD ["-c", "listen_addresses=*"]
