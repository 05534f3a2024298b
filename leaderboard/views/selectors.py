"""Reads for the API: readers of the published rank views, pending scores, friends."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from leaderboard.core.errors import ReadUnavailable, retry_after_seconds
from leaderboard.core.ranking import Entry
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_alias_of_player
from leaderboard.models import FriendList, PlayerScore
from leaderboard.redis_client import redis_reads_get
from leaderboard.views.rankview import RankReader, Rider
from leaderboard.views.season_index import season_keys
from seasons.models import Season

# reached_at is stored to the millisecond, so the product is a whole number.


def leaderboard_reader(*, season_slug: str, region: str | None = None, rider: Rider | None = None) -> RankReader:
    """A reader of the season's global board, or with `region` of that region's board;
    `rider` goes with its first round trip."""
    return RankReader(
        redis_reads_get(), season_keys(season_slug), deadline=settings.READ_DEADLINE_SECONDS,
        region=region, rider=rider,
    )


def read_unavailable() -> ReadUnavailable:
    """Why a read of a season with no complete version fails, for the read API and the live
    boards alike: the next version may come one epoch later."""
    return ReadUnavailable(retry_after=retry_after_seconds(settings.EPOCH_SECONDS))


@dataclass(frozen=True, slots=True)
class PendingScore:
    score: int
    score_version: int
    pending_version: int


def player_pending_score(*, season_slug: str, player_id: str, published: Entry | None,
                         version: int, region: str | None = None) -> PendingScore | None:
    """The ledger's committed score when the published version does not have it yet.

    `region`: on that region's board, so only while the ledger has the player in it (a
    player the ledger has moved elsewhere has nothing pending on this board).

    One query joined to the season, in "default"; only when that finds no row is the
    season looked at, and the player's row asked of their ledger database if it is
    another (whose tables hold no Season rows to join)."""
    # A hidden player has nothing pending on any board: they are on none.
    scores = PlayerScore.objects.filter(player_id=player_id, hidden=False)
    if region is not None:
        scores = scores.filter(region=region)
    row = (
        scores.filter(season__slug=season_slug)
        .values_list("score", "score_version", "season__published_version")
        .first()
    )
    if row is None:
        if not settings.LEDGER_PARTITION_ALIASES:
            # No ledger database besides "default" here: nowhere else to look, and no
            # second query on every read of a player without a score.
            return None
        season = Season.objects.filter(slug=season_slug).first()
        alias = ledger_alias_of_player(season=season, player_id=player_id) if season is not None else DEFAULT_ALIAS
        if season is None or alias == DEFAULT_ALIAS:
            return None
        found = scores.using(alias).filter(season_id=season.pk).values_list("score", "score_version").first()
        if found is None:
            return None
        row = (*found, season.published_version)
    score, score_version, published_version = row
    if published is not None and published.score == score:
        return None
    return PendingScore(score=score, score_version=score_version,
                        pending_version=max(version, published_version) + 1)


@dataclass(frozen=True, slots=True)
class Friends:
    player_ids: list[str]
    # 0: the social service never wrote a list for this player (its versions start at 1).
    graph_version: int


def player_friends_get(*, player_id: str) -> Friends:
    """A player's friend list as the social service last wrote it: one primary-key row."""
    row = FriendList.objects.filter(player_id=player_id).values_list("friends", "graph_version").first()
    if row is None:
        return Friends(player_ids=[], graph_version=0)
    friends, graph_version = row
    # The social service's writes keep it distinct and without the player; a read relies on neither.
    return Friends(player_ids=[f for f in dict.fromkeys(map(str, friends)) if f != player_id],
                   graph_version=graph_version)
