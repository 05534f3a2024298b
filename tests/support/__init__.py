"""Helpers shared by the tests, by topic: writing scores and reading the ledger (writes),
publishing versions and checking them (publication), players' regions (profiles), seasons
through their lifecycle to FINAL (lifecycle), killable child processes (failure) and stopping
one (processes). Import them from here: `from tests.support import Events, post_ok, publish`.
The browser, the staff console's helpers and fixtures, the reference ledger model and the
local Redis Cluster are modules of their own (`from tests.support import browser`)."""

from tests.support.failure import (
    CHILD_SETUP,
    ROOT,
    audit_action_failing,
    child_database_url,
    child_env,
    epoch_child,
    epoch_child_killed_inside_apply,
    part_worker,
    recovery_jobs,
)
from tests.support.lifecycle import (
    RECONCILIATION_CHECKS,
    canonical_sha256,
    closing_season,
    create_season_command,
    final_rows,
    finalize,
    held_correction_approve,
    in_season,
    iso,
    seal_and_build,
    staff,
)
from tests.support.live import live_run
from tests.support.processes import process_stop
from tests.support.profiles import Profiles
from tests.support.publication import (
    DEFAULT_KIND,
    INVARIANT_CHECKS,
    NARROW,
    announcements_muted,
    assert_board_equals,
    assert_idle_copy_caught_up,
    assert_matches_ledger,
    board_read,
    board_snapshot,
    builds_counted,
    copy_contents,
    current_manifest,
    epoch,
    fast_get,
    full_check,
    keys_of,
    materialize,
    publish,
    reader_of,
    season_data_keys,
    season_in_parts,
)
from tests.support.shared_index import keyed_place, model_apply, plain_place
from tests.support.writes import (
    COMPLETED_AT,
    TEST_ACTOR,
    Events,
    Post,
    apply_events,
    change_head,
    db_scores,
    db_standings,
    is_postgres,
    ledger_rows,
    players,
    post_ok,
    scores_at_watermark,
    statuses,
)

__all__ = [
    "create_season_command",
    "DEFAULT_KIND",
    "announcements_muted",
    "CHILD_SETUP", "COMPLETED_AT", "INVARIANT_CHECKS", "NARROW", "RECONCILIATION_CHECKS", "ROOT", "TEST_ACTOR",
    "held_correction_approve",
    "Events", "Post", "Profiles",
    "apply_events", "assert_board_equals", "audit_action_failing", "assert_idle_copy_caught_up",
    "assert_matches_ledger", "board_read", "board_snapshot", "builds_counted", "canonical_sha256", "change_head",
    "child_database_url", "child_env", "closing_season", "copy_contents", "current_manifest", "db_scores",
    "db_standings", "epoch", "epoch_child", "epoch_child_killed_inside_apply", "fast_get", "final_rows", "finalize",
    "full_check", "in_season", "is_postgres", "iso", "ledger_rows", "keys_of", "live_run", "materialize", "part_worker",
    "players", "post_ok", "process_stop", "publish", "reader_of", "recovery_jobs", "scores_at_watermark",
    "seal_and_build", "season_data_keys", "season_in_parts", "staff", "statuses", "keyed_place", "model_apply",
    "plain_place",
]
