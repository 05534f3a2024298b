"""The staff console in a real browser: headless Chromium (Debian's /usr/bin/chromium, driven
by Playwright) against the ASGI app served by uvicorn in a subprocess on the test database.

Two people sign in, a dispute is resolved by a revocation the second one approves, a
rebuild's progress bar moves to 100% without a reload, ingest is sealed, a FINAL is
proposed by one person and approved by the other, and the audit chain verifies. Set SCREENSHOT_DIR to keep PNGs of
the pages along the way.

CI needs the packages `chromium` (apt) and `playwright` (pip; never `playwright install`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run
from seasons.models import Dispute, ScoreRevocation, Season
from seasons.staff.accounts.services import staff_user_create
from tests.support import TEST_ACTOR, Events, browser, closing_season, db_scores, in_season, materialize, post_ok

ROOT = browser.ROOT
shot = browser.shot
CHROMIUM = browser.CHROMIUM
CHROMIUM_ARGS = browser.CHROMIUM_ARGS
PASSWORD = "e2e-staff-password-1"
Post = Callable[..., Any]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.slow,
]


@pytest.fixture
def server(transactional_db: Any) -> Iterator[str]:
    # Plain http on 127.0.0.1: cookies must not be marked Secure or the browser drops them.
    # Rebuilds are run by the test itself (a Celery worker would race it for the job).
    with browser.asgi_server(SESSION_COOKIE_SECURE="false", CSRF_COOKIE_SECURE="false",
                             CELERY_TASK_ALWAYS_EAGER="false") as base:
        yield base


def staff_account(username: str, role: str) -> None:
    # The real password hasher: the server subprocess checks the password with its own settings.
    staff_user_create(username=username, role=role, password=PASSWORD, actor=TEST_ACTOR)


def browse(scenario: Callable[[Any, list[str]], Awaitable[None]]) -> list[str]:
    """Run `scenario(browser, errors)` in headless Chromium; returns the pages' JavaScript errors."""
    from playwright.async_api import async_playwright

    errors: list[str] = []

    async def body() -> None:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                await scenario(browser, errors)
            finally:
                await browser.close()

    async_to_sync(body)()
    return errors


async def signed_in(chromium: Any, base: str, username: str, errors: list[str]) -> Any:
    return await browser.signed_in(chromium, base, username, PASSWORD, errors)


async def message(page: Any) -> str:
    return str(await page.inner_text("#messages")).strip()


@pytest.mark.usefixtures("rank_views")
def test_two_people_run_a_season_to_final_in_the_browser(
    season_factory: Callable[..., Season], post_scores: Post, server: str
) -> None:
    """One browser session of two staff members (one server and one browser, to keep it quick)."""
    season = closing_season(season_factory, "e2e")
    events = Events("e2e", in_season(season))
    # A crowded score range, so the season page has a hot bucket to show.
    post_ok(post_scores, season, [events.result(f"p{i:03d}", 40_000 + 61 * i) for i in range(120)]
            + [events.result(f"q{i:02d}", 7_919 * i) for i in range(60)])
    materialize(season)
    staff_account("rhea", "reviewer")
    staff_account("arno", "approver")
    arun = sync_to_async(rebuild_run)
    amaterialize = sync_to_async(materialize)
    apost = sync_to_async(post_ok)

    async def scenario(browser: Any, errors: list[str]) -> None:
        rhea = await signed_in(browser, server, "rhea", errors)
        await rhea.wait_for_selector(f"tr[data-season='{season.slug}']")
        # The overview's numbers and charts refresh in place (htmx polls its partial).
        version_cell = f"tr[data-season='{season.slug}'] td[data-field='version']"
        first_version = int((await rhea.inner_text(version_cell)).strip())
        await rhea.evaluate("window.notReloaded = true")
        await apost(post_scores, season, [events.result("late-joiner", 1)])
        newer = (await amaterialize(season)).version
        assert newer > first_version
        await rhea.wait_for_function(
            f"document.querySelector(\"{version_cell}\")?.textContent.trim() === '{newer}'", timeout=10_000)
        assert await rhea.evaluate("window.notReloaded === true")
        await shot(rhea, "overview")
        await rhea.click(f"a[href='/staff/seasons/{season.slug}/']")
        await rhea.wait_for_selector("#bucket-chart")
        assert await rhea.locator("#hot-buckets tr.hot").count() >= 1
        await shot(rhea, "season")

        # --- a dispute, resolved by a revocation the second person approves
        await rhea.click("header nav a[href='/staff/disputes/']")
        await rhea.click("#file-dispute")
        await rhea.select_option("select[name=season]", season.slug)
        await rhea.fill("input[name=player_id]", "p007")
        await rhea.fill("input[name=summary]", "points of match m-3 missing")
        await rhea.fill("input[name=claimed_score]", "95000")
        await rhea.click("#dispute-form button[type=submit]")
        await rhea.wait_for_selector("#dispute-status")
        assert "filed" in await message(rhea)
        dispute_url = rhea.url
        await rhea.select_option("#assign-form select[name=assignee]", label="rhea")
        await rhea.click("#assign-form button[type=submit]")
        await rhea.wait_for_function("document.getElementById('dispute-assignee')?.textContent.trim() === 'rhea'")
        await rhea.fill("#note-form textarea", "replay shows 95000")
        await rhea.click("#note-form button[type=submit]")
        await rhea.wait_for_selector("#notes >> text=replay shows 95000")
        await rhea.click("#propose-revocation")
        assert await rhea.input_value("input[name=new_score]") == "95000"  # prefilled with the claim
        await rhea.fill("textarea[name=reason]", "replay of m-3 confirms 95000")
        await rhea.fill("textarea[name=evidence]", "replay id r-77")
        await rhea.click("#revocation-form button[type=submit]")
        await rhea.wait_for_selector("#revocation-status")
        assert (await rhea.inner_text("#revocation-status")).strip() == "proposed"
        assert await rhea.locator("#approve-form").count() == 0  # a reviewer cannot approve
        revocation_path = rhea.url.removeprefix(server)

        arno = await signed_in(browser, server, "arno", errors)
        await arno.click("header nav a[href='/staff/revocations/']")
        await arno.click(f"a[href='{revocation_path}']")
        await arno.fill("#approve-form input[name=reason]", "agree after watching the replay")
        await arno.click("#approve-form button[type=submit]")
        await arno.wait_for_selector("#messages")
        assert (await message(arno)).startswith("Approved and written to the ledger")
        assert (await arno.inner_text("#revocation-status")).strip() == "applied"
        await rhea.goto(dispute_url)
        assert (await rhea.inner_text("#dispute-status")).strip() == "Resolved"
        assert "score revoked to 95000" in await rhea.inner_text("#dispute-resolution")

        # --- a rebuild; the page polls its progress partial every second
        await rhea.goto(f"{server}/staff/seasons/{season.slug}/rebuilds/")
        await rhea.fill("#rebuild-form input[name=reason]", "drill")
        await rhea.click("#rebuild-form button[type=submit]")
        await rhea.wait_for_selector("#rebuild-progress[data-status='queued']")
        assert (await rhea.inner_text("#rebuild-percent")).strip() == "0%"
        await rhea.evaluate("window.notReloaded = true")
        job = await sync_to_async(RebuildJob.objects.get)(season=season, kind="rebuild")
        assert (await arun(job_id=job.pk)).status == "published"
        await rhea.wait_for_selector("#rebuild-progress[data-status='published']", timeout=10_000)
        assert (await rhea.inner_text("#rebuild-percent")).strip() == "100%"
        assert await rhea.evaluate("document.getElementById('rebuild-bar').value") == 100
        assert await rhea.evaluate("window.notReloaded === true"), "the bar moved without a page reload"
        assert "all checks pass" in await rhea.inner_text("#rebuild-progress")
        await shot(rhea, "rebuild")

        # --- the approver seals ingest; the reviewer builds and proposes the FINAL; the approver approves
        await arno.goto(f"{server}/staff/seasons/{season.slug}/")
        await arno.fill("#lifecycle input[name=reason]", "cutoff passed, all results in")
        await arno.click("#lifecycle button[type=submit]")
        await arno.wait_for_selector("#season-state >> text=FINALIZING")
        await amaterialize(season)

        await rhea.goto(f"{server}/staff/seasons/{season.slug}/final/")
        await rhea.click("#build-form button[type=submit]")
        assert "reconciled" in await message(rhea)
        assert await rhea.locator(".approve-form").count() == 0
        await rhea.fill(".propose-form input[name=reason]", "reconciliation clean")
        await rhea.click(".propose-form button[type=submit]")
        await rhea.wait_for_selector(".candidate[data-status='proposed']")

        await arno.goto(f"{server}/staff/seasons/{season.slug}/final/")
        await arno.fill(".approve-form input[name=reason]", "second pair of eyes")
        await arno.click(".approve-form button[type=submit]")
        await arno.wait_for_selector("#final-done")
        assert re.match(r"Season e2e is FINAL at version \d+", await message(arno))
        assert (await arno.inner_text("#season-state")).strip() == "FINAL"
        await shot(arno, "final")

        # --- the trail names both people; its hash chain verifies in place (htmx)
        await arno.goto(f"{server}/staff/audit/?season={season.slug}")
        table = await arno.inner_text("#audit-table")
        for action in ("dispute.filed", "revocation.proposed", "revocation.approved", "dispute.resolved",
                       "views.rebuild.requested", "season.ingest.sealed", "season.final.proposed",
                       "season.final.approved"):
            assert action in table, action
        await arno.click("#verify-button")
        await arno.wait_for_selector("#verify-report")
        assert await arno.get_attribute("#verify-report", "data-ok") == "true"
        await shot(arno, "audit")

    assert browse(scenario) == []
    assert db_scores(season)["p007"] == 95_000
    assert Dispute.objects.get().status == "resolved"
    revocation = ScoreRevocation.objects.get()
    assert (revocation.proposed_by_label, revocation.decided_by_label) == ("rhea", "arno")
    season.refresh_from_db()
    assert season.state == "FINAL"
    candidate = season.final_candidates.get(status="approved")
    assert (candidate.proposed_by_label, candidate.decided_by_label) == ("rhea", "arno")
