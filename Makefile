# The two commands of the README: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install run test lint stop bench-ingest

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

# The service with a demo season: migrations, a demo season and API client, the ASGI
# server, a Celery worker and beat, and a match simulator. Ctrl-C stops all of it.
run: install
	DEBUG=$${DEBUG:-true} $(BIN)/python manage.py rundemo

# The whole test suite; DATABASE_URL / REDIS_URL select real servers, else SQLite and
# the embedded Redis.
test: install
	SECRET_KEY=$${SECRET_KEY:-test-only-not-secret} $(BIN)/python -m pytest $(PYTEST_ARGS)

# Stops the embedded Redis whoever still uses it (each command stops it itself when it is
# the last one using it; this is for one left behind by a killed process).
stop:
	@test -x $(BIN)/python && $(BIN)/python -c "import os, pathlib; from config import embedded_redis; \
	  var = pathlib.Path(os.environ.get('VAR_DIR') or 'var'); \
	  print('embedded redis stopped' if embedded_redis.stop(var) else 'no embedded redis running')" || true

lint: install
	$(BIN)/ruff check .
	SECRET_KEY=lint DEBUG=true $(BIN)/mypy .

bench-ingest: install
	SECRET_KEY=$${SECRET_KEY:-bench-only} $(BIN)/python bench/ingest.py $(BENCH_ARGS)
