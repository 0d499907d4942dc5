# metaledger developer commands.  The two that matter:
#   make run    - serve on http://127.0.0.1:8080 with the embedded Postgres (or METALEDGER_DATABASE_URL)
#   make test   - the whole test suite against a real, throwaway Postgres
# Everything installs itself on first use (a .venv, and Debian's postgresql when its binaries are missing).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV            ?= .venv
PYTHON          ?= $(shell command -v python3.11 || command -v python3)
DATAHUB_VERSION := 1.7.0.17
HOST            ?= 127.0.0.1
PORT            ?= 8080
ARGS            ?=
TEST_WORKERS    ?= 2
UV_REQ          := $(shell grep -o '"uv==[^"]*"' pyproject.toml | tr -d '"')
UV              := $(VENV)/bin/uv
# Every venv is installed with its bytecode compiled (uv does not compile by default): a process then reads the .pyc
# files instead of compiling ~1,500 modules as it starts (4.6 s of CPU instead of 10.9 s for `import app.main` on a
# busy machine), whatever PYTHONDONTWRITEBYTECODE says — a machine with it set never writes them at import time, and
# the tests start hundreds of processes.
export UV_COMPILE_BYTECODE := 1

# The install stamp is keyed on the content of pyproject.toml and the DataHub model version: editing
# either reinstalls, anything else (a re-run, a branch switch that only touches mtimes) costs nothing.
INSTALL_KEY := $(shell cat pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)-$(DATAHUB_VERSION)
STAMP       := $(VENV)/.metaledger-installed-$(INSTALL_KEY)

.PHONY: help venv client-venv actions-venv mcp-venv chromium-bin postgres-bin java-bin zip-bin run test openapi-check docs-check lint format clean-venv spark-dist

help:
	@echo "make run            serve on $(HOST):$(PORT) (HOST=, PORT= to change)"
	@echo "make test           run the tests on TEST_WORKERS=2 workers (ARGS='-k name -x' to pass pytest arguments)"
	@echo "make venv           create/refresh $(VENV) (python3.11, project + test and spark extras, DataHub models)"
	@echo "make postgres-bin   install Debian's postgresql if its binaries are missing"
	@echo "make openapi-check  fail if openapi/ is out of date with the code"
	@echo "make docs-check     fail if docs/configuration.md is out of date with the settings, or a docs link is broken"
	@echo "make lint           ruff format --check, ruff check and mypy (make format rewrites what ruff can fix)"
	@echo "make client-venv    create .venv-client: the real DataHub client for tests/client (the tests create it too)"
	@echo "make actions-venv   create .venv-actions: DataHub Actions for tests/client (the tests create it too)"
	@echo "make mcp-venv       create .venv-mcp: DataHub's MCP server for docs/mcp.md and tests/client (the tests create it too)"
	@echo "make spark-dist     build $(SPARK_DIST)/: the Spark indexer's wheel and the dependency archive for --archives"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if ! $(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
	    test -n "$(PYTHON)" || { echo "python3.11 not found" >&2; exit 1; }; \
	    $(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
	        || { echo "$(PYTHON) is not Python 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 1; }; \
	    echo "creating $(VENV) with $(PYTHON)"; \
	    rm -rf $(VENV); \
	    $(PYTHON) -m venv $(VENV); \
	fi
	@# uv installs in seconds what pip takes minutes over (it downloads and unpacks in parallel); pip only brings uv.
	$(VENV)/bin/python -m pip install --disable-pip-version-check -q '$(UV_REQ)'
	$(UV) pip install --python $(VENV)/bin/python -q -e '.[test,spark]'
	@# The server reads DataHub's .avsc model files from this package; its code (and its 62
	@# dependencies) is never imported, hence --no-deps.
	$(UV) pip install --python $(VENV)/bin/python -q --no-deps 'acryl-datahub==$(DATAHUB_VERSION)'
	@# The example change processors (examples/change_processors), found through their entry points by the tests.
	$(UV) pip install --python $(VENV)/bin/python -q --no-deps -e examples/change_processors
	@# uv downloads and builds pyspark's source distribution again on every install here and keeps each copy in its
	@# cache (1.9 GB a time): the stale copies go (the installed files are hard links, and stay). A CI machine ran
	@# out of disk space.
	-@timeout 120 $(UV) cache prune -q
	@rm -f $(VENV)/.metaledger-installed-*
	@touch $@

# The real `datahub` client (with the `datahub-kafka` sink: confluent-kafka, fastavro), for tests/client, in its own
# virtualenv (its dependencies never touch $(VENV)). The stamp names what is installed: a change reinstalls.
CLIENT_VENV    ?= .venv-client
CLIENT_REQ     := acryl-datahub[datahub-kafka]==$(DATAHUB_VERSION)
CLIENT_STAMP   := $(CLIENT_VENV)/.acryl-datahub-datahub-kafka-$(DATAHUB_VERSION)
client-venv: $(CLIENT_STAMP)

$(CLIENT_STAMP): | $(STAMP)
	test -x $(CLIENT_VENV)/bin/python || $(UV) venv -q --seed --python $(PYTHON) $(CLIENT_VENV)
	$(UV) pip install --python $(CLIENT_VENV)/bin/python -q '$(CLIENT_REQ)'
	@rm -f $(CLIENT_VENV)/.acryl-datahub-*
	@touch $@

# DataHub Actions (`datahub actions -c pipeline.yml`, its Kafka event source), for tests/client, in a virtualenv
# of its own too.
ACTIONS_VENV   ?= .venv-actions
ACTIONS_REQ    := acryl-datahub-actions==$(DATAHUB_VERSION)
ACTIONS_STAMP  := $(ACTIONS_VENV)/.acryl-datahub-actions-$(DATAHUB_VERSION)
actions-venv: $(ACTIONS_STAMP)

$(ACTIONS_STAMP): | $(STAMP)
	test -x $(ACTIONS_VENV)/bin/python || $(UV) venv -q --seed --python $(PYTHON) $(ACTIONS_VENV)
	$(UV) pip install --python $(ACTIONS_VENV)/bin/python -q '$(ACTIONS_REQ)'
	@rm -f $(ACTIONS_VENV)/.acryl-datahub-actions-*
	@touch $@

# DataHub's MCP server (mcp-server-datahub, with the acryl-datahub it pins), for docs/mcp.md and tests/client, in a
# virtualenv of its own too.
MCP_VENV       ?= .venv-mcp
MCP_SERVER_VERSION := 0.8.0
MCP_REQ        := mcp-server-datahub==$(MCP_SERVER_VERSION)
MCP_STAMP      := $(MCP_VENV)/.acryl-mcp-server-datahub-$(MCP_SERVER_VERSION)
mcp-venv: $(MCP_STAMP)

$(MCP_STAMP): | $(STAMP)
	test -x $(MCP_VENV)/bin/python || $(UV) venv -q --seed --python $(PYTHON) $(MCP_VENV)
	$(UV) pip install --python $(MCP_VENV)/bin/python -q '$(MCP_REQ)'
	@rm -f $(MCP_VENV)/.acryl-mcp-server-datahub-*
	@touch $@

# The Spark indexer on a cluster (docs/spark-indexer.md, "The indexer on a Spark cluster"): what spark-submit ships to
# executors whose Python has PySpark, pyarrow and pandas but not metaledger.
#   $(SPARK_WHEEL)  the project with its package data (system models, the GraphQL schema)
#   $(SPARK_DEPS)   that wheel, every runtime dependency and DataHub's model files, installed into one folder and
#                   zipped: `--archives $(SPARK_DEPS)#metaledger_deps` with PYTHONPATH=metaledger_deps on executors.
#                   Compiled wheels are those of $(VENV)'s Python: the executors' must be the same version and platform.
# Keyed on content: the third-party part on pyproject.toml (about a minute to install), the project part on its sources
# (seconds); the archive's name does not change, so spark-submit lines stay as written.
SPARK_DIST       ?= dist/spark
SPARK_VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
SPARK_WHEEL      := $(SPARK_DIST)/metaledger-$(SPARK_VERSION)-py3-none-any.whl
SPARK_DEPS       := $(SPARK_DIST)/metaledger-spark-deps.zip
SPARK_SOURCES    := pyproject.toml $(sort $(shell find app spark_indexer -type f \( -name '*.py' -o -name '*.avsc' -o -name '*.graphql' \) -not -path '*/__pycache__/*' 2>/dev/null))
SPARK_KEY        := $(shell cat $(SPARK_SOURCES) | sha256sum | cut -c1-16)
SPARK_STAMP      := $(SPARK_DIST)/.built-$(SPARK_KEY)
SPARK_THIRDPARTY := build/spark-thirdparty-$(shell cat pyproject.toml | sha256sum | cut -c1-16)-$(DATAHUB_VERSION).zip
spark-dist: zip-bin $(SPARK_STAMP)

$(SPARK_THIRDPARTY): | $(STAMP)
	rm -rf build/spark-thirdparty build/spark-thirdparty-*.zip
	$(VENV)/bin/python -m pip wheel --disable-pip-version-check -q --no-deps -w build/spark-thirdparty-wheel .
	$(UV) pip install --python $(VENV)/bin/python -q --target build/spark-thirdparty build/spark-thirdparty-wheel/*.whl
	$(UV) pip install --python $(VENV)/bin/python -q --target build/spark-thirdparty --no-deps 'acryl-datahub==$(DATAHUB_VERSION)'
	rm -rf build/spark-thirdparty-wheel build/spark-thirdparty/{bin,app,spark_indexer,metaledger-*.dist-info,.lock}
	@# of acryl-datahub only its model files are read (the registry), never its code
	find build/spark-thirdparty/datahub -mindepth 1 -not -path 'build/spark-thirdparty/datahub/metadata' \
	    -not -path 'build/spark-thirdparty/datahub/metadata/schemas*' -prune -exec rm -rf {} +
	@# compiled for executors whose unpacking does not keep the files' times: a .pyc that is never checked against
	@# its source (the archive is built, never edited), so an executor's Python does not compile the modules again
	$(VENV)/bin/python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash build/spark-thirdparty >/dev/null
	cd build/spark-thirdparty && zip -q -1 -r -X ../../$@.tmp .
	mv $@.tmp $@

$(SPARK_STAMP): $(SPARK_THIRDPARTY)
	@mkdir -p $(SPARK_DIST)
	rm -rf build/lib build/bdist.* build/spark-project $(SPARK_DIST)/metaledger-*.whl  # setuptools reuses build/lib: a removed file would stay
	$(VENV)/bin/python -m pip wheel --disable-pip-version-check -q --no-deps -w $(SPARK_DIST) .
	unzip -q $(SPARK_WHEEL) -d build/spark-project
	$(VENV)/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash build/spark-project >/dev/null
	cp $(SPARK_THIRDPARTY) $(SPARK_DEPS).tmp
	cd build/spark-project && zip -q -1 -r -X -g ../../$(SPARK_DEPS).tmp .
	mv $(SPARK_DEPS).tmp $(SPARK_DEPS)
	@rm -f $(SPARK_DIST)/.built-*
	@touch $@

# `$(call apt_install,PACKAGES,WHAT THEY ARE FOR,ELSEWHERE)`: the shell that installs Debian's PACKAGES once a
# target's own check found them missing; on a machine without apt-get it says ELSEWHERE and fails. (No commas in the
# arguments: make would split them there.)
apt_install = if ! command -v apt-get >/dev/null; then \
	    echo "$(1): missing and this is not a Debian/Ubuntu machine: $(3)" >&2; \
	    exit 1; \
	fi; \
	SUDO=; if [ "$$(id -u)" -ne 0 ]; then SUDO=sudo; fi; \
	echo "installing Debian's $(1) ($(2))"; \
	$$SUDO apt-get update -q; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(1)

postgres-bin:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then exit 0; fi; \
	$(call apt_install,postgresql,server binaries for the embedded and test databases,install PostgreSQL (initdb and pg_ctl) or set METALEDGER_DATABASE_URL)

# Spark (the indexer and its tests) needs a Java 17 runtime.
java-bin:
	@if command -v java >/dev/null; then exit 0; fi; \
	$(call apt_install,openjdk-17-jre-headless,Spark runs on it,install a Java 17 runtime)

# The web view's browser tests drive Debian's chromium through its chromedriver (no browser download).
chromium-bin:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then exit 0; fi; \
	$(call apt_install,chromium chromium-driver,the web view's browser tests drive it,install Chromium and its chromedriver)

zip-bin:
	@if command -v zip >/dev/null && command -v unzip >/dev/null; then exit 0; fi; \
	$(call apt_install,zip unzip,make spark-dist packs the Spark job's archive with them,install zip and unzip)

run: venv postgres-bin
	$(VENV)/bin/metaledger serve --host $(HOST) --port $(PORT)

test: venv postgres-bin java-bin zip-bin chromium-bin
	@# the project's own modules compiled once too (a second or two; nothing when they are current)
	@$(VENV)/bin/python -m compileall -q -j 0 app spark_indexer tests bench || true  # a syntax error: pytest says more
	@rc=0; $(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5): treated as a failure" >&2; fi; \
	exit $$rc

openapi-check: venv
	$(VENV)/bin/metaledger openapi export --check

# docs/configuration.md is generated from the settings' declarations (`metaledger settings docs` writes it); the tests
# also check that every setting has a description, that docs/architecture.md names every package of app/, and that
# every relative link of README.md and docs/ reaches its file and heading.
docs-check: venv
	$(VENV)/bin/metaledger settings docs --check
	$(VENV)/bin/python -m pytest -q tests/unit/test_settings_docs.py tests/unit/test_docs.py

# The formatter, the linter and the type checker, as configured in pyproject.toml ([tool.ruff], [tool.mypy]).
LINTED := app spark_indexer tests bench migrations examples
lint: venv
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff format $(LINTED)
	$(VENV)/bin/ruff check --fix $(LINTED)

clean-venv:
	rm -rf $(VENV) $(CLIENT_VENV) $(ACTIONS_VENV)
