"""The domain's refusals: one base class, so a view, command or handler catches one type.

A refusal is a request the domain understood and will not carry out (a rule, a state, a
bad value, a version no longer kept). It is never a bug: front ends answer it with a 4xx
or 503 and the body `{"error": code, "detail": text, ...extra}`, a command prints it,
the staff console shows it. Failures of the machinery (a lost fence, a copy that fails
verification, Redis down) are not refusals and do not derive from this class.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar


class DomainError(Exception):
    """`code` is the machine-readable reason (an API body's "error"), `detail` the sentence
    for a person, `status` the HTTP status an API answers with, `extra` further body fields."""

    code: ClassVar[str] = "refused"
    status: ClassVar[int] = 400

    def __init__(self, detail: str, *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra: dict[str, Any] = extra or {}

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.extra}


# ------------------------------------------------------------------ read refusals
# The answers of a read that cannot be served from a published version, shared by the
# HTTP read API and the live boards' websocket so both say the same thing.


class ReadUnavailable(DomainError):
    """No complete version is published (yet, or the views are lost and being rebuilt)."""

    code = "unavailable"
    status = 503

    def __init__(self, *, retry_after: int) -> None:
        super().__init__("no complete leaderboard version is published (yet, or the views are being rebuilt)",
                         extra={"retry_after": retry_after})
        self.retry_after = retry_after


class ReadVersionExpired(DomainError):
    """The pinned version is no longer retained: the client repositions on the current one."""

    code = "version_expired"
    status = 410

    def __init__(self, *, current_version: int | None) -> None:
        super().__init__("that version is no longer retained; reposition on the current one",
                         extra={"current_version": current_version})


def retry_after_seconds(epoch_seconds: float) -> int:
    """What a reader facing an unavailable board waits: one epoch (when the next version
    can be published), rounded up to whole seconds, at least 1."""
    return max(1, math.ceil(epoch_seconds))
