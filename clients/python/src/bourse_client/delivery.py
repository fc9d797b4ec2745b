"""The delivery node's HTTP/JSON front (docs/delivery.md): GetOrders by cursor, long poll.

``DeliveryClient.poll`` is one ``GET /v1/orders``; ``DeliveryClient.follow`` follows the
cursor for ever (or until the caller stops), yielding records as dataclasses, retrying what
the node says to retry, and saving the cursor after each batch in a ``CursorStore`` (a
``CursorFile``) so that a restarted program resumes where it stopped.

    from bourse_client import DeliveryClient, CursorFile
    client = DeliveryClient("http://127.0.0.1:8700", user="firm-1", password="...")
    for record in client.follow(store=CursorFile("firm-1.cursor")):
        print(record.pos, record.raw)
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

from . import errors
from ._http import Http, Response, basic_authorization
from .cursor_file import CursorStore
from .records import Record, record_from_dict

__all__ = ["Answer", "DeliveryClient", "Follower", "NEXT_CURSOR_HEADER"]

#: The response header that repeats the answer's next cursor.
NEXT_CURSOR_HEADER = "x-bourse-next-cursor"


@dataclass(frozen=True)
class Answer:
    """One poll's answer: its records in cursor order and the cursor to send next."""

    next_cursor: str
    count: int
    oldest_ts_ns: Optional[int]
    server: Dict[str, Any]
    records: List[Record]
    raw: Dict[str, Any] = field(compare=False, repr=False)


def refusal(r: Response, body: Any) -> errors.ApiError:
    """The exception for a refused answer of the delivery node."""
    err = body.get("error") if isinstance(body, dict) else None
    code = str(err.get("code")) if isinstance(err, dict) else f"http_{r.status}"
    message = str(err.get("message")) if isinstance(err, dict) else r.body[:200].decode(
        "utf-8", "replace"
    )
    cls = errors.DELIVERY_REFUSALS.get(code)
    if cls is None:
        cls = {401: errors.DeliveryUnauthenticated, 403: errors.NotEntitled}.get(
            r.status, errors.DeliveryError
        )
    retry_after = r.retry_after()
    if cls is errors.RateLimited:
        # The message names the pause ("retry in N ms"); Retry-After rounds it up to 1 s.
        ms = _ms_in(message)
        if ms is not None:
            retry_after = ms / 1000.0
    return cls(r.status, code, message, body if isinstance(body, dict) else None, retry_after)


def _ms_in(message: str) -> Optional[int]:
    words = message.split()
    for i, w in enumerate(words[:-1]):
        if words[i + 1].rstrip(",;.)") == "ms" and w.isdigit():
            return int(w)
    return None


class DeliveryClient:
    """A reader of one delivery node (or read replica).

    Credentials: ``user`` and ``password`` (HTTP Basic, on every request, as the node asks
    when it has ``[access]`` readers), or ``authorization``, a whole ``Authorization`` header
    value to send instead (for a proxy in front of the node that takes another scheme).
    A node on the loopback without readers needs neither. ``ca_file`` (PEM) or
    ``ssl_context`` verify an ``https://`` node.

    ``timeout`` is how long to wait for an answer beyond the poll's own ``wait_us``.
    """

    def __init__(
        self,
        url: str,
        *,
        user: Optional[str] = None,
        password: Optional[str] = None,
        authorization: Optional[str] = None,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        timeout: float = 10.0,
    ) -> None:
        if authorization is None and user is not None:
            if password is None:
                raise ValueError("a user needs a password")
            authorization = basic_authorization(user, password)
        self.http = Http(
            url,
            authorization=authorization,
            timeout=timeout,
            ca_file=ca_file,
            ssl_context=ssl_context,
        )

    @property
    def url(self) -> str:
        return self.http.url

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "DeliveryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(
        self,
        cursor: Optional[str] = None,
        *,
        firm: Optional[int] = None,
        account: Optional[int] = None,
        instrument: Optional[int] = None,
        limit: Optional[int] = None,
        wait_us: Optional[int] = None,
        min_rows: Optional[int] = None,
        since_ns: Optional[int] = None,
    ) -> Answer:
        """One GetOrders. No cursor (and no ``since_ns``) reads a snapshot of the current
        state first. Raises the ``DeliveryError`` subclass the node's refusal names."""
        query = {
            "cursor": cursor or None,
            "firm": firm,
            "account": account,
            "instrument": instrument,
            "limit": limit,
            "wait_us": wait_us,
            "min_rows": min_rows,
            "since_ns": since_ns,
        }
        waits = (wait_us if wait_us is not None else 500) / 1e6
        r, body = self.http.get_json(
            "/v1/orders", query=query, timeout=self.http.timeout + waits
        )
        if r.status != 200 or not isinstance(body, dict):
            raise refusal(r, body)
        header = body.get("header", {})
        next_cursor = r.header(NEXT_CURSOR_HEADER) or header.get("next_cursor")
        if not next_cursor:
            raise errors.TransportError(f"{self.url}: an answer without a next cursor")
        records = [record_from_dict(d) for d in body.get("records", [])]
        return Answer(
            next_cursor=str(next_cursor),
            count=int(header.get("count", len(records))),
            oldest_ts_ns=header.get("oldest_ts_ns"),
            server=dict(header.get("server") or {}),
            records=records,
            raw=body,
        )

    def status(self) -> Dict[str, Any]:
        """``GET /v1/status``: per-core figures, identity, refusals by reason, limits."""
        r, body = self.http.get_json("/v1/status")
        if r.status != 200 or not isinstance(body, dict):
            raise refusal(r, body)
        return body

    def metrics(self) -> str:
        """``GET /metrics``: the node's figures in the Prometheus text format."""
        r = self.http.request("GET", "/metrics")
        if r.status != 200:
            raise refusal(r, _json_or_none(r))
        return r.body.decode("utf-8")

    def follow(
        self,
        cursor: Optional[str] = None,
        *,
        store: Optional[CursorStore] = None,
        firm: Optional[int] = None,
        account: Optional[int] = None,
        instrument: Optional[int] = None,
        limit: Optional[int] = None,
        wait_us: int = 1_000_000,
        min_rows: Optional[int] = None,
        restart_on_lost_cursor: bool = False,
        cursor_ahead_retries: int = 10,
        reconnect: bool = True,
        on_retry: Optional[Callable[[errors.BourseError, float], None]] = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> "Follower":
        """A ``Follower`` from ``cursor``, or from the cursor ``store`` holds (a snapshot
        first when neither has one). Iterate it for records, or ``batches()`` for answers."""
        if cursor is None and store is not None:
            cursor = store.load()
        return Follower(
            self,
            cursor,
            store=store,
            params=dict(
                firm=firm, account=account, instrument=instrument, limit=limit,
                wait_us=wait_us, min_rows=min_rows,
            ),
            restart_on_lost_cursor=restart_on_lost_cursor,
            cursor_ahead_retries=cursor_ahead_retries,
            reconnect=reconnect,
            on_retry=on_retry,
            sleep=sleep,
        )


def _json_or_none(r: Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


class Follower:
    """Follows a delivery node's cursor: long polls, one after the other, each from the
    cursor the last answered.

    What it does with each refusal (docs/delivery.md, "Refusals"):

    - ``busy``, ``rate_limited``, ``catching_up``: waits the pause the node names, retries;
    - ``cursor_ahead``: waits and retries the same cursor up to ``cursor_ahead_retries``
      times (the node has already waited ``wait_us`` for its feeds each time), then raises;
    - ``cursor_too_old``, ``cursor_foreign``: raises, unless ``restart_on_lost_cursor``, in
      which case it starts again with no cursor (a snapshot of the current state first:
      records between the lost cursor and now that are no longer live are not seen) and
      counts it in ``restarts``;
    - a connection failure: reconnects with a growing pause (0.1 s doubling up to 5 s, for
      as long as it takes) when ``reconnect``;
    - anything else (``unauthenticated``, ``not_entitled``, ``bad_request``,
      ``cursor_malformed``, ``filter_not_served``): raises.

    ``on_retry(error, pause)`` is called before each pause and each restart (to log them).

    ``cursor`` is the cursor after every batch handed out so far. With a ``store``, it is
    saved there once the caller has taken the whole batch (when it asks for the record after
    the batch's last), so a restarted program resumes after what it processed: a batch it
    was in the middle of is read again (at least once across restarts, exactly once within
    one run, in cursor order).
    """

    def __init__(
        self,
        client: DeliveryClient,
        cursor: Optional[str],
        *,
        store: Optional[CursorStore],
        params: Dict[str, Any],
        restart_on_lost_cursor: bool,
        cursor_ahead_retries: int,
        reconnect: bool,
        sleep: Callable[[float], None],
        on_retry: Optional[Callable[[errors.BourseError, float], None]] = None,
    ) -> None:
        self.client = client
        self.cursor = cursor
        self.store = store
        self.params = params
        self.restart_on_lost_cursor = restart_on_lost_cursor
        self.cursor_ahead_retries = cursor_ahead_retries
        self.reconnect = reconnect
        self.sleep = sleep
        self.on_retry = on_retry
        self.restarts = 0
        self.retries = 0
        self.last_answer: Optional[Answer] = None
        self._saved = cursor

    def save(self) -> None:
        """Writes ``cursor`` to the store (if it changed since the last save)."""
        if self.store is not None and self.cursor is not None and self.cursor != self._saved:
            self.store.save(self.cursor)
            self._saved = self.cursor

    def next_answer(self) -> Answer:
        """One answer (possibly empty, after its long poll), retrying as above; moves
        ``cursor`` past it (``batches()`` saves it in the store; here call ``save()`` once
        the answer is processed)."""
        ahead = 0
        pause = 0.1
        while True:
            try:
                answer = self.client.poll(self.cursor, **self.params)
            except (errors.Busy, errors.RateLimited, errors.CatchingUp) as e:
                self._pause(e, e.retry_after if e.retry_after is not None else 1.0)
                continue
            except errors.CursorAhead as e:
                ahead += 1
                if ahead > self.cursor_ahead_retries:
                    raise
                self._pause(e, 0.5)
                continue
            except (errors.CursorTooOld, errors.CursorForeign) as e:
                if not self.restart_on_lost_cursor:
                    raise
                if self.on_retry is not None:
                    self.on_retry(e, 0.0)
                self.restarts += 1
                self.cursor = None
                continue
            except errors.TransportError as e:
                if not self.reconnect:
                    raise
                self._pause(e, pause)
                pause = min(pause * 2, 5.0)
                continue
            self.cursor = answer.next_cursor
            self.last_answer = answer
            return answer

    def _pause(self, e: errors.BourseError, seconds: float) -> None:
        self.retries += 1
        if self.on_retry is not None:
            self.on_retry(e, seconds)
        self.sleep(seconds)

    def batches(self) -> Iterator[Answer]:
        """Every answer, empty ones included (one per long poll), for ever. With a store,
        a batch's cursor is saved when the caller asks for the next batch."""
        while True:
            answer = self.next_answer()
            yield answer
            self.save()

    def __iter__(self) -> Iterator[Record]:
        for answer in self.batches():
            yield from answer.records

    def until_idle(self) -> Iterator[Record]:
        """The records up to the first empty answer (all there is now, after a long poll
        found nothing more), then stops, the cursor saved."""
        for answer in self.batches():
            if not answer.records:
                self.save()
                return
            yield from answer.records
