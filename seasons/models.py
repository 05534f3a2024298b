from __future__ import annotations

from django.conf import settings
from django.db import models

from leaderboard.core.buckets import MAX_SCORE, BucketLayout
from leaderboard.core.lifecycle import SeasonState
from leaderboard.core.partitions import Watermark
from leaderboard.core.season_options import BoardKind
from leaderboard.core.tiers import Tiers, tiers_parse


def default_layout() -> dict[str, object]:
    return BucketLayout.uniform().as_dict()


class Series(models.Model):
    """Recurring seasons (docs/rules.md, Recurring seasons): one season per window of the
    schedule, `{slug}-{n}`, opened, sealed and proposed by the clock (seasons_lifecycle_tick)."""

    slug = models.SlugField(max_length=48, unique=True)
    name = models.CharField(max_length=200)
    every = models.CharField(max_length=4, choices=[("1d", "1d"), ("7d", "7d"), ("1mo", "1mo")])
    anchor = models.DateTimeField()
    # After a window's cutoff its ingest is sealed this long later (late results meanwhile).
    grace_seconds = models.PositiveIntegerField(default=600)
    approval = models.CharField(max_length=12, choices=[("two-person", "two-person"), ("auto", "auto")],
                                default="two-person")
    # The options every window season is created with.
    mode = models.CharField(max_length=8, default="best")
    order = models.CharField(max_length=4, default="desc")
    tie_break = models.CharField(max_length=16, default="shared")
    regions = models.JSONField(default=list, blank=True)
    bucket_width = models.BigIntegerField(default=10_000)
    # Every window's score range: 0..max_score (create_series --max-score).
    max_score = models.BigIntegerField(default=MAX_SCORE)
    # Every window's tiers (create_series --tiers, core.tiers), "" for none.
    tiers = models.CharField(max_length=600, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    @property
    def board_kind(self) -> BoardKind:
        """Every window's kind."""
        return BoardKind(mode=self.mode, order=self.order, max_score=self.max_score, tie_break=self.tie_break)

    def __str__(self) -> str:
        return self.slug


class Season(models.Model):
    """A season: its public id is the slug (the {season_id} of every URL)."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    state = models.CharField(
        max_length=16,
        choices=[(s.value, s.value) for s in SeasonState],
        default=SeasonState.SCHEDULED.value,
    )
    starts_at = models.DateTimeField()
    cutoff = models.DateTimeField()
    # The last published leaderboard version (0 until the first epoch publishes);
    # writes answer pending_version from it without touching Redis.
    published_version = models.BigIntegerField(default=0)
    # The bucket layout new versions are built with (docs/architecture.md, How versions are
    # published; 101 x 10,000 points unless the season was created with another).
    layout = models.JSONField(default=default_layout)
    created_at = models.DateTimeField(auto_now_add=True)
    # Ingest seal (CLOSING -> FINALIZING): every change at or below this change-stream
    # cursor is in the season; pre-cutoff results arriving later go to the late queue.
    sealed_at = models.DateTimeField(null=True, blank=True)
    ingest_watermark_txid = models.BigIntegerField(null=True, blank=True)
    ingest_watermark_id = models.BigIntegerField(null=True, blank=True)
    # The whole seal watermark, one cursor per ledger partition, when it names more than
    # partition 0 (whose cursor the two columns above keep).
    ingest_watermark_vector = models.JSONField(null=True, blank=True)
    # Ledger partitions (docs/architecture.md, Partitions): a player's ledger rows, score
    # and changes belong to partition partition_base + partition_of(player_id, partitions),
    # each with its own write lock and change-stream cursor. Chosen at creation; the
    # season_repartition command moves a season to a new layout numbered above this one.
    partitions = models.PositiveSmallIntegerField(default=1)
    partition_base = models.PositiveSmallIntegerField(default=0)
    # The database alias of each partition id (index), recorded at creation from
    # LEDGER_PARTITION_URLS (leaderboard.ledger_databases); empty: every partition in
    # "default". Kept whatever the setting says later, so no row is ever looked for in
    # another database than the one it was written to.
    ledger_databases = models.JSONField(default=list, blank=True)
    final_version = models.BigIntegerField(null=True, blank=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    # The season's fixed set of regions (docs/rules.md, Regional and friends boards): each
    # has its own board; set at creation, changeable only while the season is SCHEDULED.
    regions = models.JSONField(default=list, blank=True)
    # How a result sets a player's score: "best" (the highest settled best), "latest"
    # (the newest settled value, even when lower) or "sum" (the sum of its results'
    # points); fixed once the season opens.
    mode = models.CharField(max_length=8, choices=[("best", "best"), ("latest", "latest"), ("sum", "sum")],
                            default="best")
    # Which end ranks first: "desc" (a higher score) or "asc" (a lower one, race times);
    # fixed once the season opens.
    order = models.CharField(max_length=4, choices=[("desc", "desc"), ("asc", "asc")], default="desc")
    # How equal scores are ordered: "shared" (ties share a rank, display by player id) or
    # "first_reached" (who reached the score first ranks ahead; fixed at creation).
    tie_break = models.CharField(max_length=16, choices=[("shared", "shared"), ("first_reached", "first_reached")],
                                 default="shared")
    # Named tiers by rank or top share (create_season --tiers, core.tiers), "" for none;
    # published with every version, so fixed once the season opens.
    tiers = models.CharField(max_length=600, blank=True, default="")
    # A series' window (its n-th season), or None for a season created on its own.
    series = models.ForeignKey(Series, null=True, blank=True, on_delete=models.PROTECT, related_name="seasons")
    series_window = models.PositiveIntegerField(null=True, blank=True)
    # Seconds after the cutoff the clock seals ingest; None: SEAL_AFTER_CUTOFF_SECONDS.
    seal_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    # The FINAL standings hold regional places (written so in a season with regions). False
    # for a FINAL approved before they existed: its rows and hash lines have none.
    final_regional = models.BooleanField(default=False)

    class Meta:
        ordering = ["-starts_at", "slug"]
        constraints = [
            # One season per window: two clocks opening the same window race on this.
            models.UniqueConstraint(fields=["series", "series_window"], name="season_one_per_series_window"),
            models.CheckConstraint(
                condition=models.Q(cutoff__gt=models.F("starts_at")), name="season_cutoff_after_start"
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def bucket_layout(self) -> BucketLayout:
        return BucketLayout.from_dict(self.layout)

    @property
    def board_kind(self) -> BoardKind:
        return BoardKind(mode=self.mode, order=self.order, max_score=self.max_score, tie_break=self.tie_break)

    @property
    def tiers_parsed(self) -> Tiers | None:
        """The season's tiers (checked when stored), None without any."""
        return tiers_parse(self.tiers)

    @property
    def max_score(self) -> int:
        """The highest score of the season's range (create_season --max-score): its layout's top."""
        return int(self.layout.get("max_score", MAX_SCORE))

    @property
    def ingest_watermark(self) -> Watermark | None:
        """The seal's watermark (None before the seal)."""
        if self.ingest_watermark_txid is None:
            return None
        return Watermark.from_columns(self.ingest_watermark_txid, self.ingest_watermark_id,
                                      self.ingest_watermark_vector)


class FinalCandidate(models.Model):
    """A version proposed as the FINAL standings, with its reconciliation against the ledger."""

    class Status(models.TextChoices):
        BUILT = "built"
        PROPOSED = "proposed"
        APPROVED = "approved"
        REJECTED = "rejected"
        SUPERSEDED = "superseded"

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="final_candidates")
    version = models.BigIntegerField()
    built_at = models.DateTimeField()
    report = models.JSONField()
    reconciliation_ok = models.BooleanField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.BUILT)
    proposed_by = models.CharField(max_length=64, blank=True)
    proposed_by_label = models.CharField(max_length=200, blank=True)
    proposed_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=64, blank=True)
    decided_by_label = models.CharField(max_length=200, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.season.slug} v{self.version} ({self.status})"


class FinalStanding(models.Model):
    """One row of the approved FINAL standings: durable, immutable, what rewards are paid from."""

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="+")
    position = models.BigIntegerField()
    rank = models.BigIntegerField()
    player_id = models.CharField(max_length=64)
    score = models.BigIntegerField()
    # A first_reached season's order among equal scores (docs/rules.md, Ties decided by
    # who got there first), covered by the content hash there; null in a shared season.
    reached_at = models.DateTimeField(null=True)
    # In a season with regions: the player's region ("" none) and their place among that
    # region's players, ordered and ranked like the global standings; null without a
    # region, and in a season without regions. Covered by the content hash there.
    region = models.CharField(max_length=16, blank=True, default="", db_default="")
    regional_position = models.BigIntegerField(null=True)
    regional_rank = models.BigIntegerField(null=True)
    # In a season with tiers: the tier of the rank in the FINAL version (covered by the hash
    # there); null otherwise. Nullable without a default so SQLite adds the column in
    # place, keeping the table's append-only trigger.
    tier = models.CharField(max_length=24, null=True)  # noqa: DJ001

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["season", "position"], name="final_standing_unique_position"),
            models.UniqueConstraint(fields=["season", "player_id"], name="final_standing_unique_player"),
            # Also the index of a region's page; partial, so a season without regions pays nothing for it.
            models.UniqueConstraint(fields=["season", "region", "regional_position"],
                                    condition=models.Q(regional_position__isnull=False),
                                    name="final_standing_unique_regional_position"),
            models.CheckConstraint(
                condition=models.Q(region="", regional_position__isnull=True, regional_rank__isnull=True)
                | (~models.Q(region="") & models.Q(regional_position__isnull=False, regional_rank__isnull=False)),
                name="final_standing_regional_place_iff_region",
            ),
        ]


class FinalCorrection(models.Model):
    """A change to a FINAL season's board: listed beside the FINAL, never written into it."""

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="+")
    player_id = models.CharField(max_length=64)
    score_before = models.BigIntegerField(null=True)
    score_after = models.BigIntegerField()
    event_id = models.CharField(max_length=64)
    pending_version = models.BigIntegerField(null=True)
    actor_label = models.CharField(max_length=200)
    reason = models.TextField()
    # What the public list shows: an opaque actor id (Actor.public_ref) and the public
    # reason; the user name and the internal reason above stay in the console.
    actor_ref = models.CharField(max_length=64, blank=True)
    public_reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]


# ------------------------------------------------------------------- staff console


class StaffConsole(models.Model):
    """No table: the anchor of the staff console's permissions, which the roles (groups) bundle.

    Roles (migration 0005, seasons.staff.accounts.services.ROLE_PERMISSIONS): viewer sees every page;
    reviewer also files and works disputes, proposes revocations and FINALs, dismisses late
    results, starts rebuilds, splits and reconciliations; approver also approves (never
    their own proposal), publishes splits and moves the season's lifecycle.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("console_view", "Can view the staff console"),
            ("disputes_manage", "Can file, assign, annotate and reject disputes"),
            ("revocation_propose", "Can propose score revocations"),
            ("late_results_dismiss", "Can dismiss late results"),
            ("views_operate", "Can start rebuilds, splits and reconciliation runs"),
            ("final_propose", "Can build and propose FINAL candidates"),
            ("revocation_approve", "Can approve or reject score revocations"),
            ("split_publish", "Can publish or discard split layouts"),
            ("final_approve", "Can approve or reject FINAL candidates"),
            ("season_transition", "Can open, close and seal seasons"),
            ("players_moderate", "Can reset player names"),
        ]


class ScoreRevocation(models.Model):
    """A corrected absolute score for one player: proposed by one staff member, approved by another.

    Approval writes a `correction` event to the ledger based on the player's version at
    proposal time (`base_version` + 1): if the match service moved the player meanwhile
    the ledger answers `stale`, nothing changes, and the approver looks again and retries.
    """

    class Status(models.TextChoices):
        PROPOSED = "proposed"
        APPLIED = "applied"
        REJECTED = "rejected"

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="revocations")
    player_id = models.CharField(max_length=64)
    score_before = models.BigIntegerField(null=True, blank=True)
    base_version = models.BigIntegerField(default=0)
    new_score = models.BigIntegerField()
    reason = models.CharField(max_length=500)
    evidence = models.TextField(blank=True)
    # What the public FINAL corrections list says about it; reason and evidence stay in the console.
    public_reason = models.CharField(max_length=200, blank=True)
    dispute = models.ForeignKey("Dispute", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="revocations")
    # The late result (or held correction) it applies: (late_result_alias, late_result_id), a
    # row of the ledger database holding the player's partition, which numbers its own rows.
    # No database constraint: the row may live in another database than this one. Read it
    # with seasons.staff.late_results.selectors.late_result_get(), never through the relation (which would look
    # in the revocation's database, or put this row in the late result's).
    late_result = models.ForeignKey("leaderboard.LateResult", null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="+", db_constraint=False)
    late_result_alias = models.CharField(max_length=64, default="default")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROPOSED)
    proposed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    proposed_by_label = models.CharField(max_length=200)
    proposed_at = models.DateTimeField()
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    decided_by_label = models.CharField(max_length=200, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    # Every approval attempt writes a ledger event; the last one's outcome is shown.
    attempts = models.IntegerField(default=0)
    last_outcome = models.CharField(max_length=32, blank=True)
    last_outcome_detail = models.TextField(blank=True)
    event_id = models.CharField(max_length=64, blank=True)

    # The foreign-key id attributes Django adds, declared for the type checker.
    season_id: int
    proposed_by_id: int
    decided_by_id: int | None
    dispute_id: int | None
    late_result_id: int | None

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "season"], name="revocation_queue")]

    def __str__(self) -> str:
        return f"revocation {self.pk}: {self.player_id} -> {self.new_score} ({self.status})"


class Dispute(models.Model):
    """A player's (or support's) claim that a score is wrong; resolved by rejection or a revocation."""

    class Status(models.TextChoices):
        OPEN = "open"
        REVOCATION_PROPOSED = "revocation_proposed"
        RESOLVED = "resolved"
        REJECTED = "rejected"

    class Source(models.TextChoices):
        CONSOLE = "console"
        API = "api"

    season = models.ForeignKey(Season, on_delete=models.PROTECT, related_name="disputes")
    player_id = models.CharField(max_length=64)
    match_id = models.CharField(max_length=64, blank=True)
    claimed_score = models.BigIntegerField(null=True, blank=True)
    summary = models.CharField(max_length=200)
    details = models.TextField(blank=True)
    source = models.CharField(max_length=16, choices=Source.choices)
    # The support tool's ticket id: a repeated POST with the same one returns the same dispute.
    external_ref = models.CharField(max_length=100, blank=True)
    filed_by_label = models.CharField(max_length=200)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.OPEN)
    assignee = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="+")
    resolution_reason = models.TextField(blank=True)
    resolved_by_label = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    # The foreign-key id attributes Django adds, declared for the type checker.
    season_id: int
    assignee_id: int | None

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "season"], name="dispute_queue")]
        constraints = [
            models.UniqueConstraint(fields=["season", "external_ref"], condition=~models.Q(external_ref=""),
                                    name="dispute_unique_external_ref"),
        ]

    def __str__(self) -> str:
        return f"dispute {self.pk}: {self.player_id} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in (self.Status.OPEN, self.Status.REVOCATION_PROPOSED)


class DisputeNote(models.Model):
    dispute = models.ForeignKey(Dispute, on_delete=models.PROTECT, related_name="notes")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    author_label = models.CharField(max_length=200)
    text = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
