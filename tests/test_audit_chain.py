"""The audit trail is append-only and hash-chained (docs/rules.md, Staff roles and the audit
trail): the database refuses to rewrite a row, the chain names the first row that was
edited or removed anyway (with the trigger out of the way), concurrent writers never fork the chain, and the checks are
reachable from the command line and the console."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from audit.chain import GENESIS, chain_verify, row_hash
from audit.models import AuditChainHead, AuditEntry
from audit.services import Actor, audit_chain_verify, audit_log
from tests.support.staff_console import drop_audit_trigger_sql

ACTOR = Actor(kind="system", id="", label="tests")


def log(n: int, **extra: Any) -> list[AuditEntry]:
    return [audit_log(actor=ACTOR, action=f"test.action{i}", target_type="thing", target_id=str(i), **extra)
            for i in range(n)]


def raw_update(sql: str, params: list[Any]) -> None:
    """Run `sql` with the append-only trigger out of the way, then put the trigger back."""
    disable, enable = drop_audit_trigger_sql(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(disable)
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute(enable)


# --- the chain as pure functions ----------------------------------------------------------


def _rows(n: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        row: dict[str, Any] = {
            "id": seq + 100, "seq": seq, "created_at": datetime(2026, 12, 1, tzinfo=UTC), "actor_type": "user",
            "actor_id": "7", "actor_label": "ann", "action": "x.y", "target_type": "t", "target_id": str(seq),
            "season_slug": "s", "before": {"score": seq}, "after": {"score": seq + 1.0, "list": (1, 2)},
            "reason": "because", "prev_hash": prev,
        }
        row["row_hash"] = row_hash(prev_hash=prev, content=row)
        prev = row["row_hash"]
        rows.append(row)
    return rows


def test_an_intact_chain_verifies_and_reports_its_head() -> None:
    rows = _rows(5)
    report = chain_verify(rows, head=(5, rows[-1]["row_hash"]))
    assert report.ok and report.checked == 5 and report.head_seq == 5 and report.head_hash == rows[-1]["row_hash"]
    assert chain_verify([], head=None).ok


def test_each_kind_of_tampering_names_the_first_broken_row() -> None:
    rows = _rows(6)
    head = (6, rows[-1]["row_hash"])

    edited = [dict(r) for r in rows]
    edited[2]["reason"] = "something else"
    report = chain_verify(edited, head=head)
    assert not report.ok and report.broken_id == 103 and report.broken_seq == 3 and "edited" in report.problem

    rehashed = [dict(r) for r in rows]
    rehashed[2]["after"] = {"score": 1}
    rehashed[2]["row_hash"] = row_hash(prev_hash=rehashed[2]["prev_hash"], content=rehashed[2])
    report = chain_verify(rehashed, head=head)
    assert not report.ok and report.broken_seq == 4 and "does not link" in report.problem

    removed = rows[:3] + rows[4:]
    report = chain_verify(removed, head=head)
    assert not report.ok and report.broken_seq == 5 and "removed" in report.problem

    report = chain_verify(rows[:4], head=head)  # the last two rows cut off
    assert not report.ok and report.broken_id is None and "head records seq 6" in report.problem


def test_the_hash_is_what_a_json_column_gives_back() -> None:
    row = _rows(1)[0]
    stored = dict(row, after={"score": 2, "list": [1, 2]})  # 2.0 -> 2, tuple -> list
    assert row_hash(prev_hash=GENESIS, content=stored) == row["row_hash"]


# --- the chain in the database -----------------------------------------------------------------


@pytest.mark.django_db
def test_rows_are_numbered_linked_and_the_head_follows() -> None:
    entries = log(4, season_slug="s1", before={"a": 1.5}, after={"b": [1, "x"], "c": None}, reason="why")
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert entries[0].prev_hash == GENESIS
    assert all(b.prev_hash == a.row_hash for a, b in zip(entries, entries[1:], strict=False))
    head = AuditChainHead.objects.get()
    assert (head.seq, head.row_hash) == (4, entries[-1].row_hash)
    report = audit_chain_verify()
    assert report.ok and report.checked == 4 and report.head_hash == entries[-1].row_hash


@pytest.mark.django_db
def test_a_row_written_in_a_rolled_back_transaction_leaves_no_gap() -> None:
    log(2)
    with pytest.raises(RuntimeError), transaction.atomic():
        log(1)
        raise RuntimeError("the action failed: its audit row goes with it")
    log(1)
    assert list(AuditEntry.objects.order_by("seq").values_list("seq", flat=True)) == [1, 2, 3]
    assert audit_chain_verify().ok


@pytest.mark.django_db
def test_the_database_refuses_to_update_an_audit_row() -> None:
    (entry,) = log(1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).update(reason="rewritten")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE audit_auditentry SET actor_label = %s WHERE id = %s", ["mallory", entry.pk])
    if connection.vendor == "postgresql":
        # SQLite keeps DELETE for its test runner's flush; PostgreSQL flushes with TRUNCATE.
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            AuditEntry.objects.filter(pk=entry.pk).delete()
    assert AuditEntry.objects.get(pk=entry.pk).reason == ""


@pytest.mark.django_db
def test_an_edited_row_is_named_by_the_verifier_the_command_and_the_console(client: Any, django_user_model: Any,
                                                                             settings: Any) -> None:
    entries = log(5, reason="original")
    raw_update("UPDATE audit_auditentry SET reason = %s WHERE id = %s", ["forged", entries[2].pk])
    assert AuditEntry.objects.get(pk=entries[2].pk).reason == "forged"
    with pytest.raises(DatabaseError), transaction.atomic():  # the trigger is back
        AuditEntry.objects.filter(pk=entries[0].pk).update(reason="again")

    report = audit_chain_verify()
    assert not report.ok
    assert (report.broken_id, report.broken_seq, report.checked) == (entries[2].pk, 3, 2)
    assert "edited" in report.problem

    with pytest.raises(CommandError, match=rf"first broken row: id {entries[2].pk}, seq 3"):
        call_command("audit_verify")

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    from seasons.staff.accounts.services import staff_user_create

    viewer, _ = staff_user_create(username="auditor", role="viewer", password="pw-auditor-1", actor=ACTOR)
    client.force_login(viewer)
    page = client.post("/staff/audit/verify", HTTP_HX_REQUEST="true")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-ok="false"' in html and f'<strong id="broken-row">{entries[2].pk}</strong>' in html
    plain = client.post("/staff/audit/verify")  # without JS: a page of its own
    assert "Chain BROKEN" in plain.content.decode() and "<html" in plain.content.decode()


@pytest.mark.django_db
def test_a_removed_row_and_a_cut_tail_are_detected() -> None:
    entries = log(4)
    if connection.vendor == "postgresql":
        raw_update("DELETE FROM audit_auditentry WHERE id = %s", [entries[1].pk])
    else:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM audit_auditentry WHERE id = %s", [entries[1].pk])
    report = audit_chain_verify()
    assert not report.ok and report.broken_seq == 3 and "removed" in report.problem

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            raw_update("DELETE FROM audit_auditentry WHERE seq >= 2", [])
        else:
            cursor.execute("DELETE FROM audit_auditentry WHERE seq >= 2")
    report = audit_chain_verify()
    assert not report.ok and "head records seq 4" in report.problem


@pytest.mark.django_db
def test_the_command_prints_the_head_of_an_intact_chain(capsys: Any) -> None:
    entries = log(3)
    call_command("audit_verify")
    out = capsys.readouterr().out
    assert f"audit chain ok: 3 rows, head seq 3 hash {entries[-1].row_hash}" in out


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_never_fork_the_chain() -> None:
    """Threads appending at once: every row links to exactly one predecessor, no seq twice."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def writer(n: int) -> None:
        try:
            barrier.wait()
            for i in range(8):
                with transaction.atomic():
                    audit_log(actor=ACTOR, action="test.concurrent", target_type="w", target_id=f"{n}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert list(AuditEntry.objects.order_by("seq").values_list("seq", flat=True)) == list(range(1, 33))
    report = audit_chain_verify()
    assert report.ok and report.checked == 32
