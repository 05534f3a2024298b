"""Pure tests of the shared index's rules (leaderboard.core.shared_index): random applies of
both copies, in any order, against two plain dicts of what each copy should hold, over an
in-memory stand-in of the buckets, hidden sets and lookup. No database, no Redis."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaderboard.core.shared_index import (
    ADD,
    HIDE,
    REMOVE,
    SECOND,
    SHOW,
    BucketOp,
    Seen,
    SharedIndexError,
    Views,
    change_plan,
    entry_name,
    entry_player,
    hidden_member,
    lookup_decode,
    lookup_encode,
    physical_index,
)
from tests.support import keyed_place, model_apply, plain_place

PLAYERS = ["a", "a.", "ab", "b", "b0", "c:1", "z"]
Place = Callable[[str], tuple[int, int]]


PLACES = {"plain": (plain_place, st.integers(0, 35).map(str)),
          "keyed": (keyed_place, st.builds(lambda s, r: f"{s}:{r}", st.integers(0, 35),
                                           st.sampled_from([0, 1, 2**40 - 1])))}


@dataclass
class Memory:
    """What Redis would hold: buckets (name -> key), hidden sets per (copy, bucket), the lookup."""

    buckets: dict[int, dict[str, int]] = field(default_factory=dict)
    hidden: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    lookup: dict[str, str] = field(default_factory=dict)

    def views(self, player_id: str) -> Views:
        raw = self.lookup.get(player_id)
        return (None, None) if raw is None else lookup_decode(raw)

    def apply(self, op: BucketOp) -> None:
        bucket = self.buckets.setdefault(op.bucket, {})
        hidden = self.hidden.setdefault((op.copy, op.bucket), set())
        member = hidden_member(op.key, op.name)
        if op.op == ADD:
            assert op.name not in bucket and member not in hidden
            bucket[op.name] = op.key
            hidden.add(member)
        elif op.op == REMOVE:
            assert bucket.pop(op.name) == op.key
            hidden.remove(member)
        elif op.op == HIDE:
            assert bucket[op.name] == op.key and member not in hidden
            hidden.add(member)
        else:
            assert op.op == SHOW and bucket[op.name] == op.key
            hidden.remove(member)

    def ordered(self, bucket: int) -> list[tuple[int, bytes]]:
        """The bucket's entries in sorted-set order: key, then name bytes."""
        return sorted((key, name.encode()) for name, key in self.buckets.get(bucket, {}).items())

    def seen_by(self, copy: int) -> dict[str, tuple[int, int, str]]:
        """Every entry copy `copy` sees: player -> (bucket, key, name)."""
        out: dict[str, tuple[int, int, str]] = {}
        for bucket, entries in self.buckets.items():
            hidden = self.hidden.get((copy, bucket), set())
            for name, key in entries.items():
                if hidden_member(key, name) not in hidden:
                    player = entry_player(name)
                    assert player not in out, f"copy {copy} sees {player} twice"
                    out[player] = (bucket, key, name)
        return out


def copy_apply(memory: Memory, copy: int, changes: Mapping[str, str | None], place: Place,
               check: Callable[[], None] = lambda: None) -> None:
    for player_id, value in changes.items():
        ops, after = change_plan(copy=copy, player_id=player_id, views=memory.views(player_id), value=value,
                                 place=place)
        for op in ops:
            memory.apply(op)
            check()
        raw = lookup_encode(after)
        if raw is None:
            memory.lookup.pop(player_id, None)
        else:
            memory.lookup[player_id] = raw


def assert_holds(memory: Memory, models: list[dict[str, str]], place: Place) -> None:
    for copy, model in enumerate(models):
        seen = memory.seen_by(copy)
        assert {p: (b, k) for p, (b, k, _) in seen.items()} == {p: place(v) for p, v in model.items()}
        for player_id, (_, _, name) in seen.items():
            view = memory.views(player_id)[copy]
            assert view is not None and view.value == models[copy][player_id]
            assert name == entry_name(player_id, view.second)
        assert all(memory.views(p)[copy] is None for p in PLAYERS if p not in model)
    for (copy, bucket), hidden in memory.hidden.items():
        entries = {hidden_member(key, name) for name, key in memory.buckets.get(bucket, {}).items()}
        assert hidden <= entries, "a hidden record of no entry"
        assert not hidden & memory.hidden.get((1 - copy, bucket), set()), "an entry no copy sees"
    for player_id in PLAYERS:
        names = [name for entries in memory.buckets.values() for name in entries if entry_player(name) == player_id]
        both = [model.get(player_id) for model in models]
        count = 1 if both[0] == both[1] else sum(v is not None for v in both)
        assert len(names) == (0 if both == [None, None] else count)


def assert_reads_exact(memory: Memory, copy: int) -> None:
    """A copy's count ahead and position in a bucket, and its window's start, from the
    bucket and its hidden set alone (what ZCOUNT, ZRANK, ZLEXCOUNT and ZRANGE give), equal
    those over the entries it sees."""
    for bucket in memory.buckets:
        entries = memory.ordered(bucket)
        hidden = sorted(memory.hidden.get((copy, bucket), set()))
        visible = [(key, name) for key, name in entries if hidden_member(key, name.decode()) not in hidden]

        def hidden_before(bound: str, hidden: list[str] = hidden) -> int:
            return sum(member < bound for member in hidden)

        for at, (key, name) in enumerate(entries):
            if (key, name) not in visible:
                continue
            ahead = sum(k < key for k, _ in entries) - hidden_before(hidden_member(key))
            assert ahead == sum(k < key for k, _ in visible)
            assert at - hidden_before(hidden_member(key, name.decode())) == visible.index((key, name))

        def hidden_through(i: int, entries: list[tuple[int, bytes]] = entries, hidden: list[str] = hidden) -> int:
            member = hidden_member(entries[i][0], entries[i][1].decode())
            return hidden_before(member, hidden) + (member in hidden)

        for index, entry in enumerate(visible):
            assert entries[physical_index(index, hidden_through)] == entry


@pytest.mark.parametrize("layout", sorted(PLACES))
def test_random_applies_of_either_copy_keep_both_exact_and_never_touch_the_other_copy(layout: str) -> None:
    place, values = PLACES[layout]
    step = st.tuples(st.sampled_from([0, 1]), st.dictionaries(st.sampled_from(PLAYERS), st.none() | values,
                                                             max_size=len(PLAYERS)))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(step, max_size=12))
    def run(steps: list[tuple[int, dict[str, str | None]]]) -> None:
        memory = Memory()
        models: list[dict[str, str]] = [{}, {}]
        for copy, changes in steps:
            other = 1 - copy
            before = memory.seen_by(other)

            def other_unchanged(other: int = other, before: dict[str, tuple[int, int, str]] = before) -> None:
                assert memory.seen_by(other) == before

            copy_apply(memory, copy, changes, place, other_unchanged)
            model_apply(models[copy], changes)
            assert_holds(memory, models, place)
            assert_reads_exact(memory, 0)
            assert_reads_exact(memory, 1)

    run()


@given(st.dictionaries(st.sampled_from(PLAYERS), st.integers(0, 35).map(str), min_size=1))
def test_a_lagging_copy_that_applies_the_same_changes_leaves_one_entry_a_player_and_no_hidden_record(
        changes: dict[str, str]) -> None:
    memory = Memory()
    start = {player_id: "5" for player_id in PLAYERS}
    copy_apply(memory, 0, start, plain_place)
    copy_apply(memory, 1, start, plain_place)
    for copy in (0, 1, 0, 1):
        copy_apply(memory, copy, changes, plain_place)
        if copy == 1:
            assert not any(memory.hidden.values())
            assert sorted(entry_player(n) for entries in memory.buckets.values() for n in entries) == sorted(PLAYERS)
            assert not any("|" in raw for raw in memory.lookup.values())


def test_applying_a_copys_value_again_writes_nothing() -> None:
    views: Views = (Seen("7"), Seen("9", second=True))
    assert change_plan(copy=0, player_id="a", views=views, value="7", place=plain_place) == ([], views)
    assert change_plan(copy=1, player_id="a", views=(None, None), value=None, place=plain_place) == ([], (None, None))


def test_a_change_hides_the_shared_entry_and_adds_the_second_name_hidden_from_the_other_copy() -> None:
    ops, after = change_plan(copy=1, player_id="a", views=(Seen("7"), Seen("7")), value="23", place=plain_place)
    assert ops == [BucketOp(HIDE, 0, -7, "a", 1), BucketOp(ADD, 2, -23, "a" + SECOND, 0)]
    assert after == (Seen("7"), Seen("23", second=True))
    assert lookup_encode(after) == "7|~23"


def test_the_lagging_copy_drops_its_own_entry_and_is_shown_the_other_copys() -> None:
    ops, after = change_plan(copy=0, player_id="a", views=(Seen("7"), Seen("23", second=True)), value="23",
                             place=plain_place)
    assert ops == [BucketOp(REMOVE, 0, -7, "a", 1), BucketOp(SHOW, 2, -23, "a" + SECOND, 0)]
    assert after == (Seen("23", second=True),) * 2
    assert lookup_encode(after) == "~23"


@given(st.lists(st.tuples(st.integers(-1_000_000, 2**53 - 1), st.sampled_from(["", *PLAYERS, "a" + SECOND])),
                min_size=2))
def test_hidden_members_sort_as_the_bucket_does_by_key_then_name_bytes(entries: list[tuple[int, str]]) -> None:
    assert sorted(entries, key=lambda e: (e[0], e[1].encode())) == sorted(entries, key=lambda e: hidden_member(*e))


@given(st.tuples(st.none() | st.builds(Seen, st.sampled_from(["0", "12", "5:99"]), st.booleans()),
                 st.none() | st.builds(Seen, st.sampled_from(["0", "12", "5:99"]), st.booleans())))
def test_the_lookup_text_reads_back_as_both_copies_views(views: Views) -> None:
    raw = lookup_encode(views)
    if views == (None, None):
        assert raw is None
    else:
        assert raw is not None and lookup_decode(raw.encode()) == views


@pytest.mark.parametrize("key", [-(2**40) - 1, 2**53])
def test_a_sort_key_outside_the_hidden_sets_encoding_is_refused(key: int) -> None:
    with pytest.raises(SharedIndexError):
        hidden_member(key, "a")


@pytest.mark.parametrize("raw", ["", "|", "~", "7|7", "~7|~7"])
def test_a_lookup_text_that_names_no_entry_or_one_twice_is_refused(raw: str) -> None:
    with pytest.raises(SharedIndexError):
        lookup_decode(raw)
