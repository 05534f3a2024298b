"""The pure rules of player profiles, friend lists and season options (leaderboard/core/profiles.py,
leaderboard/core/season_options.py): no database."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaderboard.core.profiles import (
    MAX_FRIENDS,
    ProfileBatchTooLarge,
    ProfileValidationError,
    ProfileWrite,
    StoredProfile,
    friends_parse,
    friends_stale,
    profile_status,
    profiles_parse,
    profiles_plan,
)
from leaderboard.core.season_options import check_region, regions_problem, tie_break_problem

# An outcome of a profile without a name or country.
NO_NAME = {"display_name": None, "country": None}


def write(player_id: str, region: str | None, version: int) -> ProfileWrite:
    return ProfileWrite(player_id=player_id, region=region, profile_version=version)


# --- the outcome of one profile write ---------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "item", "status"),
    [
        (None, write("p", "eu", 1), "applied"),
        (None, write("p", None, 1), "unchanged"),
        (StoredProfile("eu", 3), write("p", "na", 4), "applied"),
        (StoredProfile("eu", 3), write("p", None, 4), "applied"),
        (StoredProfile(None, 3), write("p", "na", 4), "applied"),
        (StoredProfile("eu", 3), write("p", "eu", 4), "unchanged"),
        (StoredProfile(None, 3), write("p", None, 9), "unchanged"),
        (StoredProfile("eu", 3), write("p", "na", 3), "stale"),
        (StoredProfile("eu", 3), write("p", "na", 2), "stale"),
        (StoredProfile("eu", 3), write("p", "eu", 3), "stale"),
    ],
)
def test_profile_status_by_version_and_region(stored: StoredProfile | None, item: ProfileWrite, status: str) -> None:
    assert profile_status(stored=stored, write=item) == status


def test_a_batch_writing_one_player_twice_takes_effect_in_order() -> None:
    plan = profiles_plan(
        writes=[write("a", "eu", 5), write("a", "na", 4), write("a", "na", 6), write("a", "na", 7)],
        stored={"a": StoredProfile("apac", 2)},
    )
    assert [o.as_dict() for o in plan.outcomes] == [
        {"player_id": "a", "status": "applied", "region": "eu", "profile_version": 5, **NO_NAME},
        {"player_id": "a", "status": "stale", "region": "eu", "profile_version": 5, **NO_NAME},
        {"player_id": "a", "status": "applied", "region": "na", "profile_version": 6, **NO_NAME},
        {"player_id": "a", "status": "unchanged", "region": "na", "profile_version": 7, **NO_NAME},
    ]
    assert [(c.old_region, c.region, c.profile_version) for c in plan.changes] == [
        ("apac", "eu", 5), ("eu", "na", 6), ("na", "na", 7),
    ]
    assert plan.writes == {"a": StoredProfile("na", 7)}


def test_stale_items_write_nothing_and_report_what_is_stored() -> None:
    plan = profiles_plan(writes=[write("a", "eu", 1)], stored={"a": StoredProfile("na", 8)})
    assert plan.outcomes[0].as_dict() == {"player_id": "a", "status": "stale", "region": "na", "profile_version": 8,
                                          **NO_NAME}
    assert plan.changes == [] and plan.writes == {}


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([None, "eu", "na"]),
                          st.integers(min_value=1, max_value=8)), min_size=1, max_size=12))
def test_plan_matches_applying_items_one_at_a_time(items: list[tuple[str, str | None, int]]) -> None:
    """A batch decides exactly as the same items sent one request at a time."""
    writes = [write(*item) for item in items]
    plan = profiles_plan(writes=writes, stored={})
    stored: dict[str, StoredProfile] = {}
    history = []
    for item, outcome in zip(writes, plan.outcomes, strict=True):
        single = profiles_plan(writes=[item], stored=stored)
        assert single.outcomes == [outcome]
        stored.update(single.writes)
        history.extend(single.changes)
    assert plan.changes == history
    assert plan.writes == stored
    for player in {p for p, _, _ in items}:
        recorded = [c.profile_version for c in plan.changes if c.player_id == player]
        assert recorded == sorted(set(recorded)), "a player's history must be in increasing version order"


# --- parsing a profiles body ------------------------------------------------------------------


def test_profiles_parse_takes_regions_and_null() -> None:
    body = {"profiles": [{"player_id": "p-1", "region": "eu-west", "profile_version": 3},
                         {"player_id": "p-2", "region": None, "profile_version": 2**63 - 1}]}
    assert profiles_parse(body) == [write("p-1", "eu-west", 3), write("p-2", None, 2**63 - 1)]


@pytest.mark.parametrize(
    ("item", "fields"),
    [
        ({"player_id": "bad id", "region": "eu", "profile_version": 1}, ["profiles[0].player_id"]),
        ({"player_id": "p", "region": "EU", "profile_version": 1}, ["profiles[0].region"]),
        ({"player_id": "p", "region": "", "profile_version": 1}, ["profiles[0].region"]),
        ({"player_id": "p", "region": "r" * 17, "profile_version": 1}, ["profiles[0].region"]),
        ({"player_id": "p", "region": "e_u", "profile_version": 1}, ["profiles[0].region"]),
        ({"player_id": "p", "region": 7, "profile_version": 1}, ["profiles[0].region"]),
        ({"player_id": "p", "region": "eu", "profile_version": 0}, ["profiles[0].profile_version"]),
        ({"player_id": "p", "region": "eu", "profile_version": True}, ["profiles[0].profile_version"]),
        ({"player_id": "p", "region": "eu", "profile_version": 2**63}, ["profiles[0].profile_version"]),
        ({"player_id": "p", "profile_version": 1}, ["profiles[0].region"]),
        ({"region": "eu", "profile_version": 1}, ["profiles[0].player_id"]),
        ({"player_id": "p", "region": "eu", "profile_version": 1, "score": 3}, ["profiles[0].score"]),
        ("p", ["profiles[0]"]),
    ],
)
def test_profiles_parse_names_each_bad_field(item: Any, fields: list[str]) -> None:
    with pytest.raises(ProfileValidationError) as refused:
        profiles_parse({"profiles": [{"player_id": "ok", "region": "eu", "profile_version": 1}, item]})
    assert list(refused.value.errors) == [f.replace("[0]", "[1]") for f in fields]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ([], {"body": ["must be a JSON object"]}),
        ({}, {"profiles": ["this field is required"]}),
        ({"profiles": []}, {"profiles": ["must hold at least one profile"]}),
        ({"profiles": {}}, {"profiles": ["must be a list of profile objects"]}),
        ({"profiles": [], "extra": 1}, {"extra": ["unknown field (the body holds only 'profiles')"],
                                        "profiles": ["must hold at least one profile"]}),
    ],
)
def test_profiles_parse_refuses_a_bad_body_shape(body: Any, fields: dict[str, list[str]]) -> None:
    with pytest.raises(ProfileValidationError) as refused:
        profiles_parse(body)
    assert refused.value.errors == fields


def test_profiles_parse_over_1000_items_is_too_large() -> None:
    item = {"player_id": "p", "region": "eu", "profile_version": 1}
    assert len(profiles_parse({"profiles": [item] * 1000})) == 1000
    with pytest.raises(ProfileBatchTooLarge) as refused:
        profiles_parse({"profiles": [item] * 1001})
    assert refused.value.status == 413


# --- friend lists -----------------------------------------------------------------------------


def test_friends_parse_keeps_the_list_in_order() -> None:
    parsed = friends_parse({"friends": ["b", "a", "c"], "graph_version": 4}, player_id="me")
    assert (parsed.friends, parsed.graph_version) == (["b", "a", "c"], 4)
    assert friends_parse({"friends": [], "graph_version": 1}, player_id="me").friends == []


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"friends": ["a", "me"], "graph_version": 1}, {"friends[1]": ["is the player itself: a player is not "
                                                                       "their own friend"]}),
        ({"friends": ["a", "b", "a"], "graph_version": 1}, {"friends[2]": ["repeats friends[0]: friends must be "
                                                                           "distinct"]}),
        ({"friends": ["a", "no way"], "graph_version": 1}, {"friends[1]": ["must be 1..64 characters from "
                                                                           "[A-Za-z0-9_.:-]"]}),
        ({"friends": "a", "graph_version": 1}, {"friends": ["must be a list of player ids"]}),
        ({"friends": ["a"], "graph_version": 0}, {"graph_version": ["out of range: must be in 1..9223372036854775807 "
                                                                     "(the largest 64-bit integer)"]}),
        ({"friends": ["a"], "graph_version": "2"}, {"graph_version": ["must be an integer in 1..9223372036854775807"]}),
        ({"friends": ["a"]}, {"graph_version": ["this field is required"]}),
        ({"graph_version": 1}, {"friends": ["this field is required"]}),
        ({"friends": [], "graph_version": 1, "x": 1}, {"x": ["unknown field"]}),
        ([], {"body": ["must be a JSON object"]}),
    ],
)
def test_friends_parse_refuses_with_field_errors(body: Any, fields: dict[str, list[str]]) -> None:
    with pytest.raises(ProfileValidationError) as refused:
        friends_parse(body, player_id="me")
    assert refused.value.errors == fields


def test_friends_parse_takes_1000_friends_and_not_1001() -> None:
    friends = [f"f{i}" for i in range(MAX_FRIENDS + 1)]
    assert len(friends_parse({"friends": friends[:-1], "graph_version": 1}, player_id="me").friends) == MAX_FRIENDS
    with pytest.raises(ProfileValidationError) as refused:
        friends_parse({"friends": friends, "graph_version": 1}, player_id="me")
    assert refused.value.errors == {"friends": ["must hold at most 1000 ids, got 1001"]}


@pytest.mark.parametrize(("stored", "sent", "stale"), [(None, 1, False), (3, 4, False), (3, 3, True), (3, 2, True)])
def test_a_friend_list_needs_a_strictly_newer_graph_version(stored: int | None, sent: int, stale: bool) -> None:
    assert friends_stale(stored_version=stored, graph_version=sent) is stale


# --- season options ---------------------------------------------------------------------------


@pytest.mark.parametrize("region", ["na", "eu-west", "a", "0", "r" * 16, "-"])
def test_valid_region_names(region: str) -> None:
    assert check_region(region) is None


@pytest.mark.parametrize("region", ["", "EU", "e u", "r" * 17, "é", "eu_west", None, 3])
def test_invalid_region_names(region: object) -> None:
    assert check_region(region) is not None


@pytest.mark.parametrize(
    ("regions", "problem"),
    [
        ([], None),
        (["na", "eu", "apac"], None),
        ([f"r{i}" for i in range(16)], None),
        ([f"r{i}" for i in range(17)], "a season has at most 16 regions, got 17"),
        (["na", "eu", "na"], "region 'na' is listed twice: regions must be distinct"),
        (["na", "EU"], "region 'EU' must be 1..16 characters from [a-z0-9-]"),
    ],
)
def test_season_regions_are_a_small_set_of_distinct_valid_names(regions: list[str], problem: str | None) -> None:
    assert regions_problem(regions) == problem


def test_tie_break_is_shared_or_first_reached() -> None:
    assert tie_break_problem("shared") is None and tie_break_problem("first_reached") is None
    assert tie_break_problem("coin_flip") == "tie_break must be one of shared, first_reached, got 'coin_flip'"
