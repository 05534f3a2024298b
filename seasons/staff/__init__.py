"""The staff console's writes and reads, one subpackage per area (the views are in
seasons/staff_views/): accounts and signing in, disputes, revocations, late results, a
season's pages, a player's pages, the overview (console), FINAL and the audit trail.
What the services share is in `common`.

Services (`services.py`) are the writes. Each is one transaction holding its audit row
(audit.services.audit_log), so an action and its record commit or vanish together. Roles
are enforced by the views (permissions); the rules that must hold whoever calls (the
two-person rule, the states an object may move between) are enforced here. Every service
that takes several row locks takes them in one order
(seasons/staff/disputes/services.py: _dispute_locked).

Selectors (`selectors.py`) are the reads. Database first: the console must keep working
when Redis (a disposable view) is lost, so anything read from Redis is optional and says so.
"""
