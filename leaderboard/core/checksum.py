"""An order-independent checksum of a bucket's (player, score) pairs.

In a first_reached season the "score" hashed is the text "score:reached_ms"
(core.tiebreak.value_token), so a wrong reached_at changes the checksum too.

The sum of a 64-bit hash per pair, modulo 2**64: adding or removing one pair updates it
in O(1), and a full scan recomputes it in any order. A missing, extra or wrong-score
member changes it with probability 1 - 2**-64.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

MODULUS = 2**64


_blake2b = hashlib.blake2b
_from_bytes = int.from_bytes


def pair_hash(player_id: str, score: int | str) -> int:
    # Two pairs are hashed per changed player in every epoch: no attribute lookups here.
    return _from_bytes(_blake2b(f"{player_id}\x00{score}".encode(), digest_size=8).digest(), "big")


def checksum_add(checksum: int, player_id: str, score: int | str) -> int:
    return (checksum + pair_hash(player_id, score)) % MODULUS


def checksum_remove(checksum: int, player_id: str, score: int | str) -> int:
    return (checksum - pair_hash(player_id, score)) % MODULUS


def checksum_of(pairs: Iterable[tuple[str, int | str]]) -> int:
    total = 0
    for player_id, score in pairs:
        total += pair_hash(player_id, score)
    return total % MODULUS
