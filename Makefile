# The two commands of the README: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install run test test-quick lint stop bench-ingest figures

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
# the embedded Redis. It ends with the 15 slowest tests: where the minutes go.
test: install
	SECRET_KEY=$${SECRET_KEY:-test-only-not-secret} $(BIN)/python -m pytest --durations=15 $(PYTEST_ARGS)

# The tests that start no processes, browser or cluster and take no seconds each: the
# quick run while working (`make test` runs them too, and the rest).
test-quick: install
	SECRET_KEY=$${SECRET_KEY:-test-only-not-secret} $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# Stops the embedded Redis whoever still uses it (each command stops it itself when it is
# the last one using it; this is for one left behind by a killed process).
stop:
	@test -x $(BIN)/python && $(BIN)/python -c "import os, pathlib; from config import embedded_redis; \
	  var = pathlib.Path(os.environ.get('VAR_DIR') or 'var'); \
	  print('embedded redis stopped' if embedded_redis.stop(var) else 'no embedded redis running')" || true

# mypy's Django plugin imports the settings, which start the embedded Redis when REDIS_URL
# is unset, and mypy ends with os._exit, which skips the atexit hook that stops it: a URL
# that is never connected to keeps lint from leaving a redis-server behind.
lint: install
	$(BIN)/ruff check .
	SECRET_KEY=lint DEBUG=true REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} $(BIN)/mypy .

bench-ingest: install
	SECRET_KEY=$${SECRET_KEY:-bench-only} $(BIN)/python bench/ingest.py $(BENCH_ARGS)

# bench/figures.json: the per-operation costs `manage.py capacity_plan` reads, each benchmark
# run once at a small size (about 10 minutes on 2 cores; docs/benchmarks.md: Figures). They
# need PostgreSQL and Redis (DATABASE_URL / REDIS_URL; FIGURES_REDIS_DB is the Redis logical
# database they fill and clean, rebuild.py flushes it) and wrk. An epoch's and a player's
# cost grow with the season: FIGURES_PLAYERS=10M FIGURES_CHANGES=100k (about an hour) gives
# the figures a plan for tens of millions of players should be read from.
FIGURES_REDIS_DB ?= 1
FIGURES_PLAYERS ?= 100k
FIGURES_CHANGES ?= 10k
FIGURES_RUN := SECRET_KEY=$${SECRET_KEY:-bench-only} $(BIN)/python
figures: install
	$(FIGURES_RUN) bench/memory.py --players $(FIGURES_PLAYERS) --redis-db $(FIGURES_REDIS_DB)
	$(FIGURES_RUN) bench/epoch.py --players $(FIGURES_PLAYERS) --changes $(FIGURES_CHANGES) --modes catch-up \
	  --parts 1 --repeats 3 --redis-db $(FIGURES_REDIS_DB)
	$(FIGURES_RUN) bench/rebuild.py --players 100k --runs 1 --recovery-runs 0 --redis-db $(FIGURES_REDIS_DB)
	$(FIGURES_RUN) bench/reads.py --players 100k --endpoints rank,neighbors,top --concurrency 16 --runs 2 \
	  --duration 4 --warmup 1 --paced-fraction 0 --redis-db $(FIGURES_REDIS_DB)
	$(FIGURES_RUN) bench/ingest.py --phases http --runs 1 --batches 50 --players 50000
