"""Forms of the staff console: input checks and nothing else (the services hold the rules)."""

from __future__ import annotations

from typing import Any

from django import forms

from leaderboard.core.buckets import MAX_SCORE_LIMIT
from leaderboard.core.events import MAX_REASON_LENGTH, MIN_SCORE, check_player_id
from leaderboard.core.season_options import MODES, ORDER_ASC, ORDER_DESC
from seasons.models import Dispute, ScoreRevocation, Season
from seasons.staff.accounts.selectors import staff_users


def _player_id(value: str) -> str:
    problem = check_player_id(value)
    if problem:
        raise forms.ValidationError(f"player id {problem}")
    return value


class PlayerLookupForm(forms.Form):
    player_id = forms.CharField(max_length=64, label="Player id")

    def clean_player_id(self) -> str:
        return _player_id(self.cleaned_data["player_id"].strip())


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), max_length=10_000)


class OptionalReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), max_length=10_000, required=False)


class LifecycleForm(forms.Form):
    TARGETS = [("OPEN", "Open the season"), ("CLOSING", "Close (cutoff passed)"), ("seal", "Seal ingest")]
    target = forms.ChoiceField(choices=TARGETS)
    reason = forms.CharField(max_length=10_000, required=False)


class RegionsForm(forms.Form):
    regions = forms.CharField(max_length=2000, required=False,
                              help_text="comma-separated, e.g. na, eu, apac; empty: no regions")
    reason = forms.CharField(max_length=10_000, required=False)

    def clean_regions(self) -> list[str]:
        # The names themselves are the service's rule (season_regions_set): its refusal is shown.
        return [r.strip() for r in self.cleaned_data["regions"].split(",") if r.strip()]


class ModeForm(forms.Form):
    """A SCHEDULED season's kind: its mode and score range."""

    mode = forms.ChoiceField(choices=[(mode, mode) for mode in MODES])
    order = forms.ChoiceField(choices=[(ORDER_DESC, "higher first (desc)"), (ORDER_ASC, "lower first (asc)")])
    max_score = forms.IntegerField(min_value=1, max_value=MAX_SCORE_LIMIT, label="Highest score",
                                   help_text="scores are in 0..this; the buckets follow the range")
    reason = forms.CharField(max_length=10_000, required=False)


class SplitProposeForm(forms.Form):
    split_points = forms.CharField(max_length=2000, help_text="comma-separated scores where new buckets start")
    reason = forms.CharField(max_length=10_000, required=False)

    def clean_split_points(self) -> list[object]:
        points: list[object] = [p.strip() for p in self.cleaned_data["split_points"].split(",") if p.strip()]
        if not points:
            raise forms.ValidationError("give at least one split point")
        return points


class DisputeFileForm(forms.Form):
    season = forms.ModelChoiceField(queryset=Season.objects.order_by("-starts_at"), to_field_name="slug")
    player_id = forms.CharField(max_length=64)
    summary = forms.CharField(max_length=200)
    details = forms.CharField(widget=forms.Textarea(attrs={"rows": 4}), required=False, max_length=10_000)
    claimed_score = forms.IntegerField(min_value=MIN_SCORE, max_value=MAX_SCORE_LIMIT, required=False)
    match_id = forms.CharField(max_length=64, required=False)

    def clean_player_id(self) -> str:
        return _player_id(self.cleaned_data["player_id"].strip())


class DisputeFilterForm(forms.Form):
    STATUSES = [("active", "open or revocation proposed"), ("", "any")] + list(Dispute.Status.choices)
    season = forms.CharField(required=False)
    status = forms.ChoiceField(choices=STATUSES, required=False)
    assignee = forms.CharField(required=False)
    player_id = forms.CharField(required=False, max_length=64)


class DisputeAssignForm(forms.Form):
    assignee = forms.ModelChoiceField(queryset=staff_users(), required=False, empty_label="(unassigned)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Evaluated per form, not once at import: staff accounts come and go.
        self.fields["assignee"].queryset = staff_users()  # type: ignore[attr-defined]


class NoteForm(forms.Form):
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=10_000, label="Note")


class RevocationProposeForm(forms.Form):
    player_id = forms.CharField(max_length=64)
    new_score = forms.IntegerField(min_value=MIN_SCORE, max_value=MAX_SCORE_LIMIT, label="Corrected score")
    # The reason is written into the ledger's correction event (at most 500 characters).
    reason = forms.CharField(max_length=MAX_REASON_LENGTH, widget=forms.Textarea(attrs={"rows": 2}))
    evidence = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=10_000,
                               help_text="links, match ids, log excerpts")
    public_reason = forms.CharField(
        max_length=200, required=False, label="Public reason",
        help_text="shown to everyone if this corrects a FINAL season (no names, no evidence); "
                  "default: “score corrected after staff review”",
    )

    def clean_player_id(self) -> str:
        return _player_id(self.cleaned_data["player_id"].strip())


class RevocationFilterForm(forms.Form):
    status = forms.ChoiceField(choices=[("", "any")] + list(ScoreRevocation.Status.choices), required=False)
    season = forms.CharField(required=False)


class AuditFilterForm(forms.Form):
    season = forms.CharField(required=False)
    actor = forms.CharField(required=False)
    action = forms.CharField(required=False, help_text="a prefix: 'dispute.' finds every dispute action")
    date_from = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    date_to = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
