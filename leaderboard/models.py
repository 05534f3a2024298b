from __future__ import annotations

from django.db import models

from leaderboard.core.ledger import RECORDED_STATUSES
from leaderboard.core.partitions import Watermark


class ApiClient(models.Model):
    """A machine identity (the match-results service). Only a hash of its token is kept."""

    name = models.CharField(max_length=100, unique=True)
    token_prefix = models.CharField(max_length=12)
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def has_scope(self, scope: str) -> bool:
        return self.active and scope in self.scopes

    def __str__(self) -> str:
        return self.name


class ScoreEvent(models.Model):
    """The immutable ledger: one row per received event id, whatever its outcome.

    A database trigger (migration 0002) refuses UPDATE, so a row can never be rewritten.
    """

    # No database FK constraint or season-only index on the ledger's hot tables: each
    # deferred FK check and each extra index costs every one of a batch's rows inside
    # the season write lock (17.0k vs 13.6k events/s measured, README). Seasons and API
    # clients are never deleted (PROTECT still holds in the ORM), the writers read the
    # season under the lock, and the composite indexes all lead with season_id. A ledger
    # partition may also live in a database of its own (LEDGER_PARTITION_URLS) that holds
    # no Season or ApiClient rows, where such a constraint could never hold.
    season = models.ForeignKey(
        "seasons.Season", on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    event_id = models.CharField(max_length=64)
    match_id = models.CharField(max_length=64)
    player_id = models.CharField(max_length=64)
    best_score = models.BigIntegerField()
    score_version = models.BigIntegerField()
    completed_at = models.DateTimeField()
    # When the player reached best_score, to the millisecond: as sent, else completed_at.
    # Null on rows from before it was recorded.
    reached_at = models.DateTimeField(null=True)
    kind = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    payload_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=[(s, s) for s in RECORDED_STATUSES])
    status_reason = models.CharField(max_length=64, blank=True)
    # A sum season's event (best_score 0): the points it adds, or for a correction the
    # amended points of the result it names in `corrects`. Null in other seasons.
    points = models.BigIntegerField(null=True)
    # Null, not "": the partial index below holds only the rows that name a result.
    corrects = models.CharField(max_length=64, null=True)  # noqa: DJ001
    # The player's score and version once this event was decided.
    score_after = models.BigIntegerField(null=True)
    version_after = models.BigIntegerField(null=True)
    pending_version = models.BigIntegerField(null=True)
    client = models.ForeignKey(
        ApiClient, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["season", "event_id"], name="score_event_unique_event_id"),
        ]
        indexes = [
            models.Index(fields=["season", "player_id", "id"], name="score_event_player"),
            # A sum season's corrections by the result they amend; partial, so no other
            # row pays for it inside the partitions' locks.
            models.Index(fields=["season", "corrects"], name="score_event_corrects",
                         condition=models.Q(corrects__isnull=False)),
        ]


class ScoreEventConflict(models.Model):
    """A reuse of an event id with another payload (outcome `conflict`): kept for forensics,
    never applied, written in the batch's transaction. Append-only, like the ledger
    (migration 0010); the console shows it on the player's and the season's pages."""

    # No database FK constraints: a ledger partition's rows may live in a database of its own
    # (LEDGER_PARTITION_URLS), which holds no Season or ApiClient rows (see ScoreEvent).
    season = models.ForeignKey("seasons.Season", on_delete=models.PROTECT, related_name="+", db_constraint=False)
    event_id = models.CharField(max_length=64)
    payload_hash = models.CharField(max_length=64)
    payload = models.JSONField()
    client = models.ForeignKey(ApiClient, null=True, on_delete=models.PROTECT, related_name="+", db_constraint=False)
    received_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["season", "event_id"], name="score_conflict_by_event")]


class PlayerScore(models.Model):
    """The current season score of each player: with the ledger, the source of truth."""

    # Like ScoreEvent: no FK constraint or season-only index on a hot table.
    season = models.ForeignKey(
        "seasons.Season", on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    player_id = models.CharField(max_length=64)
    score = models.BigIntegerField()
    score_version = models.BigIntegerField()
    # When the player reached `score` (docs/rules.md, Ties decided by who got there first);
    # kept in every season, orders ties only in a first_reached one.
    reached_at = models.DateTimeField(null=True)
    # The player's region in this season ("" none): the profile's region when it is one of
    # the season's regions, taken with the first score and moved by profile changes until
    # the season is sealed (docs/rules.md, Regional and friends boards).
    # A database default too: the bulk loader's COPY and older writers name no region.
    region = models.CharField(max_length=16, blank=True, default="", db_default="")
    # A staff revocation the match service has not acknowledged yet: results that would
    # raise the score above it are held for staff (docs/rules.md, Revocations that stick).
    revoked_to = models.BigIntegerField(null=True, blank=True)
    # Taken off every board of the season by staff (docs/rules.md, Hidden players): their
    # events still apply to `score`; the boards, totals and FINAL leave them out. A
    # database default too, so the bulk loader's COPY and the batch upsert leave it as is.
    hidden = models.BooleanField(default=False, db_default=False)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["season", "player_id"], name="player_score_unique_player"),
        ]
        indexes = [
            models.Index(fields=["season", "score"], name="player_score_by_score"),
            # The few hidden players of a season (a snapshot lists them): partial, so the
            # writes of everyone else pay nothing for it.
            models.Index(fields=["season"], condition=models.Q(hidden=True), name="player_score_hidden"),
        ]


class ScoreChange(models.Model):
    """The durable change stream (ScoreChanged, docs/rules.md: The change stream), written with the ledger.

    `txid` numbers the writing transaction in its ledger partition's commit order
    (StreamHead; the partition in its high bits, core.partitions; on SQLite, where writers
    are serialized and ids are in commit order, just the partition's bits): readers walk
    each partition's (txid, id), and a change that commits out of id order is never skipped
    (ingest.selectors: an epoch reads each partition up to its committed head,
    stream_committed_watermark, then stream_range_rows).
    """

    # Like ScoreEvent: no FK constraint or season-only index on a hot table.
    season = models.ForeignKey(
        "seasons.Season", on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    player_id = models.CharField(max_length=64)
    old_score = models.BigIntegerField(null=True)
    new_score = models.BigIntegerField()
    score_version = models.BigIntegerField()
    # reached_at after and before the change, like the scores: a first_reached copy moves
    # the player by both, and the ledger as of any watermark is rebuilt from them.
    reached_at = models.DateTimeField(null=True)
    old_reached_at = models.DateTimeField(null=True)
    # The player's region in the season after and before the change: equal for a score
    # change; a region move (event_id "region:<profile_version>", from a profile write)
    # keeps the score.
    region = models.CharField(max_length=16, blank=True, default="", db_default="")
    old_region = models.CharField(max_length=16, blank=True, default="", db_default="")
    # Whether the player was hidden after and before the change (null: not): equal for a
    # score change; a hide or a restore (event_id "hide:<n>" / "restore:<n>") keeps the
    # score and flips it. A hidden player's value on every board is none.
    hidden = models.BooleanField(null=True)
    old_hidden = models.BooleanField(null=True)
    event_id = models.CharField(max_length=64)
    committed_at = models.DateTimeField()
    txid = models.BigIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["season", "txid", "id"], name="score_change_cursor"),
            # A player's region moves across seasons (the staff player page): partial, so the
            # score changes that make up nearly all of the stream add nothing to it.
            models.Index(fields=["player_id", "season"], condition=models.Q(event_id__startswith="region:"),
                         name="score_change_region_moves"),
        ]


class StreamHead(models.Model):
    """The last commit number handed out in one ledger partition of a season's change stream.

    A writer takes the next number by updating this row in its own transaction, so the
    row lock orders the partition's writers: a number is handed out only after every
    smaller one has committed (or rolled back). A reader that sees the changes of number N
    has therefore seen every change of the partition below N, and nothing it has not seen
    can sort before what it has: the stream's visibility depends on this partition's
    writers alone, never on transactions of other partitions, seasons or databases on the
    same server (as a snapshot's xmin would). `head` carries the partition in its high bits
    (core.partitions); partition 0's numbers are plain.
    """

    pk = models.CompositePrimaryKey("season_id", "partition")
    season = models.ForeignKey("seasons.Season", on_delete=models.PROTECT, related_name="+", db_constraint=False)
    partition = models.PositiveSmallIntegerField(default=0)
    head = models.BigIntegerField(default=0)
    # The version an epoch fixed its range for, in the same statement that read `head` as
    # the range's end: every number handed out after it is in a later version. A writer
    # reads it with the row locked, so the `pending_version` it answers is exact.
    planned_version = models.BigIntegerField(default=0, db_default=0)  # raw inserts leave it out


class LedgerEventClaim(models.Model):
    """An event id taken in a season whose ledger partitions span databases (in "default").

    Each database's unique index only sees its own partitions' events, so a batch claims
    its new event ids here, committed before any partition's write: the claim keeps an
    event id unique in the season across databases and names the partition (so the
    database) that records it (docs/architecture.md, Ledger databases). Seasons in one
    database write none.
    """

    # A hot table, like ScoreEvent: no FK constraint or season-only index.
    season = models.ForeignKey(
        "seasons.Season", on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    event_id = models.CharField(max_length=64)
    partition = models.PositiveSmallIntegerField()
    payload_hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["season", "event_id"], name="ledger_event_claim_unique_event_id"),
        ]


class Manifest(models.Model):
    """A published leaderboard version, as recorded after its pointer swap in Redis."""

    season = models.ForeignKey("seasons.Season", on_delete=models.PROTECT, related_name="manifests")
    version = models.BigIntegerField()
    as_of = models.DateTimeField()
    # Partition 0's cursor; the whole watermark, one cursor per ledger partition, when it
    # names more (core.partitions.Watermark.columns).
    watermark_txid = models.BigIntegerField()
    watermark_id = models.BigIntegerField()
    watermark_vector = models.JSONField(null=True, blank=True)
    copy = models.CharField(max_length=16)
    layout = models.JSONField()
    # [{"bucket", "low", "high", "count", "checksum"}] as in the Redis manifest.
    buckets = models.JSONField()
    total_players = models.BigIntegerField()
    changed_players = models.BigIntegerField(default=0)
    epoch_ms = models.FloatField(default=0)
    published_at = models.DateTimeField()
    # Set once, when this version is approved as the season's FINAL: SHA-256 over the
    # canonical standings (seasons.final.standings_hash).
    is_final = models.BooleanField(default=False)
    content_hash = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["season", "version"], name="manifest_unique_version"),
        ]
        ordering = ["-version"]

    def __str__(self) -> str:
        return f"{self.season_id} v{self.version}"

    @property
    def watermark(self) -> Watermark:
        return Watermark.from_columns(self.watermark_txid, self.watermark_id, self.watermark_vector)


class LeaseFence(models.Model):
    """The last fencing token issued for a season's coordinator lease (ledger_store.fence_token_issue).

    Tokens come from here, not from a counter in Redis: a Redis restarted from an old
    snapshot would issue again a token that a stalled coordinator still holds. A bare
    season id, no FK check: every epoch takes a token.
    """

    season_id = models.BigIntegerField(primary_key=True)
    token = models.BigIntegerField()


class LateResult(models.Model):
    """A pre-cutoff result that arrived after the ingest seal: it waits for staff, never enters the board itself."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPLIED = "applied"
        DISMISSED = "dismissed"

    # Next to its ledger row, in the partition's database, which holds no Season rows: no
    # FK constraint to the season (the one to the ledger row stays, same database).
    season = models.ForeignKey("seasons.Season", on_delete=models.PROTECT, related_name="+", db_constraint=False)
    ledger_event = models.OneToOneField(ScoreEvent, on_delete=models.PROTECT, related_name="late_result")
    player_id = models.CharField(max_length=64)
    best_score = models.BigIntegerField()
    completed_at = models.DateTimeField()
    received_at = models.DateTimeField()
    reason = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    resolved_by_label = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_reason = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["season", "status"], name="late_result_queue")]


# The statuses of a shadow build in flight (RebuildJob.Status): at most one per season.
ACTIVE_REBUILD_STATUSES = ("queued", "building", "comparing")


class RebuildJob(models.Model):
    """A shadow build of a season's views from the ledger (a rebuild, or a new bucket layout).

    Progress is persisted so the console and the command line can show it; the old
    version keeps serving until the shadow passes its comparison and is published.
    """

    class Kind(models.TextChoices):
        REBUILD = "rebuild"
        SPLIT = "split"
        RECOVERY = "recovery"

    class Status(models.TextChoices):
        QUEUED = "queued"
        BUILDING = "building"
        COMPARING = "comparing"
        READY = "ready"  # a split waiting for a person to publish it
        PUBLISHING = "publishing"  # a READY split claimed by the one publish that may run
        PUBLISHED = "published"
        FAILED = "failed"
        DISCARDED = "discarded"

    season = models.ForeignKey("seasons.Season", on_delete=models.PROTECT, related_name="rebuild_jobs")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    copy = models.CharField(max_length=16, blank=True)
    layout = models.JSONField()
    requested_by_label = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    done = models.BigIntegerField(default=0)
    total = models.BigIntegerField(default=0)
    rate = models.FloatField(default=0.0)
    eta_seconds = models.FloatField(null=True, blank=True)
    watermark_txid = models.BigIntegerField(null=True, blank=True)
    watermark_id = models.BigIntegerField(null=True, blank=True)
    watermark_vector = models.JSONField(null=True, blank=True)
    compared_version = models.BigIntegerField(null=True, blank=True)
    published_version = models.BigIntegerField(null=True, blank=True)
    report = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Moved every few seconds by the process working on the job (rebuild._Heartbeat): a job
    # whose heartbeat is older than REBUILD_STALE_SECONDS lost its worker.
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            # At most one shadow build in flight per season: the claim is this row.
            models.UniqueConstraint(
                fields=["season"],
                condition=models.Q(status__in=list(ACTIVE_REBUILD_STATUSES)),
                name="rebuild_job_one_active_per_season",
            ),
        ]

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else (100.0 if self.status == "published" else 0.0)


class ReconciliationRun(models.Model):
    """One run of the continuous reconciliation on a season's current version."""

    season = models.ForeignKey("seasons.Season", on_delete=models.PROTECT, related_name="reconciliation_runs")
    version = models.BigIntegerField(null=True)
    mode = models.CharField(max_length=16)  # sampled | full
    ok = models.BooleanField()
    findings = models.JSONField()
    started_at = models.DateTimeField()
    duration_ms = models.FloatField()

    class Meta:
        ordering = ["-id"]


class SeasonSample(models.Model):
    """A season's health every METRICS_SAMPLE_SECONDS, recorded by Celery beat whether or not
    anyone is looking (the console's overview charts), kept METRICS_HISTORY_SECONDS.

    `slot` is the sample's tick (seconds since the epoch // the interval): unique per season,
    so a second delivery of the same tick writes nothing. The cumulative counters are the
    Redis metrics' at that moment (None while Redis is unreachable); the rates are their
    differences with the season's previous sample.
    """

    season = models.ForeignKey("seasons.Season", on_delete=models.CASCADE, related_name="+")
    slot = models.BigIntegerField()
    sampled_at = models.DateTimeField()
    events_total = models.BigIntegerField(null=True)
    lag_sum = models.FloatField(null=True)
    lag_count = models.BigIntegerField(null=True)
    epoch_ms_sum = models.FloatField(null=True)
    epoch_count = models.BigIntegerField(null=True)
    # Ingested events per second since the previous sample.
    ingest_per_second = models.FloatField(null=True)
    # Mean event-to-publish lag of the changes published since the previous sample.
    publish_lag_seconds = models.FloatField(null=True)
    # Age of the oldest committed change no published version holds yet (0: none waiting).
    backlog_seconds = models.FloatField()
    # Mean duration of the epochs that published since the previous sample.
    epoch_ms = models.FloatField(null=True)
    version = models.BigIntegerField()
    version_age_seconds = models.FloatField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["season", "slot"], name="season_sample_one_per_tick")]
        indexes = [models.Index(fields=["sampled_at"], name="season_sample_by_time")]


class PlayerProfile(models.Model):
    """A player's server-side profile, written by the trusted profile service with a
    per-player version (like score events): the region every regional board reads."""

    player_id = models.CharField(max_length=64, primary_key=True)
    # 1..16 of [a-z0-9-]; "" for no region (null in the API).
    region = models.CharField(max_length=16, blank=True, default="")
    profile_version = models.BigIntegerField()
    updated_at = models.DateTimeField()
    # What players see beside the id (docs/api.md, Names and countries): null when unset.
    # Current, not versioned with the board; the read path serves them from Redis
    # (leaderboard.views.names), which this table can always refill.
    display_name = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    country = models.CharField(max_length=2, null=True, blank=True)  # noqa: DJ001
    # The name a reviewer reset (player.name.reset): a profile write naming it again keeps no name.
    name_blocked = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001


class PlayerProfileChange(models.Model):
    """Every accepted profile write (applied or unchanged), append-only: a player's region history."""

    player_id = models.CharField(max_length=64)
    old_region = models.CharField(max_length=16, blank=True, default="")
    region = models.CharField(max_length=16, blank=True, default="")
    profile_version = models.BigIntegerField()
    # The name and country once the write applied (null: none). Nullable without a default
    # so SQLite adds the columns in place, keeping the table's append-only trigger.
    display_name = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    country = models.CharField(max_length=2, null=True, blank=True)  # noqa: DJ001
    client = models.ForeignKey(ApiClient, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    recorded_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["player_id", "id"], name="profile_change_by_player")]


class FriendList(models.Model):
    """A player's friends as the social service last wrote them (graph_version only moves forward).

    The friends board is computed per request from one published version: nothing is
    kept per player in Redis, so a score change costs nothing per friend.
    """

    player_id = models.CharField(max_length=64, primary_key=True)
    friends = models.JSONField(default=list)
    graph_version = models.BigIntegerField()
    updated_at = models.DateTimeField()



class SeasonSnapshot(models.Model):
    """A season's board at a full hour (UTC): the version current then and its score
    histogram (SnapshotChunk), never its players (core.history)."""

    season = models.ForeignKey("seasons.Season", on_delete=models.PROTECT, related_name="+")
    # The full hour this snapshot stands for; unique per season, so takers racing for it
    # (beat's ticks, a retried task) write it once.
    taken_for = models.DateTimeField()
    version = models.BigIntegerField()
    total_players = models.BigIntegerField()
    distinct_values = models.BigIntegerField()
    # The players staff had hidden at that version (docs/rules.md, Hidden players): in no
    # count of the histogram, and ranked in no history of that hour. A few, not the board.
    hidden = models.JSONField(default=list)
    taken_at = models.DateTimeField()
    took_ms = models.FloatField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["season", "taken_for"], name="season_snapshot_one_per_hour")]


class SnapshotChunk(models.Model):
    """Consecutive values of a snapshot's histogram, ascending (core.history.HistogramChunk):
    int64 little-endian arrays of values and players, and the players above the chunk."""

    snapshot = models.ForeignKey(SeasonSnapshot, on_delete=models.CASCADE, related_name="chunks")
    low = models.BigIntegerField()
    above = models.BigIntegerField()
    chunk_values = models.BinaryField()
    chunk_counts = models.BinaryField()

    class Meta:
        indexes = [models.Index(fields=["snapshot", "low"], name="snapshot_chunk_by_low")]
