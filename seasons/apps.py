from django.apps import AppConfig


class SeasonsConfig(AppConfig):
    name = "seasons"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed

        from seasons.staff.accounts import services as accounts

        # Sign-ins belong to "who did what": the audit trail records them. Failures are
        # counted instead (anyone can cause them; accounts.staff_login_failed_count).
        user_logged_in.connect(accounts.staff_login_audit, dispatch_uid="staff-login-audit")
        user_logged_out.connect(accounts.staff_logout_audit, dispatch_uid="staff-logout-audit")
        user_login_failed.connect(accounts.staff_login_failed_count, dispatch_uid="staff-login-failed-count")
