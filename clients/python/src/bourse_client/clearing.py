"""The clearing node's HTTP/JSON API (docs/clearing.md): positions, P&L, margin and
obligations per account and firm, runs and their reports.

Amounts of cash come as decimal text with four decimals (``"-1234.5000"``); use
``decimal.Decimal`` on them (``ClearingClient`` leaves them as the node sent them). Prices
are the instrument's raw integers, quantities integers.

    from bourse_client import ClearingClient
    clearing = ClearingClient("http://127.0.0.1:9460", user="op", password="...")
    print(clearing.account(1)["positions"])
    report = clearing.run("intermediate")
    for line in report["accounts"]:
        ...
"""

from __future__ import annotations

import json
import ssl
from typing import Any, Dict, Iterator, Optional, Type

from . import errors
from ._http import Http, Response, basic_authorization

__all__ = ["ClearingClient"]


def refusal(r: Response, body: Any) -> errors.ApiError:
    """The exception for a refused answer of the clearing node."""
    err = body.get("error") if isinstance(body, dict) else None
    code = str(err.get("code")) if isinstance(err, dict) else f"http_{r.status}"
    message = str(err.get("message")) if isinstance(err, dict) else r.body[:200].decode(
        "utf-8", "replace"
    )
    cls: Type[errors.ClearingError]
    if r.status == 401:
        cls = errors.ClearingUnauthenticated
    elif r.status == 403:
        cls = errors.ClearingForbidden
    else:
        cls = errors.CLEARING_REFUSALS.get(code, errors.ClearingError)
        if cls is errors.ClearingError and r.status == 404:
            cls = errors.ClearingNotFound
    return cls(r.status, code, message, body if isinstance(body, dict) else None,
               r.retry_after())


class ClearingClient:
    """A reader (and, with an operator's credentials, the runner of clearings) of one
    clearing node. A node without ``[[operators]]`` needs no credentials."""

    def __init__(
        self,
        url: str,
        *,
        user: Optional[str] = None,
        password: Optional[str] = None,
        authorization: Optional[str] = None,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        timeout: float = 60.0,
    ) -> None:
        if authorization is None and user is not None and password is not None:
            authorization = basic_authorization(user, password)
        self.http = Http(
            url, authorization=authorization, timeout=timeout, ca_file=ca_file,
            ssl_context=ssl_context,
        )

    @property
    def url(self) -> str:
        return self.http.url

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "ClearingClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, query: Optional[Dict[str, Any]] = None) -> Any:
        """A ``GET`` of the API, its JSON answer (raises the ``ClearingError`` the node's
        refusal names)."""
        r = self.http.request("GET", path, query=query)
        body = _json(r)
        if r.status != 200 or body is None:
            raise refusal(r, body)
        return body

    def get_object(self, path: str, query: Optional[Dict[str, Any]] = None
                   ) -> Dict[str, Any]:
        """A ``GET`` whose answer is a JSON object."""
        body = self.get(path, query)
        if not isinstance(body, dict):
            raise errors.TransportError(f"{self.url}{path}: the answer is not a JSON object")
        return body

    def account(self, account: int) -> Dict[str, Any]:
        """``GET /v1/accounts/{id}``: cash per core, positions, P&L, margin, obligations,
        fees, ``as_of``."""
        return self.get_object(f"/v1/accounts/{int(account)}")

    def firm(self, firm: int, *, after: Optional[int] = None, limit: Optional[int] = None
             ) -> Dict[str, Any]:
        """``GET /v1/firms/{id}``: one page of the firm's accounts (``next_after`` names the
        next page's start)."""
        return self.get_object(f"/v1/firms/{int(firm)}", {"after": after, "limit": limit})

    def firm_accounts(self, firm: int, *, page: Optional[int] = None
                      ) -> Iterator[Dict[str, Any]]:
        """Every account of the firm, page after page."""
        after: Optional[int] = None
        while True:
            answer = self.firm(firm, after=after, limit=page)
            yield from answer.get("accounts", [])
            after = answer.get("next_after")
            if after is None:
                return

    def settlements(self, date: str, *, firm: Optional[int] = None) -> Dict[str, Any]:
        """``GET /v1/settlements/{YYYY-MM-DD}``: the obligations that settle that day."""
        return self.get_object(f"/v1/settlements/{date}", {"firm": firm})

    def runs(self) -> Any:
        """``GET /v1/runs``: the runs' ids, kinds and counts."""
        return self.get("/v1/runs")

    def report(self, run_id: int) -> Dict[str, Any]:
        """``GET /v1/runs/{id}``: a run's report (operators and viewers)."""
        return self.get_object(f"/v1/runs/{int(run_id)}")

    def plan(self, run_id: int) -> Dict[str, Any]:
        """``GET /v1/runs/{id}/plan``: what the run computed at its cut."""
        return self.get_object(f"/v1/runs/{int(run_id)}/plan")

    def status(self) -> Dict[str, Any]:
        """``GET /v1/status``: the cut, the cores' ends, pending runs, feed errors."""
        return self.get_object("/v1/status")

    def run(
        self,
        kind: Optional[str] = None,
        *,
        run_id: Optional[int] = None,
        last_trades: Optional[int] = None,
        window_ms: Optional[int] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/runs``: a new run (``kind`` ``"intermediate"`` or ``"end_of_day"``),
        or ``run_id`` to resume one; answers the run's report when it is done."""
        body: Dict[str, Any] = {}
        for name, value in (("kind", kind), ("run_id", run_id), ("last_trades", last_trades),
                            ("window_ms", window_ms)):
            if value is not None:
                body[name] = value
        # A new run is not sent twice (a second one would be another run); resuming is.
        r = self.http.request("POST", "/v1/runs", body=json.dumps(body).encode(),
                              idempotent=run_id is not None)
        answer = _json(r)
        if r.status != 200 or not isinstance(answer, dict):
            raise refusal(r, answer)
        return answer

    def takeover(self) -> Dict[str, Any]:
        """``POST /v1/takeover``: a standby becomes the primary."""
        r = self.http.request("POST", "/v1/takeover", body=b"", idempotent=True)
        answer = _json(r)
        if r.status != 200 or not isinstance(answer, dict):
            raise refusal(r, answer)
        return answer


def _json(r: Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None
