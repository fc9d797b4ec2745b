#!/usr/bin/env python3
"""Follow a bourse delivery node (`bourse delivery serve`) from Python: the standard library only.

Polls GetOrders (`GET /v1/orders`) in a loop, keeps the cursor of each answer, and prints the
records as JSON lines. It reads the next cursor from the response header `x-bourse-next-cursor`
first, so it could ask again before decoding the body. On a `cursor_too_old` or
`cursor_foreign` error it does what the error says: starts again with no cursor, which reads a
snapshot of the current state first.

A node with readers' credentials (`[access]` in its TOML; the demo's, which `bourse demo`
prints) answers only to them: give the reader's name with --user and its password in the
environment variable BOURSE_DELIVERY_PASSWORD; they go as HTTP Basic with every request (the
node checks them once and remembers the result). A firm's reader gets its own firm's records
only. Off the loopback the node speaks HTTPS: use an https:// URL and --ca-file with the
venue's authority.

    export BOURSE_DELIVERY_PASSWORD=...   # as `bourse demo` prints it
    python3 examples/delivery_client.py --url http://127.0.0.1:8700 --user firm-1 --count 100
"""

import argparse
import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def poll(url, cursor, params, timeout_s, authorization=None, context=None):
    query = dict(params)
    if cursor:
        query["cursor"] = cursor
    full = url.rstrip("/") + "/v1/orders?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(full)
    if authorization:
        request.add_header("Authorization", authorization)
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as answer:
        next_cursor = answer.headers["x-bourse-next-cursor"]
        body = json.loads(answer.read())
    return next_cursor, body["header"], body["records"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8700")
    p.add_argument("--cursor", help="continue from this cursor (default: a snapshot first)")
    p.add_argument("--firm", type=int)
    p.add_argument("--account", type=int)
    p.add_argument("--instrument", type=int)
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--wait-us", type=int, default=500)
    p.add_argument("--min-rows", type=int, default=1)
    p.add_argument("--count", type=int, help="stop after this many records")
    p.add_argument("--seconds", type=float, help="stop after this many seconds")
    p.add_argument("--user", help="log on as this reader (password: BOURSE_DELIVERY_PASSWORD)")
    p.add_argument("--ca-file", help="trust this authority (PEM) for an https:// URL")
    args = p.parse_args()

    authorization = None
    if args.user:
        password = os.environ.get("BOURSE_DELIVERY_PASSWORD")
        if password is None:
            print("set BOURSE_DELIVERY_PASSWORD to the reader's password", file=sys.stderr)
            return 2
        token = base64.b64encode(f"{args.user}:{password}".encode()).decode()
        authorization = "Basic " + token
    context = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None

    params = {"limit": args.limit, "wait_us": args.wait_us, "min_rows": args.min_rows}
    for name in ("firm", "account", "instrument"):
        value = getattr(args, name)
        if value is not None:
            params[name] = value

    cursor = args.cursor
    printed = 0
    started = time.monotonic()
    while True:
        if args.count is not None and printed >= args.count:
            break
        if args.seconds is not None and time.monotonic() - started >= args.seconds:
            break
        try:
            cursor, header, records = poll(
                args.url, cursor, params, 10, authorization=authorization, context=context
            )
        except urllib.error.HTTPError as e:
            error = json.loads(e.read()).get("error", {})
            print(f"{e.code} {error.get('code')}: {error.get('message')}", file=sys.stderr)
            if error.get("code") in ("cursor_too_old", "cursor_foreign"):
                cursor = None  # as the error says: start again from a snapshot
                continue
            if error.get("code") == "cursor_ahead":
                time.sleep(0.5)  # the node has not got this far yet: retry the same cursor
                continue
            if e.code == 503:
                time.sleep(float(e.headers.get("Retry-After", "1")))
                continue
            return 1
        except urllib.error.URLError as e:
            print(f"{args.url}: {e.reason}; retrying", file=sys.stderr)
            time.sleep(0.5)
            continue
        for record in records:
            print(json.dumps(record))
            printed += 1
        sys.stdout.flush()
    print(f"{printed} records; continue with --cursor {cursor}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
