"""The one settings module. Everything configurable comes from the environment (README: Configuration)."""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from config.broker import broker_timeouts
from config.env import (
    ConfigError,
    dev_secret_key,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_rate,
    env_str,
    env_url,
    env_urls,
    var_dir,
)
from config.ledger_urls import ledger_databases_parse
from leaderboard.core.partitions import MAX_PARTITIONS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = var_dir()

DEBUG = env_bool("DEBUG", False)

# A deployment names its database (DATABASE_URL) and must bring a real key; a developer's
# machine on the embedded defaults (or with DEBUG on) gets a key generated once and kept
# under VAR_DIR, so every command works as printed on a fresh clone.
_secret = env_str("SECRET_KEY")
if _secret is None:
    if not DEBUG and env_str("DATABASE_URL") is not None:
        raise ConfigError(
            "SECRET_KEY is required when DATABASE_URL is set and DEBUG is off; "
            "set SECRET_KEY (e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    _secret = dev_secret_key(VAR_DIR)
SECRET_KEY: str = _secret

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "audit",
    "seasons",
    "leaderboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database: PostgreSQL in production and CI, a SQLite file as the embedded default.
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'leaderboard.sqlite3'}")
_db = dj_database_url.parse(DATABASE_URL or "", conn_max_age=env_int("DB_CONN_MAX_AGE", 60))
_db["CONN_HEALTH_CHECKS"] = True
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN: writers queue instead of failing with
    # "database is locked" on upgrade, and ledger ids are handed out in commit order.
    _db["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
    _db["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
elif _db["ENGINE"] == "django.db.backends.postgresql" and (DB_POOL_SIZE := env_int("DB_POOL_SIZE", 8, minimum=0)) > 0:
    # Under ASGI Django runs each request's sync view in a thread of its own, and its
    # connections are per thread: a persistent connection (CONN_MAX_AGE) is never reused
    # and lingers until that thread is collected. 32 concurrent writers exhausted
    # PostgreSQL's 100 connections ("too many clients", 500s). A pool per process
    # reuses connections and bounds them to DB_POOL_SIZE; CONN_MAX_AGE must then be 0.
    _db["CONN_MAX_AGE"] = 0
    _db["OPTIONS"] = {
        **_db.get("OPTIONS", {}),
        "pool": {
            "min_size": 1,
            "max_size": DB_POOL_SIZE,
            "timeout": env_float("DB_POOL_TIMEOUT", 10.0, minimum=0.1),
            # A connection attempt the server refuses is retried for this long (after 1 s),
            # then given up; the next request that needs a connection starts a new one at
            # once: a pool finds the server back within a second or two of an outage's end.
            "reconnect_timeout": 1.0,
        },
    }
# Ledger partitions of new seasons in PostgreSQL databases of their own (docs/operations.md,
# Ledger databases): "4-7=postgresql://host/lb_ledger_b ..."; each database is the alias
# ledger_<name>. A season records where its partitions live when it is created
# (Season.ledger_databases), so a later change applies to new seasons only.
LEDGER_PARTITION_URLS = env_str("LEDGER_PARTITION_URLS", "") or ""
_ledger_databases, LEDGER_PARTITION_ALIASES = ledger_databases_parse(
    LEDGER_PARTITION_URLS, default=_db, max_partitions=MAX_PARTITIONS)
DATABASES = {"default": _db, **_ledger_databases}
# A pooled PostgreSQL database goes through config/postgresql: while the server refuses
# connections and the pool holds none, a request fails at once (a 503) instead of waiting
# DB_POOL_TIMEOUT for a connection it cannot have.
for _alias, _database in DATABASES.items():
    if _database["ENGINE"] == "django.db.backends.postgresql" and _database.get("OPTIONS", {}).get("pool"):
        DATABASES[_alias] = {**_database, "ENGINE": "config.postgresql"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: the materialized views; the Celery broker and the channel layer, by default
# on the same server (docs/operations.md: Deploying).
# REDIS_CLUSTER: REDIS_URL names any node of a Redis Cluster holding the rank views.
REDIS_CLUSTER = env_bool("REDIS_CLUSTER", False)
_redis_url = env_str("REDIS_URL")
if REDIS_CLUSTER and _redis_url is None:
    raise ConfigError("REDIS_CLUSTER is true but REDIS_URL is unset: set REDIS_URL to a node of the cluster")
if _redis_url is None:
    # Importing the settings starts no server: the process's entry point does
    # (config.embedded_redis.environ_ensure), and sets REDIS_URL for it.
    raise ConfigError("REDIS_URL is unset: set it to your Redis server, or start the process through "
                      "manage.py, config.asgi, config.wsgi or config.celery (pytest: -p config.pytest_plugin), "
                      "which start the embedded Redis when it is unset")
# The embedded server's URL, set by the entry point that started it (or by its parent).
REDIS_EMBEDDED = env_bool("REDIS_EMBEDDED", False)
REDIS_URL: str = _redis_url
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "lb") or "lb"
# Slot groups a new copy of the rank views spreads its data keys over (docs/architecture.md,
# Redis Cluster): each group is one hash slot, so a season reaches every master of a
# cluster with many more groups than masters. Recorded per copy and manifest when the copy
# is built; a change applies to copies built afterwards.
VIEW_SLOT_GROUPS = env_int("VIEW_SLOT_GROUPS", 64, minimum=1)
# The fewest lookup shards an index is built with (rounded up to a power of two): 128 hold
# 12,288 players before the season outgrows them and asks for a rebuild; each empty shard
# costs a key.
VIEW_LOOKUP_SHARDS_MIN = env_int("VIEW_LOOKUP_SHARDS_MIN", 128, minimum=1)
# Replicas of each master that must acknowledge a copy's writes (Redis WAIT) before the copy
# is trusted and published, and how long to wait for them: Redis replicates asynchronously,
# so a failover can promote a replica that lacks writes its master acknowledged. 0 (the
# default, a single Redis): no wait; a cluster with one replica per master sets 1.
VIEW_REPLICAS_WAIT = env_int("VIEW_REPLICAS_WAIT", 0, minimum=0)
VIEW_REPLICAS_WAIT_MS = env_int("VIEW_REPLICAS_WAIT_MS", 1000, minimum=1)

# Neither Celery's Redis transport nor channels-redis can use a Redis Cluster (their
# commands span keys of many slots), so with a cluster both must be named; without one
# they default to REDIS_URL.
_roles_unset = [name for name in ("CELERY_BROKER_URL", "CHANNEL_LAYER_URL") if env_str(name) is None]
if REDIS_CLUSTER and _roles_unset:
    raise ConfigError(
        f"REDIS_CLUSTER is true and {' and '.join(_roles_unset)} {'is' if len(_roles_unset) == 1 else 'are'} "
        "unset: a Redis Cluster cannot be the Celery broker or the channel layer; set CELERY_BROKER_URL "
        "(a plain Redis or RabbitMQ amqp://) and CHANNEL_LAYER_URL (one or more plain Redis servers)"
    )
# A plain Redis or RabbitMQ (amqp://user:password@host:5672/vhost, through kombu's py-amqp).
CELERY_BROKER_URL: str = env_url("CELERY_BROKER_URL", REDIS_URL, schemes=("redis", "rediss", "unix", "amqp", "amqps"))
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
# How long the broker may leave a connect, a reply or a write unanswered: a broker that
# hangs instead of refusing makes an enqueue give up (BROKER_ENQUEUE_BOUND_SECONDS, twice
# this) instead of holding a request or an epoch for ever. Per transport, with the
# publish retry policy that keeps that bound (config/broker.py says what each option does).
BROKER_TIMEOUT_SECONDS = env_float("BROKER_TIMEOUT_SECONDS", 2.0, minimum=0.1)
_broker = broker_timeouts(CELERY_BROKER_URL, timeout=BROKER_TIMEOUT_SECONDS)
BROKER_ENQUEUE_BOUND_SECONDS = _broker.enqueue_bound_seconds
CELERY_BROKER_TRANSPORT_OPTIONS = _broker.transport_options
CELERY_BROKER_CONNECTION_TIMEOUT = _broker.timeout
CELERY_BROKER_POOL_ACQUIRE_TIMEOUT = _broker.timeout
CELERY_TASK_PUBLISH_RETRY_POLICY = _broker.publish_retry_policy

# One plain Redis, or several comma-separated: channels-redis then shards channels and
# groups over them by a hash of the name (every web process must list them in the same order).
CHANNEL_LAYER_URLS: list[str] = env_urls("CHANNEL_LAYER_URL", [REDIS_URL], schemes=("redis", "rediss", "unix"))
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels-redis polls with a 5 s BZPOPMIN; redis-py 8 times reads out after 5 s
        # by default, which would fail every idle wait.
        "CONFIG": {
            "hosts": [{"address": url, "socket_timeout": 15} for url in CHANNEL_LAYER_URLS],
            "prefix": f"{REDIS_KEY_PREFIX}:asgi",
        },
    }
}
# A live socket whose client stops reading is closed (4408) after this long.
LIVE_SEND_TIMEOUT_SECONDS = env_float("LIVE_SEND_TIMEOUT_SECONDS", 5.0, minimum=0.1)
# An epoch's announcement of a version gives up after this long (a hung layer would hold it
# for the layer's socket timeout); the live boards find the version themselves meanwhile.
LIVE_ANNOUNCE_TIMEOUT_SECONDS = env_float("LIVE_ANNOUNCE_TIMEOUT_SECONDS", 1.0, minimum=0.05)
# Each server process re-joins its seasons' groups this often, so a group Redis lost comes back.
LIVE_GROUP_REFRESH_SECONDS = env_float("LIVE_GROUP_REFRESH_SECONDS", 30.0, minimum=1.0)

# --- Leaderboard behaviour.
EPOCH_SECONDS = env_float("EPOCH_SECONDS", 1.0, minimum=0.05)
# A coordinator's lease on a season, renewed every third of it while the coordinator works
# (fenced: only under its own token); a crashed one is replaced after this long.
EPOCH_LEASE_SECONDS = env_float("EPOCH_LEASE_SECONDS", 2.0, minimum=0.5)
# A read gives up and retries on the current version after READ_DEADLINE_SECONDS; a copy
# is mutated only COPY_GRACE_SECONDS after it stopped being current, so no read that
# respects its deadline ever sees a copy change under it (the generation check is the
# second guard).
READ_DEADLINE_SECONDS = env_float("READ_DEADLINE_SECONDS", 0.2, minimum=0.01)
COPY_GRACE_SECONDS = env_float("COPY_GRACE_SECONDS", 0.5, minimum=0.02)
# Players a read process remembers the last lookup value of, so that a player reading
# again with the same score on the same version is answered in one round trip instead of
# two (leaderboard/views/rankview/reads.py). About 200 bytes each (40 MB at the default,
# the players a process serves when a load balancer routes each player to one of ~250);
# 0 turns it off.
READ_PLACE_HINTS = env_int("READ_PLACE_HINTS", 200_000, minimum=0)
# After publishing, the coordinator brings the other copy up to date once its grace
# period is over, so the next epoch applies each change once before its pointer swap
# instead of twice (R = 2). False leaves that work to the next epoch.
EPOCH_CATCH_UP = env_bool("EPOCH_CATCH_UP", True)
# An epoch's changes are applied by this many parts at once, each owning some of the
# season's ledger partitions (at most one part a partition): the coordinator runs one and
# Celery workers the others (leaderboard/views/parts.py). 1: the coordinator applies all.
EPOCH_PARTS = env_int("EPOCH_PARTS", 1, minimum=1, maximum=64)
# A part no worker has claimed this long after it was sent is run by the coordinator.
EPOCH_PART_CLAIM_SECONDS = env_float("EPOCH_PART_CLAIM_SECONDS", 0.25, minimum=0.0)
# A part whose runner is alive but has not reported after this long stops its epoch: the
# next lease holder resumes it (the stuck runner's writes are fenced out by its token).
EPOCH_PART_TIMEOUT_SECONDS = env_float("EPOCH_PART_TIMEOUT_SECONDS", 10.0, minimum=0.5)
# A coordinator whose epoch makes no progress for this long (a Redis or PostgreSQL call
# that does not return) stops renewing its lease, so another worker takes the season one
# lease (EPOCH_LEASE_SECONDS) later: at most 6 + 2 = 8 s by default. A copy's build renews
# with each batch, under its own longer lease (30 s).
EPOCH_STALL_SECONDS = env_float("EPOCH_STALL_SECONDS", 6.0, minimum=0.5)
# The ASGI server answers the public read URLs before Django (leaderboard/api/fastpath.py)
# with READ_THREADS threads per process; false sends them through Django's views.
READ_FAST_PATH = env_bool("READ_FAST_PATH", True)
READ_THREADS = env_int("READ_THREADS", 8, minimum=1)
# A public read (and its rate limit) waits this long for each Redis reply: a Redis that
# hangs instead of refusing costs a read at most about twice this, then it answers 503,
# while the views' other clients keep the longer SOCKET_TIMEOUT (leaderboard/redis_client.py).
READ_REDIS_TIMEOUT_SECONDS = env_float("READ_REDIS_TIMEOUT_SECONDS", 1.0, minimum=0.05)
if COPY_GRACE_SECONDS <= READ_DEADLINE_SECONDS:
    raise ConfigError("COPY_GRACE_SECONDS must be longer than READ_DEADLINE_SECONDS")
# Ingest is sealed automatically this long after the cutoff (staff can seal earlier);
# pre-cutoff results that arrive later go to the late-results queue.
SEAL_AFTER_CUTOFF_SECONDS = env_float("SEAL_AFTER_CUTOFF_SECONDS", 600.0, minimum=0.0)
# Ledger partitions of a new season (docs/operations.md, Sizing ledger partitions): its
# players are split into this many partitions, each with its own write lock, so batches on
# disjoint partitions commit in parallel. Fixed at creation; `manage.py season_repartition`
# moves a season to another count.
SEASON_PARTITIONS = env_int("SEASON_PARTITIONS", 8, minimum=1, maximum=MAX_PARTITIONS)
# Stratified sample of ranks and neighbour windows a shadow build is compared on.
REBUILD_SAMPLE_SIZE = env_int("REBUILD_SAMPLE_SIZE", 1000, minimum=1)
# A shadow build whose worker has not moved its heartbeat (every quarter of this, at most
# 10 s) for this long is failed by the season's next rebuild or recovery, or by
# `manage.py rebuild_views SEASON --fail-stale`: a killed builder never blocks recovery.
REBUILD_STALE_SECONDS = env_float("REBUILD_STALE_SECONDS", 60.0, minimum=1.0)
# A queued rebuild job no worker has taken this long after it was queued (its message never
# reached a broker that did not answer, or waits behind busy workers) is sent again by
# beat's rebuild_jobs_resend, as often: the heartbeat's period, so a job whose sends land
# never looks stale (leaderboard/recovery/rebuild.py rebuild_jobs_resend_due).
REBUILD_RESEND_SECONDS = min(max(REBUILD_STALE_SECONDS / 4, 1.0), 10.0)
# Continuous reconciliation of each season's current version (Celery beat).
RECONCILE_SECONDS = env_float("RECONCILE_SECONDS", 60.0, minimum=1.0)
RECONCILE_SAMPLE_SIZE = env_int("RECONCILE_SAMPLE_SIZE", 200, minimum=1)
RECONCILE_FULL = env_bool("RECONCILE_FULL", False)
# Stratified sample of ranks recomputed on the ledger for a FINAL candidate.
FINAL_SAMPLE_SIZE = env_int("FINAL_SAMPLE_SIZE", 1000, minimum=1)
# The staff console's overview charts: every live season's ingest rate, publication lag,
# epoch duration and version age are sampled this often (Celery beat) and kept this long.
METRICS_SAMPLE_SECONDS = env_float("METRICS_SAMPLE_SECONDS", 10.0, minimum=1.0)
METRICS_HISTORY_SECONDS = env_float("METRICS_HISTORY_SECONDS", 86_400.0, minimum=60.0)
# How often beat checks that Redis still holds the players' names (refilled from the
# database when it lost them: leaderboard.profiles.names_recover).
NAMES_CHECK_SECONDS = env_float("NAMES_CHECK_SECONDS", 60.0, minimum=1.0)
# How often beat looks for full hours (UTC) an accepting season has no snapshot of yet
# (docs/rules.md, Movement and history): a tick after the hour takes it.
SNAPSHOT_CHECK_SECONDS = env_float("SNAPSHOT_CHECK_SECONDS", 60.0, minimum=1.0)
CELERY_BEAT_SCHEDULE = {
    "leaderboard-reconciliation": {
        "task": "leaderboard.tasks.reconciliations_dispatch",
        "schedule": RECONCILE_SECONDS,
        "options": {"expires": RECONCILE_SECONDS},
    },
    "seasons-lifecycle": {
        "task": "seasons.tasks.seasons_lifecycle",
        "schedule": env_float("LIFECYCLE_TICK_SECONDS", 10.0, minimum=0.5),
        "options": {"expires": 10.0},
    },
    "leaderboard-epochs": {
        "task": "leaderboard.tasks.epochs_dispatch",
        "schedule": EPOCH_SECONDS,
        "options": {"expires": max(EPOCH_SECONDS * 2, 1.0)},
    },
    "leaderboard-metrics-samples": {
        "task": "leaderboard.tasks.metrics_sample",
        "schedule": METRICS_SAMPLE_SECONDS,
        "options": {"expires": METRICS_SAMPLE_SECONDS},
    },
    "leaderboard-rebuild-resend": {
        "task": "leaderboard.tasks.rebuild_jobs_resend",
        "schedule": REBUILD_RESEND_SECONDS,
        "options": {"expires": REBUILD_RESEND_SECONDS},
    },
    "leaderboard-names-recover": {
        "task": "leaderboard.tasks.names_recover_task",
        "schedule": NAMES_CHECK_SECONDS,
        "options": {"expires": NAMES_CHECK_SECONDS},
    },
    "leaderboard-snapshots": {
        "task": "leaderboard.tasks.snapshots_take",
        "schedule": SNAPSHOT_CHECK_SECONDS,
        "options": {"expires": SNAPSHOT_CHECK_SECONDS},
    },
}
# bench/reads.py only: routes /bench/baseline/... (rank from one plain sorted set) so the
# read benchmark can compare against it in the same server stack. Off in production.
BENCH_BASELINE = env_bool("BENCH_BASELINE", False)
# The largest request body on any URL (a full batch of 1,000 events is about 250 KB);
# beyond it the ASGI server answers 413 before reading it (leaderboard/api/bodylimit.py).
SCORES_MAX_BODY_BYTES = env_int("SCORES_MAX_BODY_BYTES", 2 * 1024 * 1024, minimum=1024)
# A write batch's statements on PostgreSQL (its locks, its reads, its one insert) each give
# up after this long: a table locked by someone else, a server that stalls, answer the
# client 503 (retry-safe, nothing written) instead of holding its request for ever. A
# batch of 1,000 events takes ~0.1-0.6 s; the epochs, rebuilds and checks are not bound.
WRITE_STATEMENT_TIMEOUT_SECONDS = env_float("WRITE_STATEMENT_TIMEOUT_SECONDS", 5.0, minimum=0.05)
DATA_UPLOAD_MAX_MEMORY_SIZE = SCORES_MAX_BODY_BYTES

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["leaderboard.api.rendering.OrjsonRenderer"],
    "DEFAULT_PARSER_CLASSES": ["leaderboard.api.rendering.OrjsonParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "leaderboard.api.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# The OpenAPI schema (/api/schema/) and its browsable page (/api/docs/), whose Swagger UI
# assets are served from the sidecar package's static files: no CDN.
SPECTACULAR_SETTINGS = {
    "TITLE": "Seasonal leaderboard API",
    "DESCRIPTION": (
        "Score writes from the trusted match service, player profiles (regions) and friend lists from the "
        "profile and social services, versioned public reads, the FINAL standings and dispute filing. "
        "Every error body is {\"error\": code, \"detail\": text, ...}; see docs/api.md."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "leaderboard.api.schema.probes_add",
    ],
}

# --- Security: safe unless DEBUG says this is a developer's machine.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Behind a TLS-terminating proxy the client's scheme and address come from the proxy's
# X-Forwarded-Proto / X-Forwarded-For headers; without one those headers are the client's
# own words and are ignored.
BEHIND_TLS_PROXY = env_bool("BEHIND_TLS_PROXY", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_TLS_PROXY else None
# Rate limits (leaderboard/ratelimit.py), token buckets in Redis shared by every process,
# "COUNT/PERIOD[:BURST]" or "off". Public reads per client address; staff sign-in attempts
# per address and per user name. They fail open: with Redis unreachable nothing is limited.
READ_RATE_LIMIT = env_rate("READ_RATE_LIMIT", "1000/s:2000")
LOGIN_RATE_LIMIT = env_rate("LOGIN_RATE_LIMIT", "10/m:20")
# Live sockets one server process holds open, per client address and in all.
LIVE_SOCKETS_PER_ADDRESS = env_int("LIVE_SOCKETS_PER_ADDRESS", 100, minimum=1)
LIVE_SOCKETS_PER_PROCESS = env_int("LIVE_SOCKETS_PER_PROCESS", 20_000, minimum=1)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 3600, minimum=0)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# /metrics and the details of /readyz (they name every season and each dependency's
# error): with a token set, only a request bearing it ("Authorization: Bearer ..."); unset,
# only a loopback client that no proxy forwarded. Everyone else gets 403 on /metrics and
# a bare status on /readyz.
METRICS_TOKEN = env_str("METRICS_TOKEN")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # Django's default config gives "django" a console handler of its own (DEBUG only) and
    # lets it propagate to root as well: every 4xx warning of django.request came out twice.
    # Here it has none, so its records reach the console once, through root.
    "loggers": {"django": {"handlers": [], "level": "INFO", "propagate": True}},
}
