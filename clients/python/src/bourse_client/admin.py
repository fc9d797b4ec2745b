"""The admin API (docs/admin.md): an operator's requests to a running venue.

Every action is ``POST /v1/actions`` with an ``X-Request-Id``; the venue applies a request
id once, so an action sent again under the same id (after a lost answer) is answered from
the first run (``ActionResult.retried``). Each method takes ``request_id``; without one the
client makes one (``py-<host>-<pid>-<time>-<n>``). Amounts are cash in units of 10^-4, as
integers (``1_000_0000`` is 1,000.0000).

    from bourse_client import AdminClient
    admin = AdminClient("http://127.0.0.1:8090", user="admin", password="...")
    admin.halt(instrument=1)
    admin.add_account(900001, firm=3, cash=1_000_000_000)
    print(admin.account(900001))
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from . import errors
from ._http import Http, Response, basic_authorization

__all__ = ["AdminClient", "ActionResult", "PHASES"]

#: The phases ``set_phase`` takes (docs/admin.md, "The pause rule and the phases").
PHASES = ("open", "paused", "halted", "closed")

_counter = itertools.count(1)


def _new_request_id() -> str:
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:32] or "host"
    return f"py-{host}-{os.getpid()}-{time.time_ns()}-{next(_counter)}"


@dataclass(frozen=True)
class ActionResult:
    """An applied action's answer: ``outcome`` (``applied``), ``retried`` (answered from an
    earlier request under the same id), ``markets`` (what each core said) and ``raw``."""

    request_id: str
    outcome: str
    retried: bool
    markets: List[Dict[str, Any]]
    raw: Dict[str, Any] = field(compare=False, repr=False)


def refusal(r: Response, body: Any) -> errors.ApiError:
    """The exception for a refused answer of the admin API."""
    if isinstance(body, dict):
        code = str(body.get("outcome", f"http_{r.status}"))
        message = body.get("error")
        if message is None:
            message = json.dumps(body.get("markets", body))[:2000]
    else:
        code = f"http_{r.status}"
        message = r.body[:200].decode("utf-8", "replace")
    cls = errors.ADMIN_REFUSALS_BY_STATUS.get(r.status, errors.AdminError)
    return cls(r.status, code, str(message), body if isinstance(body, dict) else None,
               r.retry_after())


class AdminClient:
    """An operator (or viewer) of one admin API. ``user`` defaults to the demo's
    operator, ``admin``, as ``bourse admin`` does."""

    def __init__(
        self,
        url: str,
        *,
        user: str = "admin",
        password: Optional[str] = None,
        authorization: Optional[str] = None,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        timeout: float = 30.0,
    ) -> None:
        if authorization is None and password is not None:
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

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- the generic requests -----

    def action(self, action: Mapping[str, Any], *, request_id: Optional[str] = None
               ) -> ActionResult:
        """``POST /v1/actions`` with ``action`` (a JSON object with its ``"action"`` name).
        Raises ``AdminRejected`` (422) when a core refused, and the other ``AdminError``s."""
        rid = request_id or _new_request_id()
        r = self.http.request(
            "POST", "/v1/actions", body=json.dumps(dict(action)).encode(),
            headers={"X-Request-Id": rid},
        )
        return self._result(rid, r)

    def _result(self, rid: str, r: Response) -> ActionResult:
        body = _json(r)
        if r.status != 200 or not isinstance(body, dict):
            raise refusal(r, body)
        return ActionResult(
            request_id=rid,
            outcome=str(body.get("outcome", "")),
            retried=bool(body.get("retried", False)),
            markets=list(body.get("markets") or []),
            raw=body,
        )

    def query(self, path: str) -> Dict[str, Any]:
        """A ``GET`` of the API (role ``operator`` or ``viewer``)."""
        r = self.http.request("GET", path)
        body = _json(r)
        if r.status != 200 or not isinstance(body, dict):
            raise refusal(r, body)
        return body

    # ----- queries -----

    def instruments(self) -> Dict[str, Any]:
        """Every market's instruments with their phase, and the kill switches engaged."""
        return self.query("/v1/instruments")

    def account(self, account: int) -> Dict[str, Any]:
        """An account's balances, positions and live orders, market by market (``state``
        ``None`` where the market's core does not hold it)."""
        return self.query(f"/v1/accounts/{int(account)}")

    def book(self, instrument: int) -> Dict[str, Any]:
        """An instrument's order-level book as its core holds it."""
        return self.query(f"/v1/instruments/{int(instrument)}/book")

    def healthy(self) -> bool:
        """``GET /healthz`` (no credentials)."""
        try:
            return self.http.request("GET", "/healthz").status == 200
        except errors.TransportError:
            return False

    # ----- actions -----

    def add_account(
        self,
        account: int,
        firm: int,
        *,
        cash: int = 0,
        may_short: bool = False,
        markets: Optional[Sequence[str]] = None,
        stp: Optional[str] = None,
        stp_scope: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> ActionResult:
        """Adds an account to every market (or ``markets``) with ``cash`` in each (no
        deposit where it exists already)."""
        a: Dict[str, Any] = {"action": "add_account", "account": account, "firm": firm,
                             "cash": cash, "may_short": may_short}
        if markets is not None:
            a["markets"] = list(markets)
        if stp is not None:
            a["stp"] = stp
        if stp_scope is not None:
            a["stp_scope"] = stp_scope
        return self.action(a, request_id=request_id)

    def add_accounts(self, accounts: Iterable[Mapping[str, Any]], *,
                     request_id: Optional[str] = None) -> ActionResult:
        """``POST /v1/accounts/bulk``: one ``{"account", "firm", ...}`` per line, as NDJSON.
        The answer counts what was added (``raw["accounts_added"]``, ...)."""
        rid = request_id or _new_request_id()
        body = "".join(json.dumps(dict(a)) + "\n" for a in accounts).encode()
        r = self.http.request(
            "POST", "/v1/accounts/bulk", body=body,
            headers={"X-Request-Id": rid, "Content-Type": "application/x-ndjson"},
        )
        return self._result(rid, r)

    def deposit(self, market: str, account: int, amount: int, *,
                request_id: Optional[str] = None) -> ActionResult:
        return self.action({"action": "deposit", "market": market, "account": account,
                            "amount": amount}, request_id=request_id)

    def withdraw(self, market: str, account: int, amount: int, *,
                 request_id: Optional[str] = None) -> ActionResult:
        return self.action({"action": "withdraw", "market": market, "account": account,
                            "amount": amount}, request_id=request_id)

    def set_collateral(self, market: str, account: int, amount: int, *,
                       request_id: Optional[str] = None) -> ActionResult:
        return self.action({"action": "set_collateral", "market": market, "account": account,
                            "amount": amount}, request_id=request_id)

    def margin_call(self, market: str, account: int, amount: int, *,
                    request_id: Optional[str] = None) -> ActionResult:
        """Opens or changes a margin call (``amount`` 0 closes it)."""
        return self.action({"action": "margin_call", "market": market, "account": account,
                            "amount": amount}, request_id=request_id)

    def set_phase(self, phase: str, *, instrument: Optional[int] = None,
                  market: Optional[str] = None, request_id: Optional[str] = None
                  ) -> ActionResult:
        """The phase of one instrument, of one market's instruments, or (neither) of the
        whole venue."""
        a: Dict[str, Any] = {"action": "set_phase", "phase": phase}
        if instrument is not None:
            a["instrument"] = instrument
        if market is not None:
            a["market"] = market
        return self.action(a, request_id=request_id)

    def halt(self, *, instrument: Optional[int] = None, market: Optional[str] = None,
             request_id: Optional[str] = None) -> ActionResult:
        return self.set_phase("halted", instrument=instrument, market=market,
                              request_id=request_id)

    def resume(self, *, instrument: Optional[int] = None, market: Optional[str] = None,
               request_id: Optional[str] = None) -> ActionResult:
        return self.set_phase("open", instrument=instrument, market=market,
                              request_id=request_id)

    def kill_switch(self, *, engaged: bool, firm: Optional[int] = None,
                    account: Optional[int] = None, request_id: Optional[str] = None
                    ) -> ActionResult:
        """Engages (cancels the target's orders everywhere, refuses new ones) or releases
        the kill switch of one firm or one account."""
        a: Dict[str, Any] = {"action": "kill_switch", "engaged": engaged}
        if firm is not None:
            a["firm"] = firm
        if account is not None:
            a["account"] = account
        return self.action(a, request_id=request_id)

    def kill(self, *, firm: Optional[int] = None, account: Optional[int] = None,
             request_id: Optional[str] = None) -> ActionResult:
        return self.kill_switch(engaged=True, firm=firm, account=account,
                                request_id=request_id)

    def release(self, *, firm: Optional[int] = None, account: Optional[int] = None,
                request_id: Optional[str] = None) -> ActionResult:
        return self.kill_switch(engaged=False, firm=firm, account=account,
                                request_id=request_id)

    def end_of_day(self, *, market: Optional[str] = None,
                   request_id: Optional[str] = None) -> ActionResult:
        a: Dict[str, Any] = {"action": "end_of_day"}
        if market is not None:
            a["market"] = market
        return self.action(a, request_id=request_id)

    def add_instrument(self, market: str, instrument: Mapping[str, Any], *,
                       request_id: Optional[str] = None) -> ActionResult:
        """Adds an instrument (its whole definition, as ``add_instrument`` takes it in
        docs/engine-jsonl.md) to one market's core."""
        return self.action({"action": "add_instrument", "market": market,
                            "instrument": dict(instrument)}, request_id=request_id)


def _json(r: Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None
