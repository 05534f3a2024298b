"""The shared index's tests' stand-ins: two small board layouts (buckets of 10 points, keyed
-score as a shared board's or by large keys with milliseconds in the low bits as a
first_reached board's), and the plain copy each copy of the index is checked against."""

from __future__ import annotations

from collections.abc import Mapping


def plain_place(value: str) -> tuple[int, int]:
    """A shared board's (bucket, key) of a value's lookup text: buckets of 10, key -score."""
    score = int(value)
    return score // 10, -score


def keyed_place(value: str) -> tuple[int, int]:
    """A first_reached board's, of "score:reached_ms": keys up to ~2**44, reached_ms in the
    low 40 bits under the points below the bucket's top."""
    score, _, reached = value.partition(":")
    return int(score) // 10, ((9 - int(score) % 10) << 40) | int(reached)


def model_apply(model: dict[str, str], changes: Mapping[str, str | None]) -> None:
    """What a plain copy holds after an epoch's changes (None: the player leaves the board)."""
    for player_id, value in changes.items():
        if value is None:
            model.pop(player_id, None)
        else:
            model[player_id] = value
