# The MLflow tracking server: PostgreSQL backend store (psycopg2), S3/MinIO artifact store
# (boto3), basic-auth app (the auth extra). Build context: docker/ (see compose.yaml).
#   docker build -f docker/mlflow.Dockerfile -t mtbert-mlflow docker
# BASE as in docker/Dockerfile: any Debian-like image with python3 and its venv module.
ARG BASE=python:3.11-slim
FROM ${BASE}

# Keep equal to the client's MLflow (the project's .venv); a newer server is fine, an older
# one may lack endpoints the client calls.
ARG MLFLOW_VERSION=3.17.2
ARG APP_UID=1000

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini

# Tiny and rarely changed: before the install, where a layer costs least to store.
COPY mlflow/basic_auth.ini /etc/mlflow/basic_auth.ini
COPY mlflow/ensure_user.py /usr/local/bin/mlflow-ensure-user
COPY --chmod=0755 healthcheck.py /usr/local/bin/mtbert-healthcheck

RUN useradd --create-home --uid ${APP_UID} mlflow \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install "mlflow[auth]==${MLFLOW_VERSION}" "psycopg2-binary>=2.9" "boto3>=1.34" \
 && mkdir -p /mlflow/auth \
 && chown -R mlflow:mlflow /mlflow

USER mlflow
WORKDIR /mlflow
EXPOSE 5000
CMD ["mlflow", "server", "--help"]
