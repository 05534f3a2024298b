"""The staff console, mounted under /staff/ (config/urls.py)."""

from django.urls import path

from seasons import staff_views as v

app_name = "staff"

urlpatterns = [
    path("login/", v.LoginView.as_view(), name="login"),
    path("logout/", v.LogoutView.as_view(), name="logout"),
    path("", v.overview, name="overview"),
    path("overview/stats", v.overview_stats, name="overview-stats"),
    path("seasons/<slug:slug>/", v.season_page, name="season"),
    path("seasons/<slug:slug>/stats", v.season_stats, name="season-stats"),
    path("seasons/<slug:slug>/lifecycle", v.season_lifecycle, name="season-lifecycle"),
    path("seasons/<slug:slug>/splits", v.split_propose, name="split-propose"),
    path("seasons/<slug:slug>/rebuilds/", v.rebuilds, name="rebuilds"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/", v.rebuild_page, name="rebuild"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/progress", v.rebuild_progress, name="rebuild-progress"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/publish", v.rebuild_publish_action, name="rebuild-publish"),
    path("seasons/<slug:slug>/rebuilds/<int:job_id>/discard", v.rebuild_discard_action, name="rebuild-discard"),
    path("seasons/<slug:slug>/reconciliation/", v.reconciliation, name="reconciliation"),
    path("seasons/<slug:slug>/reconciliation/<int:run_id>/", v.reconciliation_run_page, name="reconciliation-run"),
    path("seasons/<slug:slug>/players/", v.player_lookup, name="player-lookup"),
    path("seasons/<slug:slug>/players/<str:player_id>/", v.player_page, name="player"),
    path("seasons/<slug:slug>/late/", v.late_results, name="late-results"),
    path("seasons/<slug:slug>/late/<int:late_id>/apply", v.late_result_apply, name="late-apply"),
    path("seasons/<slug:slug>/late/<int:late_id>/dismiss", v.late_result_dismiss_action, name="late-dismiss"),
    path("seasons/<slug:slug>/final/", v.final_page, name="final"),
    path("seasons/<slug:slug>/final/build", v.final_build, name="final-build"),
    path("seasons/<slug:slug>/final/<int:candidate_id>/propose", v.final_propose, name="final-propose"),
    path("seasons/<slug:slug>/final/<int:candidate_id>/approve", v.final_approve, name="final-approve"),
    path("seasons/<slug:slug>/final/<int:candidate_id>/reject", v.final_reject, name="final-reject"),
    path("disputes/", v.disputes, name="disputes"),
    path("disputes/new", v.dispute_new, name="dispute-new"),
    path("disputes/<int:dispute_id>/", v.dispute_page, name="dispute"),
    path("disputes/<int:dispute_id>/assign", v.dispute_assign_action, name="dispute-assign"),
    path("disputes/<int:dispute_id>/notes", v.dispute_note_action, name="dispute-note"),
    path("disputes/<int:dispute_id>/reject", v.dispute_reject_action, name="dispute-reject"),
    path("disputes/<int:dispute_id>/revocation", v.dispute_revocation, name="dispute-revocation"),
    path("revocations/", v.revocations, name="revocations"),
    path("revocations/new", v.revocation_new, name="revocation-new"),
    path("revocations/<int:revocation_id>/", v.revocation_page, name="revocation"),
    path("revocations/<int:revocation_id>/approve", v.revocation_approve_action, name="revocation-approve"),
    path("revocations/<int:revocation_id>/reject", v.revocation_reject_action, name="revocation-reject"),
    path("audit/", v.audit, name="audit"),
    path("audit/export.csv", v.audit_export, name="audit-export"),
    path("audit/verify", v.audit_verify, name="audit-verify"),
]
