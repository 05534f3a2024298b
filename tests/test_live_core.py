"""Pure unit tests of the live-board core (leaderboard.core.live): top-100 diffs, player
events, the socket's query string and client messages, the snapshot budget and the JSON
splice. No database, no Redis, no Channels."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaderboard.core.live import (
    CLOSE_BAD_REQUEST,
    RADIUS_DEFAULT,
    DiffMismatch,
    PlayerMark,
    Refusal,
    SnapshotBudget,
    Subscription,
    client_message_parse,
    neighbors_within,
    player_events,
    player_payload,
    recovery_payload,
    splice,
    subscription_parse,
    top_apply,
    top_diff,
    version_text,
)
from leaderboard.core.ranking import Entry, Standings

ID_ALPHABET = "-.0123456789:ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
boards = st.dictionaries(st.text(alphabet=ID_ALPHABET, min_size=1, max_size=6), st.integers(0, 50), max_size=130)


def top_of(scores: dict[str, int], limit: int = 100) -> list[dict[str, object]]:
    return [e.as_dict() for e in Standings(scores).top(limit)]


# --- top diffs -------------------------------------------------------------------------------


def test_no_change_in_the_top_is_an_empty_diff() -> None:
    top = top_of({"a": 3, "b": 2, "c": 1})
    assert top_diff(top, top) == {"length": 3, "set": []}
    assert top_apply(top, {"length": 3, "set": []}) == top


def test_a_player_entering_shifts_only_the_positions_below_it() -> None:
    before = {f"p{i:03d}": 1000 - i for i in range(120)}
    after = dict(before, newcomer=1000 - 50)  # ties p050 at 950, sorts before it ("n" < "p")
    old, new = top_of(before), top_of(after)
    diff = top_diff(old, new)
    assert diff["length"] == 100
    assert [e["position"] for e in diff["set"]] == list(range(51, 101))
    assert diff["set"][0] == {"position": 51, "rank": 51, "player_id": "newcomer", "score": 950}
    # p050 keeps its rank (a tie) but moves to position 52.
    assert diff["set"][1] == {"position": 52, "rank": 51, "player_id": "p050", "score": 950}
    assert top_apply(old, diff) == new


def test_a_shrinking_top_applies() -> None:
    old = top_of({"a": 3, "b": 2, "c": 1})
    new = top_of({"a": 3, "c": 1})
    diff = top_diff(old, new)
    assert diff == {"length": 2, "set": [{"position": 2, "rank": 2, "player_id": "c", "score": 1}]}
    assert top_apply(old, diff) == new


def test_a_diff_on_the_wrong_base_is_refused_not_misapplied() -> None:
    old = top_of({"a": 3})
    new = top_of({"a": 3, "b": 2, "c": 1})
    diff = top_diff(old, new)
    with pytest.raises(DiffMismatch):
        top_apply([], diff)  # position 1 missing: not the base the diff was made on
    with pytest.raises(DiffMismatch):
        top_apply(old, {"length": 1, "set": [{"position": 2, "rank": 2, "player_id": "x", "score": 0}]})


@settings(max_examples=300, deadline=None)
@given(before=boards, after=boards)
def test_apply_of_diff_is_the_new_top(before: dict[str, int], after: dict[str, int]) -> None:
    old, new = top_of(before), top_of(after)
    diff = top_diff(old, new)
    assert top_apply(old, diff) == new
    # Only positions whose entry changed are sent.
    assert len(diff["set"]) == sum(1 for i, e in enumerate(new) if i >= len(old) or old[i] != e)


# --- player events ---------------------------------------------------------------------------


def mark(position: int, rank: int, score: int) -> PlayerMark:
    return PlayerMark(position=position, rank=rank, score=score)


def types(events: list[dict[str, object]]) -> list[object]:
    return [e["type"] for e in events]


def test_no_events_when_nothing_changed() -> None:
    assert player_events(mark(5, 4, 100), mark(5, 4, 100)) == []
    assert player_events(None, None) == []


def test_climbing_into_the_top_100() -> None:
    events = player_events(mark(150, 149, 500), mark(42, 40, 900))
    assert events == [
        {"type": "score_changed", "from": 500, "to": 900},
        {"type": "rank_changed", "from": 149, "to": 40},
        {"type": "entered_top_100", "position": 42, "rank": 40},
    ]


def test_pushed_out_of_the_top_100_by_others() -> None:
    events = player_events(mark(100, 100, 500), mark(101, 101, 500))
    assert events == [{"type": "rank_changed", "from": 100, "to": 101},
                      {"type": "left_top_100", "position": 101, "rank": 101}]


def test_the_top_is_by_position_not_rank() -> None:
    # Tied at rank 100, but position 101: not in the top 100 list, so no event.
    assert player_events(mark(101, 100, 7), mark(101, 100, 7)) == []
    assert types(player_events(mark(101, 100, 7), mark(100, 100, 7))) == ["entered_top_100"]


def test_first_ranked_and_revoked() -> None:
    assert types(player_events(None, mark(3, 3, 10))) == ["ranked", "entered_top_100"]
    assert types(player_events(None, mark(300, 280, 10))) == ["ranked"]
    assert types(player_events(mark(3, 3, 10), None)) == ["left_top_100", "unranked"]
    assert types(player_events(mark(300, 300, 10), None)) == ["unranked"]


def test_payload_and_neighbour_slicing() -> None:
    board = Standings({f"p{i}": 100 - i for i in range(20)})
    me = board.entry("p10")
    assert me is not None
    wide = board.neighbors("p10", 10)
    narrow = neighbors_within(wide, me.position, 2)
    assert narrow == board.neighbors("p10", 2)
    payload = player_payload("p10", me, narrow, 2, [{"type": "rank_changed", "from": 12, "to": 11}])
    assert payload["ranked"] is True
    assert payload["entry"] == me.as_dict()
    assert [e["player_id"] for e in payload["neighbors"]] == ["p8", "p9", "p10", "p11", "p12"]
    assert payload["events"][0]["type"] == "rank_changed"
    absent = player_payload("nobody", None, [], 2)
    assert absent == {"player_id": "nobody", "ranked": False, "entry": None, "radius": 2, "neighbors": [],
                      "percentile": None, "rank_24h_ago": None}


def test_player_mark_of_an_entry() -> None:
    assert PlayerMark.of(Entry(position=3, rank=2, player_id="x", score=9)) == mark(3, 2, 9)
    assert PlayerMark.of(None) is None


# --- the protocol ----------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "expected"), [
    (b"", Subscription(player_id=None, radius=RADIUS_DEFAULT)),
    (b"player_id=p-1", Subscription(player_id="p-1", radius=RADIUS_DEFAULT)),
    (b"player_id=a.b%3Ac&radius=10", Subscription(player_id="a.b:c", radius=10)),
    (b"radius=0&unrelated=1", Subscription(player_id=None, radius=0)),
])
def test_subscription_parse_accepts(query: bytes, expected: Subscription) -> None:
    assert subscription_parse(query) == expected


@pytest.mark.parametrize(("query", "error"), [
    (b"player_id=", "bad_player_id"),
    (b"player_id=has%20space", "bad_player_id"),
    (b"player_id=" + b"x" * 65, "bad_player_id"),
    (b"player_id=%C3%A9", "bad_player_id"),
    (b"player_id=a&player_id=b", "bad_player_id"),
    (b"radius=11", "bad_radius"),
    (b"radius=-1", "bad_radius"),
    (b"radius=two", "bad_radius"),
])
def test_subscription_parse_refuses(query: bytes, error: str) -> None:
    refusal = subscription_parse(query)
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.error) == (CLOSE_BAD_REQUEST, error)
    assert refusal.message()["type"] == "error"


def test_only_the_snapshot_message_is_accepted() -> None:
    assert client_message_parse('{"type": "snapshot"}', None) is None
    for text, data in [('{"type": "subscribe"}', None), ("[]", None), ("not json", None), (None, b"\x00"),
                       ('{"type": "snapshot", "pad": "' + "x" * 300 + '"}', None)]:
        refusal = client_message_parse(text, data)
        assert refusal is not None and refusal.code == CLOSE_BAD_REQUEST
        assert refusal.error == "unsupported_message"


def test_snapshot_budget_allows_a_burst_then_a_steady_rate() -> None:
    budget = SnapshotBudget(burst=3, per_second=0.5)
    assert [budget.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.take(1.0) is False  # half a token
    assert budget.take(2.1) is True
    assert budget.take(100.0) and budget.take(100.0) and budget.take(100.0)
    assert budget.take(100.0) is False  # refilled to the burst, not beyond


def test_splice_adds_fields_to_a_serialized_object() -> None:
    common = orjson.dumps({"type": "version", "top": [{"position": 1}]}).decode()
    spliced = splice(common, {"previous_version": None, "player": {"rank": 3}})
    assert orjson.loads(spliced) == {"type": "version", "top": [{"position": 1}], "previous_version": None,
                                     "player": {"rank": 3}}
    assert splice(common, {}) == common
    assert orjson.loads(splice("{}", {"a": 1})) == {"a": 1}


# --- a socket's version message ---------------------------------------------------------------


FULL = orjson.dumps({"type": "version", "leaderboard_version": 7, "top": [{"position": 1}]}).decode()
DIFF = orjson.dumps({"type": "version", "leaderboard_version": 7, "top_diff": {"base_version": 6}}).decode()


def test_the_diff_goes_only_to_a_socket_that_holds_the_version_before() -> None:
    watcher = Subscription(player_id=None, radius=5)
    text, mark = version_text(version=7, full=FULL, diff=DIFF, sent_version=6, subscription=watcher, mark=None)
    assert orjson.loads(text) == {**orjson.loads(DIFF), "previous_version": 6} and mark is None
    for sent, diff in ((5, DIFF), (None, DIFF), (6, None)):
        text, _ = version_text(version=7, full=FULL, diff=diff, sent_version=sent, subscription=watcher, mark=None)
        assert orjson.loads(text) == {**orjson.loads(FULL), "previous_version": sent}


def test_a_player_socket_gets_its_entry_window_and_events_since_what_it_sent() -> None:
    sub = Subscription(player_id="b", radius=1)
    window = [Entry(position=p, rank=p, player_id=pid, score=s)
              for p, pid, s in ((1, "x", 90), (2, "a", 80), (3, "b", 70), (4, "c", 60))]
    before = PlayerMark(position=5, rank=5, score=50)
    text, mark = version_text(version=7, full=FULL, diff=DIFF, sent_version=6, subscription=sub, mark=before,
                              entry=window[2], window=window)
    player = orjson.loads(text)["player"]
    assert mark == PlayerMark(position=3, rank=3, score=70)
    assert player["entry"] == window[2].as_dict() and player["radius"] == 1
    assert player["neighbors"] == [e.as_dict() for e in window[1:4]]
    assert types(player["events"]) == ["score_changed", "rank_changed"]
    # Nothing sent before (a socket that showed "unavailable"): no baseline, no events.
    text, _ = version_text(version=7, full=FULL, diff=DIFF, sent_version=None, subscription=sub, mark=None,
                           entry=window[2], window=window)
    assert orjson.loads(text)["player"]["events"] == []
    # Not ranked in this version.
    text, mark = version_text(version=7, full=FULL, diff=DIFF, sent_version=6, subscription=sub, mark=before)
    player = orjson.loads(text)["player"]
    assert (mark, player["ranked"], player["entry"], player["neighbors"]) == (None, False, None, [])
    assert types(player["events"]) == ["left_top_100", "unranked"]


# --- a recovery's progress --------------------------------------------------------------------


def test_recovery_progress_while_copying_has_an_eta() -> None:
    assert recovery_payload(status="building", done=250, total=1000, eta_seconds=12.2) == {
        "status": "building", "done": 250, "total": 1000, "percent": 25.0, "eta_seconds": 13}


@pytest.mark.parametrize(("status", "done", "total", "eta", "expected"), [
    ("queued", 0, 0, None, {"done": 0, "total": 0, "percent": 0.0, "eta_seconds": None}),
    # Copied: the copies are being checked against the ledger, which has no ETA of its own.
    ("comparing", 1000, 1000, 0.0, {"done": 1000, "total": 1000, "percent": 100.0, "eta_seconds": None}),
    # A rate of 0 so far, or a count past the total, never shows as nonsense.
    ("building", 0, 1000, None, {"done": 0, "total": 1000, "percent": 0.0, "eta_seconds": None}),
    ("building", 1200, 1000, float("inf"), {"done": 1000, "total": 1000, "percent": 100.0, "eta_seconds": None}),
])
def test_recovery_progress_without_an_eta(status: str, done: int, total: int, eta: float | None,
                                          expected: dict[str, object]) -> None:
    assert recovery_payload(status=status, done=done, total=total, eta_seconds=eta) == {"status": status, **expected}
