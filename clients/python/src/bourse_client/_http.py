"""A small HTTP/1.1 client on ``http.client``: one kept-alive connection, HTTP Basic, TLS.

Each service client owns one ``Http``. A request that fails on a connection reused from an
earlier request (the server closed it while idle) is sent once more on a new connection; a
request that fails on a fresh connection raises ``TransportError``. Polls and queries are
reads, and an admin action carries its ``X-Request-Id``, under which the venue applies it
once, so they may be sent twice that way; a new clearing run is not (``idempotent=False``).
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .errors import TransportError

__all__ = ["Http", "Response", "basic_authorization"]


def basic_authorization(user: str, password: str) -> str:
    """The ``Authorization`` header's value for HTTP Basic."""
    token = base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")
    return "Basic " + token


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def header(self, name: str) -> Optional[str]:
        return self.headers.get(name.lower())

    def retry_after(self) -> Optional[float]:
        value = self.header("retry-after")
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            return None


class Http:
    """One base URL (``http://host:port`` or ``https://...``), one connection at a time.

    ``authorization`` is sent with every request. ``ssl_context`` (or ``ca_file``, the
    venue's authority as PEM) is used for ``https`` URLs. Not shared between threads: the
    lock only keeps a mistaken sharing from interleaving two requests on one connection.
    """

    def __init__(
        self,
        url: str,
        *,
        authorization: Optional[str] = None,
        timeout: float = 30.0,
        ssl_context: Optional[ssl.SSLContext] = None,
        ca_file: Optional[str] = None,
        user_agent: str = "bourse-client-python",
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r}: give an http:// or https:// URL with a host")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._authorization = authorization
        self.timeout = timeout
        if self._https and ssl_context is None:
            ssl_context = ssl.create_default_context(cafile=ca_file)
        self._ssl_context = ssl_context
        self._user_agent = user_agent
        self._conn: Optional[http.client.HTTPConnection] = None
        self._lock = threading.Lock()

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._ssl_context
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Union[str, int, None]]] = None,
        body: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        idempotent: bool = True,
    ) -> Response:
        """Sends one request and reads the whole answer, whatever its status. A request
        that is not ``idempotent`` is never sent twice."""
        target = self._prefix + path
        if query:
            pairs = [(k, str(v)) for k, v in query.items() if v is not None]
            if pairs:
                target += "?" + urllib.parse.urlencode(pairs)
        all_headers: Dict[str, str] = {"User-Agent": self._user_agent, "Accept": "*/*"}
        if self._authorization:
            all_headers["Authorization"] = self._authorization
        if headers:
            all_headers.update(headers)
        if body is not None:
            all_headers.setdefault("Content-Type", "application/json")
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            for attempt in (0, 1):
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = self._connect(wait)
                conn = self._conn
                conn.timeout = wait
                if conn.sock is not None:
                    conn.sock.settimeout(wait)
                try:
                    conn.request(method, target, body=body, headers=all_headers)
                    answer = conn.getresponse()
                    data = answer.read()
                except (http.client.HTTPException, OSError) as e:
                    conn.close()
                    self._conn = None
                    if reused and idempotent and attempt == 0 and not isinstance(e, socket.timeout):
                        continue
                    raise TransportError(f"{method} {self.url}{target}: {e!r}") from e
                names = {k.lower(): v for k, v in answer.getheaders()}
                if answer.will_close:
                    conn.close()
                    self._conn = None
                return Response(answer.status, names, data)
        raise AssertionError("unreachable")  # pragma: no cover

    def get_json(self, path: str, **kw: Any) -> Tuple[Response, Any]:
        r = self.request("GET", path, **kw)
        return r, _decode(r)


def _decode(r: Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None
