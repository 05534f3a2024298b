"""The staff console, mounted under /staff/ (config/urls.py)."""

from django.urls import path

from seasons.staff_views import audit, console, disputes, final, season

app_name = "staff"

urlpatterns = [
    path("login/", console.LoginView.as_view(), name="login"),
    path("logout/", console.LogoutView.as_view(), name="logout"),
    path("", console.overview, name="overview"),
    path("overview/stats", console.overview_stats, name="overview-stats"),
    path("seasons/<slug:slug>/", season.season_page, name="season"),
    path("seasons/<slug:slug>/stats", season.season_stats, name="season-stats"),
    path("seasons/<slug:slug>/lifecycle", season.season_lifecycle, name="season-lifecycle"),
    path("seasons/<slug:slug>/regions", season.season_regions, name="season-regions"),
    path("seasons/<slug:slug>/mode", season.season_mode, name="season-mode"),
    path("seasons/<slug:slug>/regions/sizes", season.season_region_sizes, name="season-region-sizes"),
    path("seasons/<slug:slug>/splits", season.split_propose, name="split-propose"),
    path("seasons/<slug:slug>/rebuilds/", season.rebuilds, name="rebuilds"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/", season.rebuild_page, name="rebuild"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/progress", season.rebuild_progress, name="rebuild-progress"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/publish", season.rebuild_publish_action, name="rebuild-publish"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/discard", season.rebuild_discard_action, name="rebuild-discard"),
    path("seasons/<slug:slug>/reconciliation/", season.reconciliation, name="reconciliation"),
    path("seasons/<slug:slug>/reconciliation/<int:run_id>/", season.reconciliation_run_page, name="reconciliation-run"),
    path("seasons/<slug:slug>/players/", season.player_lookup, name="player-lookup"),
    path("seasons/<slug:slug>/players/<str:player_id>/", season.player_page, name="player"),
    path("seasons/<slug:slug>/late/", disputes.late_results, name="late-results"),
    path("seasons/<slug:slug>/late/<int:late_id>/apply", disputes.late_result_apply, name="late-apply"),
    path("seasons/<slug:slug>/late/<int:late_id>/dismiss", disputes.late_result_dismiss_action, name="late-dismiss"),
    # A late result outside "default", named by its database (each numbers its own).
    path("seasons/<slug:slug>/late/<str:alias>/<int:late_id>/apply", disputes.late_result_apply,
         name="late-apply-in"),
    path("seasons/<slug:slug>/late/<str:alias>/<int:late_id>/dismiss", disputes.late_result_dismiss_action,
         name="late-dismiss-in"),
    path("seasons/<slug:slug>/final/", final.final_page, name="final"),
    path("seasons/<slug:slug>/final/build", final.final_build, name="final-build"),
    path("seasons/<slug:slug>/final/<int:candidate_id>/propose", final.final_propose, name="final-propose"),
    path("seasons/<slug:slug>/final/<int:candidate_id>/approve", final.final_approve, name="final-approve"),
    path("seasons/<slug:slug>/final/<int:candidate_id>/reject", final.final_reject, name="final-reject"),
    path("disputes/", disputes.disputes, name="disputes"),
    path("disputes/new", disputes.dispute_new, name="dispute-new"),
    path("disputes/<int:dispute_id>/", disputes.dispute_page, name="dispute"),
    path("disputes/<int:dispute_id>/assign", disputes.dispute_assign_action, name="dispute-assign"),
    path("disputes/<int:dispute_id>/notes", disputes.dispute_note_action, name="dispute-note"),
    path("disputes/<int:dispute_id>/reject", disputes.dispute_reject_action, name="dispute-reject"),
    path("disputes/<int:dispute_id>/revocation", disputes.dispute_revocation, name="dispute-revocation"),
    path("revocations/", disputes.revocations, name="revocations"),
    path("revocations/new", disputes.revocation_new, name="revocation-new"),
    path("revocations/<int:revocation_id>/", disputes.revocation_page, name="revocation"),
    path("revocations/<int:revocation_id>/approve", disputes.revocation_approve_action, name="revocation-approve"),
    path("revocations/<int:revocation_id>/reject", disputes.revocation_reject_action, name="revocation-reject"),
    path("revocations/<int:revocation_id>/rebase", disputes.revocation_rebase_action, name="revocation-rebase"),
    path("audit/", audit.audit, name="audit"),
    path("audit/export.csv", audit.audit_export, name="audit-export"),
    path("audit/verify", audit.audit_verify, name="audit-verify"),
]
