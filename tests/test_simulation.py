"""The match-service stand-in of the demo (leaderboard.simulation): its events follow the
ledger's rules, and it honours a staff revocation as the ledger asks a match service to."""

from __future__ import annotations

from leaderboard.simulation import MatchSimulator

WHEN = "2026-11-15T12:00:00.000Z"


def test_a_revocation_is_acknowledged_by_a_correction_and_later_results_start_from_it() -> None:
    sim = MatchSimulator(players=["p1", "p2"], seed=3)
    while sim._by_id["p1"].best < 10_000:
        sim.batch(10, completed_at=WHEN)
    best, version = sim._by_id["p1"].best, sim._by_id["p1"].version
    revoked = best // 2
    sim.acknowledge_revocation("p1", revoked)
    sim.acknowledge_revocation("p1", revoked)  # a resent event's answer asks again: one correction
    first, *rest = sim.batch(20, completed_at=WHEN)
    assert (first["player_id"], first["kind"], first["best_score"]) == ("p1", "correction", revoked)
    assert first["score_version"] > version and first["reason"]
    assert not [e for e in rest if e.get("kind") == "correction" and e["best_score"] == revoked]
    later = [e["best_score"] for e in rest if e["player_id"] == "p1" and "kind" not in e]
    assert later and min(later) >= revoked and max(later) < best
    assert sim.acknowledged == 1


def test_a_revocation_above_the_simulated_best_asks_nothing() -> None:
    sim = MatchSimulator(players=["p1"], seed=1)
    sim.batch(5, completed_at=WHEN)
    sim.acknowledge_revocation("p1", sim._by_id["p1"].best + 1)
    sim.acknowledge_revocation("nobody", 5)
    assert sim.acknowledged == 0
    assert not [e for e in sim.batch(5, completed_at=WHEN) if "acknowledged" in e.get("reason", "")]
