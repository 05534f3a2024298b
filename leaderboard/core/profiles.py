"""Player profiles and friend lists as the trusted profile and social services send them
(docs/api.md, Player profiles and friends): their validation, and the rules that decide
each write (docs/rules.md, Regional and friends boards).

Hand-written like the score events' parser (leaderboard/core/events.py), with errors keyed
by JSON path (`profiles[3].region`, `friends[7]`) and the same id rule. The database layer
fetches the stored profiles, `profiles_plan` decides every item in order, and the database
layer writes the plan: the decision stays exact and testable without a database.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
# Fields an item may leave out: the stored value stays (null clears it).
PROFILE_OPTIONAL_FIELDS = ("display_name", "country")
MAX_DISPLAY_NAME = 32
# ISO 3166-1 alpha-2, the officially assigned codes.
COUNTRIES = frozenset((
    "AD", "AE", "AF", "AG", "AI", "AL", "AM", "AO", "AQ", "AR", "AS", "AT", "AU", "AW", "AX", "AZ", "BA", "BB", "BD",
    "BE", "BF", "BG", "BH", "BI", "BJ", "BL", "BM", "BN", "BO", "BQ", "BR", "BS", "BT", "BV", "BW", "BY", "BZ", "CA",
    "CC", "CD", "CF", "CG", "CH", "CI", "CK", "CL", "CM", "CN", "CO", "CR", "CU", "CV", "CW", "CX", "CY", "CZ", "DE",
    "DJ", "DK", "DM", "DO", "DZ", "EC", "EE", "EG", "EH", "ER", "ES", "ET", "FI", "FJ", "FK", "FM", "FO", "FR", "GA",
    "GB", "GD", "GE", "GF", "GG", "GH", "GI", "GL", "GM", "GN", "GP", "GQ", "GR", "GS", "GT", "GU", "GW", "GY", "HK",
    "HM", "HN", "HR", "HT", "HU", "ID", "IE", "IL", "IM", "IN", "IO", "IQ", "IR", "IS", "IT", "JE", "JM", "JO", "JP",
    "KE", "KG", "KH", "KI", "KM", "KN", "KP", "KR", "KW", "KY", "KZ", "LA", "LB", "LC", "LI", "LK", "LR", "LS", "LT",
    "LU", "LV", "LY", "MA", "MC", "MD", "ME", "MF", "MG", "MH", "MK", "ML", "MM", "MN", "MO", "MP", "MQ", "MR", "MS",
    "MT", "MU", "MV", "MW", "MX", "MY", "MZ", "NA", "NC", "NE", "NF", "NG", "NI", "NL", "NO", "NP", "NR", "NU", "NZ",
    "OM", "PA", "PE", "PF", "PG", "PH", "PK", "PL", "PM", "PN", "PR", "PS", "PT", "PW", "PY", "QA", "RE", "RO", "RS",
    "RU", "RW", "SA", "SB", "SC", "SD", "SE", "SG", "SH", "SI", "SJ", "SK", "SL", "SM", "SN", "SO", "SR", "SS", "ST",
    "SV", "SX", "SY", "SZ", "TC", "TD", "TF", "TG", "TH", "TJ", "TK", "TL", "TM", "TN", "TO", "TR", "TT", "TV", "TW",
    "TZ", "UA", "UG", "UM", "US", "UY", "UZ", "VA", "VC", "VE", "VG", "VI", "VN", "VU", "WF", "WS", "YE", "YT", "ZA",
    "ZM", "ZW",
))
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


def display_name_normal(value: object) -> tuple[str | None, str | None]:
    """(the name in NFC, None) for a valid display name, else (None, what is wrong): 1..32
    characters after NFC normalisation, letters (with their combining marks), digits,
    spaces and _-. only, no leading or trailing space. Control characters, symbols and
    every other punctuation are refused, so a name cannot fake a layout or another field."""
    if not isinstance(value, str):
        return None, "must be a string, or null to clear it"
    name = unicodedata.normalize("NFC", value)
    if not 1 <= len(name) <= MAX_DISPLAY_NAME:
        return None, f"must be 1..{MAX_DISPLAY_NAME} characters after NFC normalisation, got {len(name)}"
    if name != name.strip(" "):
        return None, "must not start or end with a space"
    for i, char in enumerate(name):
        category = unicodedata.category(char)
        if char in " _-." or category[0] == "L" or category == "Nd" or (category[0] == "M" and i > 0):
            continue
        return None, f"character {i + 1} ({char!r}, U+{ord(char):04X}) is not a letter, digit, space or _-."
    return name, None


def check_country(value: object) -> str | None:
    if not isinstance(value, str) or value not in COUNTRIES:
        return "must be an ISO 3166-1 alpha-2 code in upper case (US, DE, BR), or null to clear it"
    return None


def name_matches(name: str | None, blocked: str | None) -> bool:
    """Whether `name` is a name staff reset (compared case-insensitively, after NFC): such a
    name never comes back through a profile write."""
    return name is not None and blocked is not None and name.casefold() == blocked.casefold()


@dataclass(frozen=True, slots=True)
class ProfileWrite:
    player_id: str
    # None: the player has no region (clears it).
    region: str | None
    profile_version: int
    # The optional fields the item carries (PROFILE_OPTIONAL_FIELDS); those it leaves out
    # keep their stored values.
    carries: frozenset[str] = frozenset()
    display_name: str | None = None
    country: str | None = None


@dataclass(frozen=True, slots=True)
class StoredProfile:
    region: str | None
    profile_version: int
    display_name: str | None = None
    country: str | None = None
    # The name staff last reset (player.name.reset): a write naming it keeps no name.
    name_blocked: str | None = None


@dataclass(frozen=True, slots=True)
class ProfileOutcome:
    player_id: str
    status: str
    # What is stored once this item is decided: the item's own values unless it is stale.
    region: str | None
    profile_version: int
    display_name: str | None = None
    country: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"player_id": self.player_id, "status": self.status, "region": self.region,
                "profile_version": self.profile_version, "display_name": self.display_name,
                "country": self.country}


@dataclass(frozen=True, slots=True)
class ProfileChange:
    """One history row: every applied or unchanged item, in the order decided."""

    player_id: str
    old_region: str | None
    region: str | None
    profile_version: int
    display_name: str | None = None
    country: str | None = None


@dataclass(frozen=True, slots=True)
class ProfilesPlan:
    outcomes: list[ProfileOutcome]
    changes: list[ProfileChange]
    # Each player whose profile moved: its state after the whole batch.
    writes: dict[str, StoredProfile]


def profile_status(*, stored: StoredProfile | None, write: ProfileWrite) -> str:
    """The outcome of one profile write against what is stored.

    A version not newer than the stored one is `stale`. A newer one is `applied` when it
    changes the region, the name or the country, else `unchanged` (its version is still
    recorded). A player with no profile yet has none of them: a first profile naming one
    is `applied`, a first profile that sets none is `unchanged`. The name and country
    count only when the item carries them.
    """
    if stored is not None and write.profile_version <= stored.profile_version:
        return STALE
    before = stored or StoredProfile(region=None, profile_version=0)
    after = profile_after(before, write)
    return APPLIED if after != replace(before, profile_version=write.profile_version) else UNCHANGED


def profile_after(stored: StoredProfile, write: ProfileWrite) -> StoredProfile:
    """What is stored once `write` (not stale) applies to `stored`: a name staff reset
    stays cleared."""
    name = write.display_name if "display_name" in write.carries else stored.display_name
    if name_matches(name, stored.name_blocked):
        name = None
    return StoredProfile(region=write.region, profile_version=write.profile_version, display_name=name,
                         country=write.country if "country" in write.carries else stored.country,
                         name_blocked=stored.name_blocked)


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
            after = profile_after(before or StoredProfile(region=None, profile_version=0), write)
            current[write.player_id] = moved[write.player_id] = after
            changes.append(ProfileChange(player_id=write.player_id, old_region=before.region if before else None,
                                         region=write.region, profile_version=write.profile_version,
                                         display_name=after.display_name, country=after.country))
        # Stale only against a stored profile: after any item the player has one.
        now = current[write.player_id]
        outcomes.append(ProfileOutcome(player_id=write.player_id, status=status, region=now.region,
                                       profile_version=now.profile_version, display_name=now.display_name,
                                       country=now.country))
    return ProfilesPlan(outcomes=outcomes, changes=changes, writes=moved)


def _profile_parse(raw: Any, path: str, errors: dict[str, list[str]]) -> ProfileWrite | None:
    if not isinstance(raw, dict):
        errors[path] = ["must be a JSON object"]
        return None
    start = len(errors)

    def fail(field: str, message: str) -> None:
        errors.setdefault(f"{path}.{field}", []).append(message)

    for field in sorted(map(str, raw.keys() - set(PROFILE_FIELDS) - set(PROFILE_OPTIONAL_FIELDS))):
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
    name = raw.get("display_name")
    if name is not None:
        name, problem = display_name_normal(name)
        if problem:
            fail("display_name", problem)
    country = raw.get("country")
    if country is not None and (problem := check_country(country)):
        fail("country", problem)
    if len(errors) != start:
        return None
    return ProfileWrite(player_id=raw["player_id"], region=region, profile_version=version,  # type: ignore[arg-type]
                        carries=frozenset(raw.keys() & set(PROFILE_OPTIONAL_FIELDS)), display_name=name,
                        country=country)


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
