"""Players' regions written as the profile service would (leaderboard.profiles)."""

from __future__ import annotations

from leaderboard.core.profiles import ProfileWrite
from leaderboard.profiles import player_profiles_apply


class Profiles:
    """Profile writes with a version per player that only goes up."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}

    def set(self, **regions: str | None) -> None:
        writes = []
        for player_id, region in regions.items():
            self.versions[player_id] = self.versions.get(player_id, 0) + 1
            writes.append(ProfileWrite(player_id=player_id, region=region, profile_version=self.versions[player_id]))
        player_profiles_apply(profiles=writes, client=None)
