"""Reads of a player's pages: their events, score, rank and FINAL standing in a season
with its revocations, disputes and conflicting deliveries; their region history and
friends."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from leaderboard.core.history import HISTORY_DAYS_DEFAULT
from leaderboard.history.selectors import SnapshotPlace, player_history_get
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_alias_of_player
from leaderboard.ledger_reads import ledger_queryset_of_player
from leaderboard.models import (
    FriendList,
    PlayerProfile,
    PlayerProfileChange,
    PlayerScore,
    ScoreChange,
    ScoreEvent,
    ScoreEventConflict,
)
from leaderboard.redis_errors import REDIS_ERRORS
from leaderboard.views import rankview
from seasons.models import Dispute, FinalStanding, ScoreRevocation, Season
from seasons.staff.season.selectors import (
    CONFLICTS_SHOWN,
    ConflictRow,
    _conflict_rows,
    _conflicts_newest,
    _with_clients,
)


@dataclass(frozen=True, slots=True)
class PlayerDetail:
    season: Season
    player_id: str
    events: list[ScoreEvent]
    score: PlayerScore | None
    # From the current published version (Redis): None when unranked or unavailable.
    rank: int | None
    position: int | None
    version: int | None
    total: int | None
    rank_error: str
    # The player's region in that version and their place on its board (a season with regions).
    region: str | None
    regional_rank: int | None
    regional_position: int | None
    regional_total: int | None
    final: FinalStanding | None
    # The event that set the current score: the latest applied event whose score_after is it.
    setter: ScoreEvent | None
    revocations: list[ScoreRevocation]
    disputes: list[Dispute]
    # Deliveries that reused one of this player's event ids, or named this player, with
    # another payload (outcome `conflict`): recorded, never applied.
    conflicts: list[ConflictRow]
    # The player's rank at each midnight (UTC) of the last HISTORY_DAYS_DEFAULT days.
    history: list[SnapshotPlace]


def player_detail(*, season: Season, player_id: str) -> PlayerDetail:
    from leaderboard.views.selectors import leaderboard_reader

    events = _with_clients(ledger_queryset_of_player(
        season=season, player_id=player_id,
        queryset=ScoreEvent.objects.filter(season=season, player_id=player_id).order_by("id")))
    score = player_score_get(season=season, player_id=player_id)
    setter = None
    if score is not None:
        setter = next((e for e in reversed(events) if e.status == "applied" and e.score_after == score.score), None)
    rank = position = version = total = None
    region = regional_rank = regional_position = regional_total = None
    rank_error = ""
    try:
        view = leaderboard_reader(season_slug=season.slug).rank(player_id)
        version, total = view.manifest.version, view.total
        if view.entry is not None:
            rank, position = view.entry.rank, view.entry.position
        else:
            rank_error = f"not ranked in version {version}"
        if view.region is not None:
            # The same version's regional board: both places come from one version.
            regional = leaderboard_reader(season_slug=season.slug, region=view.region).rank(player_id, version)
            region, regional_total = view.region, regional.total
            if regional.entry is not None:
                regional_rank, regional_position = regional.entry.rank, regional.entry.position
    except (rankview.VersionExpired, rankview.UnknownRegion):
        rank_error = "the version moved while the page was read; reload"
    except rankview.Unavailable:
        rank_error = "no published version is available right now"
    except REDIS_ERRORS as exc:
        rank_error = f"the rank views are unreachable ({exc.__class__.__name__})"
    return PlayerDetail(
        season=season, player_id=player_id, events=events, score=score, rank=rank, position=position,
        version=version, total=total, rank_error=rank_error, region=region, regional_rank=regional_rank,
        regional_position=regional_position, regional_total=regional_total,
        final=FinalStanding.objects.filter(season=season, player_id=player_id).first(), setter=setter,
        revocations=list(ScoreRevocation.objects.filter(season=season, player_id=player_id).order_by("-id")),
        disputes=list(Dispute.objects.filter(season=season, player_id=player_id).order_by("-id")),
        conflicts=_conflict_rows(
            _conflicts_newest(season=season, limit=CONFLICTS_SHOWN, queryset=ScoreEventConflict.objects.filter(
                season=season).filter(Q(event_id__in=[e.event_id for e in events]) | Q(payload__player_id=player_id))),
            season=season, known={e.event_id: e for e in events},
        ),
        history=player_history_get(season=season, player_id=player_id, days=HISTORY_DAYS_DEFAULT,
                                   today=timezone.now().date()),
    )


def player_score_get(*, season: Season, player_id: str) -> PlayerScore | None:
    return ledger_queryset_of_player(season=season, player_id=player_id,
                                     queryset=PlayerScore.objects.filter(season=season, player_id=player_id)).first()
# A player page lists the newest profile changes and the first friends; the counts are whole.
PROFILE_CHANGES_SHOWN = 100
FRIENDS_SHOWN = 50
# The event_id prefix of a region move in the change stream (leaderboard/ingest/ledger_store.py).
REGION_MOVE_PREFIX = "region:"


@dataclass(frozen=True, slots=True)
class RegionMove:
    """One change-stream row that moved the player between regions of a season."""

    old_region: str
    region: str
    # The profile write that moved them (event_id "region:<profile_version>").
    profile_version: int
    committed_at: datetime
    # Its place in the season's stream: the first version whose watermark passes it shows the move.
    txid: int
    change_id: int


@dataclass(frozen=True, slots=True)
class SeasonRegion:
    """A player's region in one season where they have a score, and its moves there, oldest first."""

    season: Season
    region: str
    moves: list[RegionMove]


@dataclass(frozen=True, slots=True)
class PlayerRegions:
    # The profile as it is now (None: the player has no profile, so no region anywhere).
    profile: PlayerProfile | None
    # The newest PROFILE_CHANGES_SHOWN profile writes, newest first, of changes_total.
    changes: list[PlayerProfileChange]
    changes_total: int
    # Every season where the player has a score, newest first.
    seasons: list[SeasonRegion]


def player_regions(*, player_id: str) -> PlayerRegions:
    """A player's region history: their profile writes, and their region in each season they
    play with its in-season moves (index score_change_region_moves: a few rows, whatever the
    size of the stream)."""
    changes = PlayerProfileChange.objects.filter(player_id=player_id)
    seasons = {s.pk: s for s in Season.objects.all()}
    # By (season, player): the unique constraint's index answers it; by player alone, nothing would.
    held = dict(PlayerScore.objects.filter(season_id__in=list(seasons), player_id=player_id)
                .values_list("season_id", "region"))
    region_moves = (ScoreChange.objects.filter(player_id=player_id, event_id__startswith=REGION_MOVE_PREFIX)
                    .order_by("season_id", "txid", "id")
                    .values_list("season_id", "old_region", "region", "event_id", "committed_at", "txid", "id"))
    rows = list(region_moves)
    # Seasons whose player's partition lives in another database: their rows from there.
    elsewhere = {pk: ledger_alias_of_player(season=s, player_id=player_id)
                 for pk, s in seasons.items() if s.ledger_databases}
    for pk, alias in elsewhere.items():
        if alias != DEFAULT_ALIAS:
            held.update(PlayerScore.objects.using(alias).filter(season_id=pk, player_id=player_id)
                        .values_list("season_id", "region"))
            rows += list(region_moves.using(alias).filter(season_id=pk))
    moves: dict[int, list[RegionMove]] = {}
    for season_id, old_region, region, event_id, committed_at, txid, change_id in sorted(
            rows, key=lambda row: (row[0], row[5], row[6])):
        moves.setdefault(season_id, []).append(RegionMove(
            old_region=old_region, region=region, profile_version=int(event_id.removeprefix(REGION_MOVE_PREFIX)),
            committed_at=committed_at, txid=txid, change_id=change_id))
    in_seasons = sorted((seasons[pk] for pk in held), key=lambda s: (s.starts_at, s.slug), reverse=True)
    return PlayerRegions(
        profile=PlayerProfile.objects.filter(player_id=player_id).first(),
        changes=list(changes.select_related("client").order_by("-id")[:PROFILE_CHANGES_SHOWN]),
        changes_total=changes.count(),
        seasons=[SeasonRegion(season=s, region=held[s.pk], moves=moves.get(s.pk, [])) for s in in_seasons],
    )


@dataclass(frozen=True, slots=True)
class PlayerFriends:
    # None: the social service never wrote a list for the player (graph_version 0 in the API).
    graph_version: int | None
    count: int
    # The first FRIENDS_SHOWN ids, in the order the list was written.
    shown: list[str]
    updated_at: datetime | None


def player_friends(*, player_id: str) -> PlayerFriends:
    row = FriendList.objects.filter(player_id=player_id).first()
    if row is None:
        return PlayerFriends(graph_version=None, count=0, shown=[], updated_at=None)
    return PlayerFriends(graph_version=row.graph_version, count=len(row.friends), shown=row.friends[:FRIENDS_SHOWN],
                         updated_at=row.updated_at)
