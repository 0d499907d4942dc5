# syntax=docker/dockerfile:1
#
# One Dockerfile, two targets that share every layer up to the project install:
#
#   runtime  metaledger's HTTP server (no JVM: ~250 MB smaller, fewer CVEs to patch)
#   spark    runtime + a Java 17 JRE + PySpark, for `python -m spark_indexer`
#
#   docker build --target runtime -t metaledger .
#   docker build --target spark   -t metaledger-spark .
#
# The project is installed *editable* from /app on purpose: app.settings.PROJECT_ROOT is the directory
# above the `app` package, and migrations/, openapi/ and entity_registry.yml are found from there.  A
# plain `pip install .` would put `app` in site-packages and those paths would point into it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS runtime

ARG DATAHUB_VERSION=1.7.0.17
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    METALEDGER_DATA_DIR=/var/lib/metaledger

WORKDIR /app

# Dependencies first, from pyproject.toml alone, so that code changes do not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
# DataHub's model files (.avsc) are read from this package; its code and its 62 dependencies are not used.
RUN pip install --no-deps "acryl-datahub==${DATAHUB_VERSION}"

COPY . .
RUN pip install --no-deps -e . \
    && useradd --system --uid 10001 --home-dir /var/lib/metaledger --create-home metaledger \
    && install -d -o metaledger -g metaledger /var/lib/metaledger /checkpoints

USER metaledger
EXPOSE 8080
CMD ["metaledger", "serve", "--host", "0.0.0.0", "--port", "8080"]


FROM runtime AS spark

USER root
# openjdk's postinst expects man directories that slim images strip; procps gives Spark's scripts `ps`.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
# PySpark finds `java` on PATH (JAVA_HOME is arch-specific on Debian, so it is not hard-coded).
# The `spark` extra of pyproject.toml (pyspark, pyarrow, pandas); the project itself is already installed.
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['spark']))" \
        > /tmp/requirements-spark.txt \
    && pip install -r /tmp/requirements-spark.txt \
    && rm /tmp/requirements-spark.txt
ENV METALEDGER_SPARK_WORK_DIR=/checkpoints
USER metaledger
VOLUME ["/checkpoints"]
CMD ["python", "-m", "spark_indexer", "stream", "--checkpoint", "/checkpoints"]
