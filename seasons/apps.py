from django.apps import AppConfig


class SeasonsConfig(AppConfig):
    name = "seasons"
    default_auto_field = "django.db.models.BigAutoField"
