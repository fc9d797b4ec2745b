#!/usr/bin/env python3
"""Follow a bourse delivery node (`bourse delivery serve`) from Python with the bourse_client
package (clients/python; `pip install ./clients/python`, or run from the repository as is).

Prints the records as JSON lines, following the node's cursor with long polls; on
`cursor_too_old` or `cursor_foreign` starts again with no cursor (a snapshot of the current
state first), and retries what the node says to retry (`busy`, `rate_limited`,
`catching_up`, `cursor_ahead`). A node with readers' credentials (the demo's, which
`bourse demo` prints) answers only to them: --user names the reader, BOURSE_DELIVERY_PASSWORD
holds its password; a firm's reader gets its own firm's records only. Off the loopback the
node speaks HTTPS: an https:// URL and --ca-file with the venue's authority.

    export BOURSE_DELIVERY_PASSWORD=...   # as `bourse demo` prints it
    python3 examples/delivery_client.py --url http://127.0.0.1:8700 --user firm-1 --count 100

The package's own command does the same, and keeps the cursor in a file across restarts:
`python3 -m bourse_client follow --cursor-file F ...` (clients/python/README.md).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

try:
    import bourse_client
except ImportError:  # not installed: the package's source beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python" / "src"))
    import bourse_client


def main() -> int:
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

    password = None
    if args.user:
        password = os.environ.get("BOURSE_DELIVERY_PASSWORD")
        if password is None:
            print("set BOURSE_DELIVERY_PASSWORD to the reader's password", file=sys.stderr)
            return 2
    client = bourse_client.DeliveryClient(
        args.url, user=args.user, password=password, ca_file=args.ca_file
    )
    follower = client.follow(
        args.cursor,
        firm=args.firm,
        account=args.account,
        instrument=args.instrument,
        limit=args.limit,
        wait_us=args.wait_us,
        min_rows=args.min_rows,
        restart_on_lost_cursor=True,
    )
    printed = 0
    started = time.monotonic()
    resume = args.cursor  # the cursor after the last batch printed whole
    try:
        for answer in follower.batches():
            for record in answer.records:  # dataclasses; .raw is the node's JSON object
                if args.count is not None and printed >= args.count:
                    break
                print(json.dumps(record.raw))
                printed += 1
            else:
                resume = answer.next_cursor
            sys.stdout.flush()
            if args.count is not None and printed >= args.count:
                break
            if args.seconds is not None and time.monotonic() - started >= args.seconds:
                break
    except bourse_client.ApiError as e:
        print(f"{e.status} {e.code}: {e.message}", file=sys.stderr)
        return 1
    finally:
        client.close()
    tail = f"; continue with --cursor {resume}" if resume else ""
    print(f"{printed} records{tail}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
