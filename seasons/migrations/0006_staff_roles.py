"""The staff console's roles: Django groups holding the StaffConsole permissions.

Permissions are normally created after migrations (post_migrate); the groups need them
now, so they are created here (the post_migrate pass then finds them in place). The
mapping is frozen here as of this migration; seasons.staff.accounts.services.staff_roles_ensure
re-applies the current one (create_staff calls it, so a flushed test database heals).
"""

from django.db import migrations

PERMISSIONS = {
    "console_view": "Can view the staff console",
    "disputes_manage": "Can file, assign, annotate and reject disputes",
    "revocation_propose": "Can propose score revocations",
    "late_results_dismiss": "Can dismiss late results",
    "views_operate": "Can start rebuilds, splits and reconciliation runs",
    "final_propose": "Can build and propose FINAL candidates",
    "revocation_approve": "Can approve or reject score revocations",
    "split_publish": "Can publish or discard split layouts",
    "final_approve": "Can approve or reject FINAL candidates",
    "season_transition": "Can open, close and seal seasons",
}
VIEWER = ["console_view"]
REVIEWER = VIEWER + ["disputes_manage", "revocation_propose", "late_results_dismiss", "views_operate",
                     "final_propose"]
APPROVER = REVIEWER + ["revocation_approve", "split_publish", "final_approve", "season_transition"]
ROLES = {"viewer": VIEWER, "reviewer": REVIEWER, "approver": APPROVER}


def roles_create(apps, schema_editor):  # type: ignore[no-untyped-def]
    content_type_model = apps.get_model("contenttypes", "ContentType")
    permission_model = apps.get_model("auth", "Permission")
    group_model = apps.get_model("auth", "Group")
    # The database being migrated (every ledger database runs these migrations too).
    db = schema_editor.connection.alias
    content_type, _ = content_type_model.objects.using(db).get_or_create(app_label="seasons", model="staffconsole")
    permissions = {
        codename: permission_model.objects.using(db).get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )[0]
        for codename, name in PERMISSIONS.items()
    }
    for role, codenames in ROLES.items():
        group, _ = group_model.objects.using(db).get_or_create(name=role)
        group.permissions.set([permissions[c] for c in codenames])


def roles_remove(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("auth", "Group").objects.using(schema_editor.connection.alias).filter(
        name__in=list(ROLES)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("seasons", "0005_staff_console"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(roles_create, roles_remove)]
