"""The audit trail: filtered, exported as CSV with its hashes, and verified."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from audit.services import audit_chain_verify
from seasons import staff_forms as f
from seasons.staff.audit import selectors as sel
from seasons.staff_views.common import context, staff_required


def _audit_rows(request: HttpRequest) -> tuple[f.AuditFilterForm, Any]:
    form = f.AuditFilterForm(request.GET)
    data = form.cleaned_data if form.is_valid() else {}
    return form, sel.audit_filtered(season=data.get("season", ""), actor=data.get("actor", ""),
                                    action=data.get("action", ""), date_from=data.get("date_from"),
                                    date_to=data.get("date_to"))


@require_GET
@staff_required("console_view")
def audit(request: HttpRequest) -> HttpResponse:
    form, rows = _audit_rows(request)
    page = Paginator(rows, 100).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "staff/audit.html", context(request, form=form, page=page, query=query.urlencode()))


class _Echo:
    def write(self, value: str) -> str:
        return value


AUDIT_COLUMNS = ("seq", "id", "created_at", "actor_type", "actor_id", "actor_label", "action", "target_type",
                 "target_id", "season_slug", "before", "after", "reason", "prev_hash", "row_hash")


@require_GET
@staff_required("console_view")
def audit_export(request: HttpRequest) -> StreamingHttpResponse:
    """The filtered rows as CSV, streamed; with the hashes, so the export can be checked offline."""
    _, rows = _audit_rows(request)
    writer = csv.writer(_Echo())

    def lines() -> Iterator[Any]:
        yield writer.writerow(AUDIT_COLUMNS)
        for row in rows.order_by("seq").values_list(*AUDIT_COLUMNS).iterator(chunk_size=2000):
            values = list(row)
            values[2] = values[2].isoformat()
            values[10] = json.dumps(values[10], sort_keys=True) if values[10] is not None else ""
            values[11] = json.dumps(values[11], sort_keys=True) if values[11] is not None else ""
            # A cell starting with = + - @ is a formula to a spreadsheet: neutralise it.
            yield writer.writerow([f"'{v}" if isinstance(v, str) and v[:1] in "=+-@" else v for v in values])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="audit.csv"'
    return response


@require_POST
@staff_required("console_view")
def audit_verify(request: HttpRequest) -> HttpResponse:
    """Recompute the chain. htmx swaps the result in place; without JS it is a page of its own."""
    report = audit_chain_verify()
    template = "staff/partials/audit_verify.html" if request.htmx else "staff/audit_verify.html"  # type: ignore[attr-defined]
    return render(request, template, context(request, report=report), status=200)
