"""Player profiles and friend lists as the trusted profile and social services send them
(docs/api.md, Player profiles and friends): their validation, and the rules that decide
each write (docs/rules.md, Regional and friends boards).

Hand-written like the score events' parser (leaderboard/core/events.py), with errors keyed
by JSON path (`profiles[3].region`, `friends[7]`) and the same id rule. The database layer
fetches the stored profiles, `profiles_plan` decides every item in order, and the database
layer writes the plan: the decision stays exact and testable without a database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leaderboard.core.errors import DomainError
from leaderboard.core.events import BIGINT_MAX, MAX_BATCH, check_int, check_player_id
from leaderboard.core.ledger import APPLIED, STALE, UNCHANGED
from leaderboard.core.season_options import check_region

MAX_PROFILE_BATCH = MAX_BATCH
MAX_PROFILE_VERSION = BIGINT_MAX
MAX_FRIENDS = 1000
MAX_GRAPH_VERSION = BIGINT_MAX

PROFILE_FIELDS = ("player_id", "region", "profile_version")
FRIENDS_FIELDS = ("friends", "graph_version")


class ProfileValidationError(DomainError):
    """A malformed profiles or friends body: `errors` by JSON path; nothing is written."""

    code = "validation_error"

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("the request is invalid; nothing was written", extra={"fields": errors})
        self.errors = errors


class ProfileBatchTooLarge(DomainError):
    code = "payload_too_large"
    status = 413

    def __init__(self, size: int):
        super().__init__(f"a batch holds at most {MAX_PROFILE_BATCH} profiles, got {size}")
        self.size = size


class StaleGraphVersion(DomainError):
    """A friend list whose graph_version is not newer than the stored one: nothing changes."""

    code = "stale_graph_version"
    status = 409

    def __init__(self, *, stored: int, sent: int):
        super().__init__(f"graph_version {sent} is not newer than the stored {stored}; the friend list is unchanged",
                         extra={"graph_version": stored})


# ------------------------------------------------------------------------------ profiles


@dataclass(frozen=True, slots=True)
class ProfileWrite:
    player_id: str
    # None: the player has no region (clears it).
    region: str | None
    profile_version: int


@dataclass(frozen=True, slots=True)
class StoredProfile:
    region: str | None
    profile_version: int


@dataclass(frozen=True, slots=True)
class ProfileOutcome:
    player_id: str
    status: str
    # What is stored once this item is decided: the item's own values unless it is stale.
    region: str | None
    profile_version: int

    def as_dict(self) -> dict[str, object]:
        return {"player_id": self.player_id, "status": self.status, "region": self.region,
                "profile_version": self.profile_version}


@dataclass(frozen=True, slots=True)
class ProfileChange:
    """One history row: every applied or unchanged item, in the order decided."""

    player_id: str
    old_region: str | None
    region: str | None
    profile_version: int


@dataclass(frozen=True, slots=True)
class ProfilesPlan:
    outcomes: list[ProfileOutcome]
    changes: list[ProfileChange]
    # Each player whose profile moved: its state after the whole batch.
    writes: dict[str, StoredProfile]


def profile_status(*, stored: StoredProfile | None, write: ProfileWrite) -> str:
    """The outcome of one profile write against what is stored.

    A version not newer than the stored one is `stale`. A newer one is `applied` when it
    changes the region, else `unchanged` (its version is still recorded). A player with
    no profile yet has no region: a first profile naming one is `applied`, a first
    profile with region null is `unchanged`.
    """
    if stored is None:
        return APPLIED if write.region is not None else UNCHANGED
    if write.profile_version <= stored.profile_version:
        return STALE
    return APPLIED if write.region != stored.region else UNCHANGED


def profiles_plan(*, writes: Sequence[ProfileWrite], stored: Mapping[str, StoredProfile]) -> ProfilesPlan:
    """Decide a batch in order: a player written twice sees its own earlier item."""
    current: dict[str, StoredProfile] = dict(stored)
    moved: dict[str, StoredProfile] = {}
    outcomes: list[ProfileOutcome] = []
    changes: list[ProfileChange] = []
    for write in writes:
        before = current.get(write.player_id)
        status = profile_status(stored=before, write=write)
        if status != STALE:
            after = StoredProfile(region=write.region, profile_version=write.profile_version)
            current[write.player_id] = moved[write.player_id] = after
            changes.append(ProfileChange(player_id=write.player_id, old_region=before.region if before else None,
                                         region=write.region, profile_version=write.profile_version))
        # Stale only against a stored profile: after any item the player has one.
        now = current[write.player_id]
        outcomes.append(ProfileOutcome(player_id=write.player_id, status=status, region=now.region,
                                       profile_version=now.profile_version))
    return ProfilesPlan(outcomes=outcomes, changes=changes, writes=moved)


def _profile_parse(raw: Any, path: str, errors: dict[str, list[str]]) -> ProfileWrite | None:
    if not isinstance(raw, dict):
        errors[path] = ["must be a JSON object"]
        return None
    start = len(errors)

    def fail(field: str, message: str) -> None:
        errors.setdefault(f"{path}.{field}", []).append(message)

    for field in sorted(map(str, raw.keys() - set(PROFILE_FIELDS))):
        fail(field, "unknown field")
    for field in PROFILE_FIELDS:
        if field not in raw:
            fail(field, "this field is required" + (" (null clears the region)" if field == "region" else ""))
    if "player_id" in raw and (problem := check_player_id(raw["player_id"])):
        fail("player_id", problem)
    region = raw.get("region")
    if region is not None and (problem := check_region(region)):
        fail("region", f"{problem}, or null")
    version = raw.get("profile_version")
    if "profile_version" in raw and (problem := check_int(version, low=1, high=MAX_PROFILE_VERSION)):
        fail("profile_version", problem)
    if len(errors) != start:
        return None
    return ProfileWrite(player_id=raw["player_id"], region=region, profile_version=version)  # type: ignore[arg-type]


def profiles_parse(body: Any) -> list[ProfileWrite]:
    """Validate `{"profiles": [...]}` with 1..1,000 items; all or nothing (any invalid item
    makes the whole request a 400), over 1,000 items is a 413."""
    if not isinstance(body, dict):
        raise ProfileValidationError({"body": ["must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    for field in sorted(map(str, body.keys() - {"profiles"})):
        errors[field] = ["unknown field (the body holds only 'profiles')"]
    raw = body.get("profiles")
    if "profiles" not in body:
        errors["profiles"] = ["this field is required"]
    elif not isinstance(raw, list):
        errors["profiles"] = ["must be a list of profile objects"]
    elif not raw:
        errors["profiles"] = ["must hold at least one profile"]
    elif len(raw) > MAX_PROFILE_BATCH:
        raise ProfileBatchTooLarge(len(raw))
    if errors:
        raise ProfileValidationError(errors)
    assert isinstance(raw, list)
    parsed = [_profile_parse(item, f"profiles[{i}]", errors) for i, item in enumerate(raw)]
    if errors:
        raise ProfileValidationError(errors)
    return [p for p in parsed if p is not None]


# ------------------------------------------------------------------------------- friends


@dataclass(frozen=True, slots=True)
class FriendsWrite:
    friends: list[str]
    graph_version: int


def friends_parse(body: Any, *, player_id: str) -> FriendsWrite:
    """Validate `{"friends": [player_id, ...], "graph_version": N}` for `player_id`: at most
    1,000 ids by the id rule, distinct (a repeated id is a 400, not silently merged: the
    social service sent something it did not mean), never the player itself."""
    if not isinstance(body, dict):
        raise ProfileValidationError({"body": ["must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    for field in sorted(map(str, body.keys() - set(FRIENDS_FIELDS))):
        errors[field] = ["unknown field"]
    for field in FRIENDS_FIELDS:
        if field not in body:
            errors[field] = ["this field is required"]
    friends = body.get("friends")
    if "friends" in body:
        if not isinstance(friends, list):
            errors["friends"] = ["must be a list of player ids"]
        elif len(friends) > MAX_FRIENDS:
            errors["friends"] = [f"must hold at most {MAX_FRIENDS} ids, got {len(friends)}"]
        else:
            first_at: dict[str, int] = {}
            for i, friend in enumerate(friends):
                if problem := check_player_id(friend):
                    errors[f"friends[{i}]"] = [problem]
                elif friend == player_id:
                    errors[f"friends[{i}]"] = ["is the player itself: a player is not their own friend"]
                elif friend in first_at:
                    errors[f"friends[{i}]"] = [f"repeats friends[{first_at[friend]}]: friends must be distinct"]
                else:
                    first_at[friend] = i
    version = body.get("graph_version")
    if "graph_version" in body and (problem := check_int(version, low=1, high=MAX_GRAPH_VERSION)):
        errors["graph_version"] = [problem]
    if errors:
        raise ProfileValidationError(errors)
    return FriendsWrite(friends=list(friends), graph_version=version)  # type: ignore[arg-type]


def friends_stale(*, stored_version: int | None, graph_version: int) -> bool:
    """A friend list replaces the stored one only with a strictly newer graph_version."""
    return stored_version is not None and graph_version <= stored_version
