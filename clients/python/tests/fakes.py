"""Fake services on 127.0.0.1 (an ephemeral port), in the standard library: a delivery node,
an admin API and a clearing node that answer as docs/delivery.md, docs/admin.md and
docs/clearing.md say, with refusals that a test can force.

Also puts the package's source (``../src``) first on ``sys.path``, so the tests run against
the working tree without installing it.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

Reply = Tuple[int, Dict[str, str], bytes]


def json_reply(status: int, body: Any, headers: Optional[Dict[str, str]] = None) -> Reply:
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return status, h, json.dumps(body).encode()


class Request:
    def __init__(self, method: str, path: str, query: Dict[str, str],
                 headers: Dict[str, str], body: bytes) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body

    def basic(self) -> Optional[Tuple[str, str]]:
        value = self.headers.get("authorization", "")
        if not value.startswith("Basic "):
            return None
        name, _, password = base64.b64decode(value[6:]).decode().partition(":")
        return name, password


class FakeServer:
    """A threading HTTP/1.1 server (kept-alive connections) whose answers come from
    ``route``; ``force`` queues answers given before any routing."""

    def __init__(self, port: int = 0, tls: Optional[ssl.SSLContext] = None) -> None:
        self.lock = threading.Lock()
        self.tls = tls
        self.requests: List[Request] = []
        self.forced: List[Reply] = []
        self.connections = 0
        self.sockets: List[socket.socket] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake.connections += 1
                    fake.sockets.append(self.connection)

            def log_message(self, *args: Any) -> None:
                pass

            def handle_any(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
                headers = {k.lower(): v for k, v in self.headers.items()}
                req = Request(self.command, parts.path, query, headers, body)
                with fake.lock:
                    fake.requests.append(req)
                    forced = fake.forced.pop(0) if fake.forced else None
                status, h, data = forced if forced is not None else fake.route(req)
                self.send_response(status)
                for k, v in h.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = handle_any
            do_POST = handle_any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{port}"

    def force(self, *replies: Reply) -> None:
        with self.lock:
            self.forced.extend(replies)

    def route(self, req: Request) -> Reply:
        return json_reply(404, {"error": {"code": "not_found", "message": "unknown path"}})

    def close(self) -> None:
        """Stops listening and ends every open connection (as a node that went away)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.lock:
            for sock in self.sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def refusal(status: int, code: str, message: str = "refused",
            headers: Optional[Dict[str, str]] = None) -> Reply:
    return json_reply(status, {"error": {"code": code, "message": message}}, headers)


#: Every refusal of the delivery node's table (docs/delivery.md): code, status, headers.
DELIVERY_REFUSALS = [
    ("bad_request", 400, {}),
    ("cursor_malformed", 400, {}),
    ("cursor_foreign", 409, {}),
    ("cursor_too_old", 410, {}),
    ("busy", 503, {"Retry-After": "1"}),
    ("rate_limited", 429, {"Retry-After": "1"}),
    ("catching_up", 503, {"Retry-After": "1"}),
    ("filter_not_served", 400, {}),
    ("cursor_ahead", 409, {}),
    ("unauthenticated", 401, {"WWW-Authenticate": 'Basic realm="bourse delivery"'}),
    ("not_entitled", 403, {}),
]


class FakeDelivery(FakeServer):
    """A delivery node over a list of records that tests append to. A cursor is the
    deployment's identity (8 hex digits) and the number of records read (16 hex digits).

    ``readers``: name -> (password, firm or None for a viewer); empty: no credentials asked.
    ``horizon``: cursors before it are too old. Polls long-wait for new records up to
    ``wait_us`` (capped at 2 s here), then answer what there is; a cursor ahead of the
    records waits the same way and is refused ``cursor_ahead``.
    """

    IDENTITY = "0badcafe"

    def __init__(self, readers: Optional[Dict[str, Tuple[str, Optional[int]]]] = None,
                 port: int = 0, tls: Optional[ssl.SSLContext] = None) -> None:
        self.records: List[Dict[str, Any]] = []
        self.readers = readers or {}
        self.horizon = 0
        self.changed = threading.Condition()
        super().__init__(port, tls)

    def append(self, *records: Dict[str, Any]) -> None:
        with self.changed:
            self.records.extend(records)
            self.changed.notify_all()

    def cursor(self, n: int) -> str:
        return f"{self.IDENTITY}{n:016x}"

    def route(self, req: Request) -> Reply:
        firm_of_reader: Optional[int] = None
        if self.readers:
            creds = req.basic()
            known = creds is not None and self.readers.get(creds[0], ("", None))[0] == creds[1]
            if not known:
                return refusal(401, "unauthenticated", "credentials required (HTTP Basic)",
                               {"WWW-Authenticate": 'Basic realm="bourse delivery"'})
            firm_of_reader = self.readers[creds[0]][1]  # type: ignore[index]
        if req.path == "/v1/status":
            return json_reply(200, {"role": "primary", "identity": self.IDENTITY})
        if req.path == "/metrics":
            return 200, {"Content-Type": "text/plain"}, b"bourse_delivery_polls_total 1\n"
        if req.path != "/v1/orders":
            return refusal(404, "not_found", "unknown path")
        q = dict(req.query)
        known = {"cursor", "firm", "account", "instrument", "limit", "wait_us", "min_rows",
                 "since_ns"}
        for name in q:
            if name not in known:
                return refusal(400, "bad_request", f"unknown field `{name}`")
        firm = int(q["firm"]) if "firm" in q else None
        if firm_of_reader is not None:
            if firm is not None and firm != firm_of_reader:
                return refusal(403, "not_entitled",
                               f"these credentials read firm {firm_of_reader} only")
            firm = firm_of_reader
        start = 0
        text = q.get("cursor", "")
        if text:
            if len(text) != 24 or any(c not in "0123456789abcdef" for c in text):
                return refusal(400, "cursor_malformed", "not a cursor")
            if text[:8] != self.IDENTITY:
                return refusal(409, "cursor_foreign", "another deployment's cursor")
            start = int(text[8:], 16)
            if start < self.horizon:
                return refusal(410, "cursor_too_old", "evicted")
        limit = int(q.get("limit", 1000))
        wait = min(int(q.get("wait_us", 500)) / 1e6, 2.0)
        deadline = time.monotonic() + wait
        with self.changed:
            while True:
                if start <= len(self.records):
                    chosen: List[Dict[str, Any]] = []
                    n = start
                    while n < len(self.records) and len(chosen) < limit:
                        r = self.records[n]
                        n += 1
                        if firm is None or firm in (r.get("firms") or []):
                            chosen.append(r)
                    if chosen or time.monotonic() >= deadline:
                        break
                elif time.monotonic() >= deadline:
                    return refusal(409, "cursor_ahead", "past what this node has applied")
                self.changed.wait(max(0.0, deadline - time.monotonic()))
        nxt = self.cursor(n)
        body = {"header": {"next_cursor": nxt, "count": len(chosen),
                           "oldest_ts_ns": min((r["ts_ns"] for r in chosen), default=None),
                           "server": {"total_us": 1, "select_us": 1, "selects": 1}},
                "records": chosen}
        return json_reply(200, body, {"x-bourse-next-cursor": nxt})


def order(i: int, *, firm: int = 1, core: int = 0) -> Dict[str, Any]:
    """An order-log record as the node sends it."""
    return {
        "core": core, "index": 100 + i, "ord": 0, "firms": [firm, firm], "event": "order_log",
        "rec": i, "seq": i, "action": "new", "status": "new", "order_id": 1000 + i,
        "instrument": 1, "account": 10 + firm, "firm": firm, "cl_ord_id": i, "side": "buy",
        "price": 10000 + i, "qty_display": 5, "qty_leaves": 5, "qty_filled": 0,
        "qty_total": 5, "ts_ns": 1_700_000_000_000_000_000 + i,
    }


class FakeAdmin(FakeServer):
    """The admin API: an operator and a viewer; actions applied once per request id."""

    def __init__(self) -> None:
        self.operators = {"admin": ("secret", "operator"), "watcher": ("look", "viewer")}
        self.answers: Dict[str, Tuple[str, Reply]] = {}
        self.accounts: Dict[int, Dict[str, Any]] = {}
        self.applied: List[Dict[str, Any]] = []
        super().__init__()

    def route(self, req: Request) -> Reply:
        if req.path == "/healthz":
            return 200, {"Content-Type": "text/plain"}, b"ok\n"
        creds = req.basic()
        entry = self.operators.get(creds[0]) if creds else None
        if creds is None or entry is None or entry[0] != creds[1]:
            return json_reply(401, {"outcome": "refused", "error": "invalid credentials"},
                              {"WWW-Authenticate": 'Basic realm="bourse admin"'})
        role = entry[1]
        if req.method == "GET":
            if req.path == "/v1/instruments":
                return json_reply(200, {"outcome": "ok", "markets": [
                    {"market": "equities", "state": {"instruments": [
                        {"instrument": 1, "symbol": "EQ000001", "market": "equities",
                         "phase": "open", "reference_price": 10000}]}}]})
            if req.path.startswith("/v1/accounts/"):
                a = self.accounts.get(int(req.path.rsplit("/", 1)[1]))
                return json_reply(200, {"outcome": "ok", "markets": [
                    {"market": "equities", "state": a}]})
            if req.path.endswith("/book"):
                return json_reply(200, {"outcome": "ok", "markets": [
                    {"market": "equities", "state": {"orders": []}}]})
            return json_reply(404, {"outcome": "invalid", "error": "no route"})
        if role != "operator":
            return json_reply(403, {"outcome": "refused",
                                    "error": f"{creds[0]} holds none of the roles"})
        rid = req.headers.get("x-request-id")
        if not rid:
            return json_reply(400, {"outcome": "invalid",
                                    "error": "the x-request-id header is required"})
        if rid in self.answers:
            body, reply = self.answers[rid]
            if body != req.body.decode():
                return json_reply(409, {"outcome": "conflict", "error": "id reused"})
            status, h, data = reply
            answer = json.loads(data)
            answer["retried"] = True
            return status, h, json.dumps(answer).encode()
        if req.path == "/v1/accounts/bulk":
            lines = [json.loads(x) for x in req.body.decode().splitlines() if x.strip()]
            for a in lines:
                self.accounts[a["account"]] = {"firm": a["firm"], "cash": a.get("cash", 0)}
            reply = json_reply(200, {"outcome": "applied", "lines": len(lines),
                                     "accounts_added": {"equities": len(lines)}})
        else:
            action = json.loads(req.body)
            kind = action.get("action")
            if kind == "kill_switch" and (("firm" in action) == ("account" in action)):
                return json_reply(400, {"outcome": "invalid",
                                        "error": "kill_switch: name exactly one of firm and account"})
            if kind == "withdraw" and action.get("amount", 0) > 10**9:
                reply = json_reply(422, {"outcome": "rejected", "markets": [
                    {"market": action["market"], "reason": "insufficient_free_cash"}]})
            else:
                if kind == "add_account":
                    self.accounts[action["account"]] = {"firm": action["firm"],
                                                        "cash": action.get("cash", 0)}
                self.applied.append(action)
                reply = json_reply(200, {"outcome": "applied", "markets": [
                    {"market": "equities", "events": [], "events_total": 0}]})
        self.answers[rid] = (req.body.decode(), reply)
        return reply


class FakeClearing(FakeServer):
    """A clearing node with one operator and a firm's reader."""

    def __init__(self) -> None:
        self.users = {"op": ("pw", None), "f1": ("pw1", 1)}
        self.accounts = {n: {"account": n, "firm": 1 if n < 10 else 2, "cash": [],
                             "positions": [], "realised_pnl": "0.0000"} for n in range(1, 14)}
        self.runs: List[Dict[str, Any]] = []
        super().__init__()

    def route(self, req: Request) -> Reply:
        if req.path in ("/v1/status", "/healthz"):
            return json_reply(200, {"cut": [1], "standby": False})
        creds = req.basic()
        entry = self.users.get(creds[0]) if creds else None
        if creds is None or entry is None or entry[0] != creds[1]:
            return refusal(401, "refused", "credentials required (HTTP Basic)",
                           {"WWW-Authenticate": 'Basic realm="bourse clearing"'})
        firm = entry[1]
        parts = req.path.strip("/").split("/")
        if req.method == "POST" and req.path == "/v1/runs":
            if firm is not None:
                return refusal(403, "refused", f"{creds[0]} does not hold the role operator")
            body = json.loads(req.body or b"{}")
            if "kind" not in body and "run_id" not in body:
                return refusal(409, "run_refused", "a new run needs a kind")
            report = {"run_id": len(self.runs) + 1, "kind": body.get("kind"),
                      "accounts": list(self.accounts.values())}
            self.runs.append(report)
            return json_reply(200, report)
        if parts[:2] == ["v1", "accounts"]:
            n = int(parts[2])
            a = self.accounts.get(n)
            if firm is not None and (a is None or a["firm"] != firm):
                return refusal(403, "refused", f"account {n} belongs to another firm")
            if a is None:
                return refusal(404, "unknown_account", f"account {n} has neither been added")
            return json_reply(200, a)
        if parts[:2] == ["v1", "firms"]:
            f = int(parts[2])
            ids = sorted(n for n, a in self.accounts.items() if a["firm"] == f)
            after = int(req.query["after"]) if "after" in req.query else None
            limit = int(req.query.get("limit", 10000))
            if after is not None:
                ids = [n for n in ids if n > after]
            page = ids[:limit]
            if not page and after is None:
                return refusal(404, "unknown_firm", f"firm {f} has no account")
            more = len(ids) > limit
            return json_reply(200, {"firm": f, "accounts": [self.accounts[n] for n in page],
                                    "next_after": page[-1] if more else None})
        if parts[:2] == ["v1", "runs"]:
            if len(parts) == 2:
                return json_reply(200, {"runs": [{"run_id": r["run_id"]} for r in self.runs]})
            if firm is not None:
                return refusal(403, "refused", "a run's report lists every firm's accounts")
            n = int(parts[2])
            if not 1 <= n <= len(self.runs):
                return refusal(404, "unknown_run", f"no run {n} here")
            return json_reply(200, self.runs[n - 1])
        if parts[:2] == ["v1", "settlements"]:
            if len(parts[2]) != 10:
                return refusal(400, "bad_request", "a date is YYYY-MM-DD")
            return json_reply(200, {"date": parts[2], "lines": []})
        return refusal(404, "not_found", "unknown path")


def make_certificates(directory: str) -> Optional[Tuple[str, str, str]]:
    """A test authority and a certificate it signed for 127.0.0.1, made with the openssl
    command as docs/deploy.md makes the venue's: (ca.crt, server.crt, server.key), or None
    when there is no openssl."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    d = Path(directory)
    run = lambda *a: subprocess.run([openssl, *a], cwd=d, check=True,  # noqa: E731
                                    capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-days", "2", "-subj", "/CN=bourse test authority",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", "ca.key", "-out", "ca.crt")
    run("req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (d / "ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "ext", "-out", "server.crt")
    return str(d / "ca.crt"), str(d / "server.crt"), str(d / "server.key")
