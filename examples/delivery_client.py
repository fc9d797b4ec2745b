#!/usr/bin/env python3
"""Follow a bourse delivery node (`bourse delivery serve`) from Python: the standard library only.

Polls GetOrders (`GET /v1/orders`) in a loop, keeps the cursor of each answer, and prints the
records as JSON lines. It reads the next cursor from the response header `x-bourse-next-cursor`
first, so it could ask again before decoding the body. On a `cursor_too_old` or
`cursor_foreign` error it does what the error says: starts again with no cursor, which reads a
snapshot of the current state first.

    python3 examples/delivery_client.py --url http://127.0.0.1:8700 --firm 2 --count 100
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def poll(url, cursor, params, timeout_s):
    query = dict(params)
    if cursor:
        query["cursor"] = cursor
    full = url.rstrip("/") + "/v1/orders?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(full, timeout=timeout_s) as answer:
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
    args = p.parse_args()

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
            cursor, header, records = poll(args.url, cursor, params, timeout_s=10)
        except urllib.error.HTTPError as e:
            error = json.loads(e.read()).get("error", {})
            print(f"{e.code} {error.get('code')}: {error.get('message')}", file=sys.stderr)
            if error.get("code") in ("cursor_too_old", "cursor_foreign"):
                cursor = None  # as the error says: start again from a snapshot
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
