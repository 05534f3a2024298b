"""Live boards over websockets (docs/api.md, Live board websocket): the pure part.

What a live socket sends, independent of Django, Redis and Channels:

- `top_diff` / `top_apply`: a version's top 100 as a change against the previous
  version's, that a client holding the previous top can apply and nobody else can
  misapply (it names its base version; see leaderboard.live.hub);
- `player_events`: what happened to a subscribed player between the state the socket
  last sent and the new version (entered_top_100, rank_changed, ...);
- `subscription_parse` / `client_message_parse`: the query string and the only client
  message accepted, with the close code and error a bad one gets (`region_refusal`: a
  region the season does not have);
- `board_fields`: what names the board a message is of (a region's, or nothing for the
  global one);
- `splice`: one JSON object serialized once per version and process, extended with the
  few per-socket fields by string concatenation instead of re-serializing the top 100
  for every socket;
- `version_text`: a socket's whole `version` message from the shared texts and what the
  socket last sent;
- `recovery_payload`: the progress of a running recovery, as the `unavailable` message
  carries it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import orjson

from leaderboard.core.events import check_player_id
from leaderboard.core.ranking import RADIUS_MAX, Entry
from leaderboard.core.season_options import check_region, unknown_region_detail

TOP_LIMIT = 100
RADIUS_DEFAULT = 5

# Close codes of the live socket (4000-4999 are the application's own, RFC 6455 7.4.2).
CLOSE_BAD_REQUEST = 4400
CLOSE_UNKNOWN_SEASON = 4404
# Like an unknown season: there is no board to follow, and retrying will not make one.
CLOSE_UNKNOWN_REGION = 4404
CLOSE_SLOW_CONSUMER = 4408
CLOSE_TOO_MANY_SNAPSHOTS = 4429

# A client message is a tiny JSON object; anything longer is not one we accept.
CLIENT_MESSAGE_MAX_CHARS = 256

TopEntry = Mapping[str, Any]


# ------------------------------------------------------------------------------- top 100


def top_diff(old: Sequence[TopEntry], new: Sequence[TopEntry]) -> dict[str, Any]:
    """The new top as the entries that differ, position by position, from the old one.

    `length` is the new top's length (it shrinks when a revoked player leaves a small
    board); `set` holds every entry of the new top whose position holds something else in
    the old one (another player, score or rank), in position order. A change below the top
    100, the usual case, is an empty `set`; one player entering at position k is the
    101 - k entries that moved down. Applying it needs the old top exactly, so the message
    carrying it names its base version and a client that holds another asks for a snapshot.
    """
    changed = [dict(entry) for index, entry in enumerate(new) if index >= len(old) or dict(old[index]) != entry]
    return {"length": len(new), "set": changed}


class DiffMismatch(ValueError):
    """The diff does not fit the top it is applied to: the client needs a snapshot."""


def top_apply(old: Sequence[TopEntry], diff: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The new top from the old one and `top_diff(old, new)`: exactly `new` again."""
    length = int(diff["length"])
    out: list[dict[str, Any] | None] = [dict(entry) for entry in old[:length]]
    out.extend([None] * (length - len(out)))
    for entry in diff["set"]:
        index = int(entry["position"]) - 1
        if not 0 <= index < length:
            raise DiffMismatch(f"position {index + 1} outside a top of {length}")
        out[index] = dict(entry)
    if any(entry is None for entry in out):
        raise DiffMismatch("the diff leaves positions of the new top empty")
    return [entry for entry in out if entry is not None]


# ------------------------------------------------------------------------------- players


@dataclass(frozen=True, slots=True)
class PlayerMark:
    """What a socket last told its client about its player: enough to derive events."""

    position: int
    rank: int
    score: int

    @classmethod
    def of(cls, entry: Entry | None) -> PlayerMark | None:
        return None if entry is None else cls(position=entry.position, rank=entry.rank, score=entry.score)


def player_events(before: PlayerMark | None, after: PlayerMark | None, *, top: int = TOP_LIMIT) -> list[dict[str, Any]]:
    """Events of one player between two states (None: not ranked in that version).

    Relative to what the socket last sent, not to the version before: a socket that
    skipped a version (it was slow, or its read was superseded) still gets the events
    that take its client from what it shows to what is true now. "Top" is by position,
    like the top 100 list itself: a player tied at rank 100 but at position 101 is not
    in it.
    """
    events: list[dict[str, Any]] = []
    if before is None and after is None:
        return events
    if before is None:
        assert after is not None
        events.append({"type": "ranked", "rank": after.rank, "position": after.position, "score": after.score})
        if after.position <= top:
            events.append({"type": "entered_top_100", "position": after.position, "rank": after.rank})
        return events
    if after is None:
        if before.position <= top:
            events.append({"type": "left_top_100", "position": None, "rank": None})
        events.append({"type": "unranked", "previous_rank": before.rank})
        return events
    if before.score != after.score:
        events.append({"type": "score_changed", "from": before.score, "to": after.score})
    if before.rank != after.rank:
        events.append({"type": "rank_changed", "from": before.rank, "to": after.rank})
    if before.position > top >= after.position:
        events.append({"type": "entered_top_100", "position": after.position, "rank": after.rank})
    elif before.position <= top < after.position:
        events.append({"type": "left_top_100", "position": after.position, "rank": after.rank})
    return events


def neighbors_within(entries: Sequence[Entry], position: int, radius: int) -> list[Entry]:
    """The entries within `radius` positions of `position` (a wider window, sliced)."""
    return [entry for entry in entries if abs(entry.position - position) <= radius]


# How an entry goes out to a client (core.ranking.Entry.as_dict, or with names and tier).
Shown = Callable[[Entry], dict[str, Any]]


def player_payload(player_id: str, entry: Entry | None, neighbors: Sequence[Entry], radius: int,
                   events: list[dict[str, Any]] | None = None, *, shown: Shown = Entry.as_dict,
                   percentile: float | None = None, rank_24h_ago: int | None = None) -> dict[str, Any]:
    """The followed player's part of a message: their entry and neighbours as `shown` makes
    them (with names and tiers, views.names.entry_dict), their percentile and their rank a
    day before (the global board's hourly snapshots)."""
    payload: dict[str, Any] = {
        "player_id": player_id,
        "ranked": entry is not None,
        "entry": None if entry is None else shown(entry),
        "percentile": percentile if entry is not None else None,
        "rank_24h_ago": rank_24h_ago if entry is not None else None,
        "radius": radius,
        "neighbors": [shown(e) for e in neighbors] if entry is not None else [],
    }
    if events is not None:
        payload["events"] = events
    return payload


# -------------------------------------------------------------------------- the protocol


@dataclass(frozen=True, slots=True)
class Subscription:
    player_id: str | None
    radius: int
    # The region whose board the socket follows; None: the global board.
    region: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    code: int
    error: str
    detail: str

    def message(self) -> dict[str, Any]:
        return {"type": "error", "error": self.error, "detail": self.detail}


def subscription_parse(query_string: bytes | str) -> Subscription | Refusal:
    """`?player_id=P&radius=R&region=G` of the socket URL; all optional (an empty region
    is the global board, as on the read API), anything else ignored."""
    text = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
    try:
        params = parse_qs(text, keep_blank_values=True, strict_parsing=False, max_num_fields=16)
    except ValueError:
        return Refusal(CLOSE_BAD_REQUEST, "bad_request", "malformed query string")
    player_ids = params.get("player_id", [])
    player_id: str | None = None
    if player_ids:
        if len(player_ids) > 1:
            return Refusal(CLOSE_BAD_REQUEST, "bad_player_id", "player_id given more than once")
        player_id = player_ids[0]
        problem = check_player_id(player_id)
        if problem:
            return Refusal(CLOSE_BAD_REQUEST, "bad_player_id", f"player_id {problem}")
    radius = RADIUS_DEFAULT
    radii = params.get("radius", [])
    if radii:
        try:
            radius = int(radii[-1])
        except ValueError:
            radius = -1
        if not 0 <= radius <= RADIUS_MAX:
            return Refusal(CLOSE_BAD_REQUEST, "bad_radius", f"radius must be an integer in 0..{RADIUS_MAX}")
    regions = params.get("region", [])
    if len(regions) > 1:
        return Refusal(CLOSE_BAD_REQUEST, "bad_region", "region given more than once")
    region = regions[0] if regions and regions[0] else None
    if region is not None and (problem := check_region(region)):
        return Refusal(CLOSE_BAD_REQUEST, "bad_region", f"region {problem}")
    return Subscription(player_id=player_id, radius=radius, region=region)


def region_refusal(region: str | None, regions: Sequence[str]) -> Refusal | None:
    """None when the socket follows the global board or one of the season's `regions`."""
    if region is None or region in regions:
        return None
    return Refusal(CLOSE_UNKNOWN_REGION, "unknown_region", unknown_region_detail(region, regions))


def board_fields(board: str) -> dict[str, str]:
    """The `region` of a regional board's messages; the global board's name none, as the
    read API's answers do (`board` is Manifest.board: "" for the global board)."""
    return {"region": board} if board else {}


def client_message_parse(text: str | None, data: bytes | None) -> Refusal | None:
    """None for the one message a client may send, `{"type": "snapshot"}`; else why not."""
    if text is None or data is not None:
        return Refusal(CLOSE_BAD_REQUEST, "unsupported_message", "only text frames are accepted")
    if len(text) > CLIENT_MESSAGE_MAX_CHARS:
        return Refusal(CLOSE_BAD_REQUEST, "unsupported_message", "message too long")
    try:
        message = orjson.loads(text)
    except orjson.JSONDecodeError:
        return Refusal(CLOSE_BAD_REQUEST, "unsupported_message", "not JSON")
    if not isinstance(message, dict) or message.get("type") != "snapshot":
        return Refusal(CLOSE_BAD_REQUEST, "unsupported_message",
                       'the socket is read-only: the only message accepted is {"type": "snapshot"}')
    return None


class SnapshotBudget:
    """A token bucket for snapshot requests: a client recovering from gaps needs a few; a
    client asking in a loop would make each socket a Redis read amplifier."""

    def __init__(self, *, burst: int = 5, per_second: float = 0.5):
        self.burst = burst
        self.per_second = per_second
        self.tokens = float(burst)
        self.at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.per_second)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def splice(common: str, tail: Mapping[str, Any]) -> str:
    """`common` (a serialized JSON object) with the fields of `tail` added.

    The top 100 of a version is serialized once per process, not once per socket; each
    socket only serializes its own few fields. `tail` must not repeat a key of `common`.
    """
    if not tail:
        return common
    extra = orjson.dumps(dict(tail)).decode()
    if common == "{}":
        return extra
    return common[:-1] + "," + extra[1:]


def version_text(*, version: int, full: str, diff: str | None, sent_version: int | None,
                 subscription: Subscription, mark: PlayerMark | None, entry: Entry | None = None,
                 window: Sequence[Entry] = (), shown: Shown = Entry.as_dict,
                 percentile: float | None = None, rank_24h_ago: int | None = None) -> tuple[str, PlayerMark | None]:
    """A socket's `version` message and what it then tells its client about its player.

    `full` and `diff` are the version's shared fields serialized once (with the full top,
    and with the diff against version - 1, None when that version is gone); the diff only
    applies on top of exactly version - 1. Events are relative to `mark`, what this
    socket last sent, so a socket that skipped versions still gets the events that take
    its client from what it shows to what is true now; without anything sent before
    (`sent_version` None) there is no baseline and no event.
    """
    tail: dict[str, Any] = {"previous_version": sent_version}
    new_mark = mark
    if subscription.player_id is not None:
        new_mark = PlayerMark.of(entry)
        events = player_events(mark, new_mark) if sent_version is not None else []
        around = neighbors_within(window, entry.position, subscription.radius) if entry is not None else []
        tail["player"] = player_payload(subscription.player_id, entry, around, subscription.radius, events,
                                        shown=shown, percentile=percentile, rank_24h_ago=rank_24h_ago)
    common = diff if diff is not None and sent_version == version - 1 else full
    return splice(common, tail), new_mark


# ------------------------------------------------------------------------------ recovery


def recovery_payload(*, status: str, done: int, total: int, eta_seconds: float | None) -> dict[str, Any]:
    """A running recovery's progress for the live page: players copied of the total, and
    the copy's ETA. The ETA covers the copy only: once every player is copied the job
    checks the copies against the ledger before it publishes (`status` "comparing"),
    which has no ETA of its own, so none is given then rather than a misleading 0."""
    total = max(int(total), 0)
    done = min(max(int(done), 0), total) if total else 0
    eta = None
    if status == "building" and eta_seconds is not None and math.isfinite(eta_seconds):
        eta = max(int(math.ceil(eta_seconds)), 0)
    return {
        "status": status, "done": done, "total": total,
        "percent": round(100.0 * done / total, 1) if total else 0.0,
        "eta_seconds": eta,
    }
