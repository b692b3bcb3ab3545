# Everything a newcomer needs: `make run` and `make test` set themselves up.
# `make run` installs only the local engine; `make test` installs everything.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
APT_PKGS := zookeeper libnetty-java openssl prometheus redis-server postgresql
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON = $(abspath $(BIN))/python

.PHONY: run test bench venv apt-deps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Two sets of packages: what the local engine needs (`make run`, a small venv) and
# everything (`make test`, `make bench`: Spark, the server clients, pytest, matplotlib).
# Each stamp depends on pyproject.toml so a new dependency reinstalls.
.stamp-venv: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

.stamp-all: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[spark,servers,test,bench]'
	touch $@ .stamp-venv

venv: .stamp-venv

# Debian packages for the real servers the tests start (ZooKeeper, Prometheus, Redis, PostgreSQL).
.stamp-apt:
	@if [ "$$(id -u)" = 0 ]; then \
	  missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi; \
	else echo "not root: assuming $(APT_PKGS) are installed"; fi
	touch $@

apt-deps: .stamp-apt

run: .stamp-venv
	$(BIN)/topo run configs/wordcount.yaml
	$(BIN)/python -m topo.examples.wordcount wordcount.db

test: .stamp-all .stamp-apt
	$(BIN)/python -m pytest -q -ra

bench: .stamp-all .stamp-apt
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .stamp-venv .stamp-all .stamp-apt build *.egg-info
