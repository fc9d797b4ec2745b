"""Every error the client raises, one class per refusal the venue documents.

``BourseError`` is the root. ``TransportError`` is a failure to reach the service or to read
its answer (nothing was answered). ``ApiError`` is an answer that refused the request: it
carries the HTTP ``status``, the service's ``code`` (``error.code`` of the delivery node and
clearing, ``outcome`` of the admin API), its ``message``, the whole decoded ``body`` and
``retry_after`` (seconds, from the ``Retry-After`` header) where the service sent one.

Refusals that mean the same on every service share a base class: ``Unauthenticated`` (401),
``Forbidden`` (403), ``NotFound`` (404); so ``except Unauthenticated`` catches a wrong
password wherever it was sent. Each service's own refusals derive from ``DeliveryError``,
``AdminError`` or ``ClearingError``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class BourseError(Exception):
    """Anything this package raises on purpose."""


class TransportError(BourseError):
    """The service could not be reached, or its answer could not be read."""


class ApiError(BourseError):
    """The service answered with a refusal."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        body: Optional[Dict[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body: Dict[str, Any] = body if body is not None else {}
        self.retry_after = retry_after


class Unauthenticated(ApiError):
    """401: no credentials, or wrong ones."""


class Forbidden(ApiError):
    """403: the credentials are right but do not allow this request."""


class NotFound(ApiError):
    """404: no such path or object."""


# ----- the delivery node (docs/delivery.md, "Refusals, the same on both fronts") -----


class DeliveryError(ApiError):
    """A refusal of the delivery node."""


class BadRequest(DeliveryError):
    """400 ``bad_request``: fix the named parameter."""


class CursorMalformed(DeliveryError):
    """400 ``cursor_malformed``: send the last cursor back unchanged, or none."""


class CursorForeign(DeliveryError):
    """409 ``cursor_foreign``: another deployment's cursor (or an earlier store's): start
    with none."""


class CursorTooOld(DeliveryError):
    """410 ``cursor_too_old``: the records after it were evicted: start with none."""


class Busy(DeliveryError):
    """503 ``busy``: too many polls at once; retry after ``retry_after``."""


class RateLimited(DeliveryError):
    """429 ``rate_limited``: this connection polls too often; retry after the pause, or poll
    with ``wait_us``."""


class CatchingUp(DeliveryError):
    """503 ``catching_up``: a read replica not yet ready; retry, or poll the primary."""


class FilterNotServed(DeliveryError):
    """400 ``filter_not_served``: a read replica without secondary indexes; send filtered
    polls to its primary."""


class CursorAhead(DeliveryError):
    """409 ``cursor_ahead``: the cursor is past what the node has applied, after waiting
    ``wait_us``: retry, poll the node that gave it, or start with none."""


class DeliveryUnauthenticated(DeliveryError, Unauthenticated):
    """401 ``unauthenticated``: log on (HTTP Basic on every request)."""


class NotEntitled(DeliveryError, Forbidden):
    """403 ``not_entitled``: the poll names a firm these credentials do not read, or they
    read none."""


class DeliveryNotFound(DeliveryError, NotFound):
    """404 ``not_found``: the node serves ``/v1/orders``, ``/v1/status`` and ``/metrics``."""


DELIVERY_REFUSALS: Dict[str, Type[DeliveryError]] = {
    "bad_request": BadRequest,
    "cursor_malformed": CursorMalformed,
    "cursor_foreign": CursorForeign,
    "cursor_too_old": CursorTooOld,
    "busy": Busy,
    "rate_limited": RateLimited,
    "catching_up": CatchingUp,
    "filter_not_served": FilterNotServed,
    "cursor_ahead": CursorAhead,
    "unauthenticated": DeliveryUnauthenticated,
    "not_entitled": NotEntitled,
    "not_found": DeliveryNotFound,
}

# ----- the admin API (docs/admin.md, "How an action runs") -----


class AdminError(ApiError):
    """A refusal of the admin API (``code`` is the answer's ``outcome``)."""


class AdminInvalid(AdminError):
    """400 ``invalid``: bad input, named; nothing was sent to any core."""


class AdminUnauthenticated(AdminError, Unauthenticated):
    """401 ``refused``: no credentials, or wrong ones."""


class AdminForbidden(AdminError, Forbidden):
    """403 ``refused``: the operator lacks the role (``viewer`` may only query)."""


class AdminConflict(AdminError):
    """409 ``conflict``: the request id was used before for another request."""


class AdminRejected(AdminError):
    """422 ``rejected``: a core refused; ``body["markets"]`` says what each core said (another
    core may have applied)."""


class AdminUnavailable(AdminError):
    """503 ``unavailable``: a core did not answer within 10 s, so the action may or may not
    have applied there: query before sending it again under a new id."""


ADMIN_REFUSALS_BY_STATUS: Dict[int, Type[AdminError]] = {
    400: AdminInvalid,
    401: AdminUnauthenticated,
    403: AdminForbidden,
    409: AdminConflict,
    422: AdminRejected,
    503: AdminUnavailable,
}

# ----- the clearing node (docs/clearing.md) -----


class ClearingError(ApiError):
    """A refusal of the clearing node."""


class ClearingBadRequest(ClearingError):
    """400 ``bad_request``: a parameter or body the node does not take."""


class ClearingUnauthenticated(ClearingError, Unauthenticated):
    """401 ``refused``: credentials required, or invalid."""


class ClearingForbidden(ClearingError, Forbidden):
    """403 ``refused``: another firm's account, a role that may not run clearings, or a
    request from a web page to a node without operators."""


class ClearingNotFound(ClearingError, NotFound):
    """404 ``not_found``: no such run, path or date."""


class UnknownAccount(ClearingNotFound):
    """404 ``unknown_account``: neither added nor traded on the cores clearing follows."""


class UnknownFirm(ClearingNotFound):
    """404 ``unknown_firm``: clearing knows no account of the firm."""


class UnknownRun(ClearingNotFound):
    """404 ``unknown_run``: no run of that id on this node."""


class NoReport(ClearingNotFound):
    """404 ``no_report``: the run is known (read from the primary) but has no report here."""


class TooMany(ClearingError):
    """400 ``too_many``: more lines than ``limits.accounts_per_answer_max``; ask per firm."""


class RunRefused(ClearingError):
    """400, 409 or 503 ``run_refused``: the run was not made (the message says why)."""


class RunFailed(ClearingError):
    """500 ``run_failed``: the plan or report could not be written."""


CLEARING_REFUSALS: Dict[str, Type[ClearingError]] = {
    "bad_request": ClearingBadRequest,
    "not_found": ClearingNotFound,
    "unknown_account": UnknownAccount,
    "unknown_firm": UnknownFirm,
    "unknown_run": UnknownRun,
    "no_report": NoReport,
    "too_many": TooMany,
    "run_refused": RunRefused,
    "run_failed": RunFailed,
}
