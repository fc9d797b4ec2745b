"""``python -m bourse_client``: follow a delivery stream as JSON lines; query and operate
the admin API; read clearing data.

    export BOURSE_DELIVERY_PASSWORD=...      # as `bourse demo` prints it
    python -m bourse_client follow --url http://127.0.0.1:8700 --user firm-1 \\
        --cursor-file firm-1.cursor --count 100
    export BOURSE_ADMIN_URL=http://127.0.0.1:8090 BOURSE_ADMIN_PASSWORD=...
    python -m bourse_client admin add-account --account 900001 --firm 3 --cash 1000000000
    python -m bourse_client admin account 900001
    python -m bourse_client clearing --url http://127.0.0.1:9460 account 1

Passwords come from the environment only (``BOURSE_DELIVERY_PASSWORD``,
``BOURSE_ADMIN_PASSWORD``, ``BOURSE_CLEARING_PASSWORD``), never from the command line.
Exit status: 0 done, 1 refused by the service (the refusal's code and message on stderr),
2 bad usage, 3 the service could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, List, Optional, Sequence

from . import errors
from .admin import AdminClient
from .clearing import ClearingClient
from .cursor_file import CursorFile
from .delivery import DeliveryClient


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _password(var: str, user: Optional[str]) -> Optional[str]:
    if user is None:
        return None
    password = os.environ.get(var)
    if password is None:
        print(f"set {var} to {user}'s password", file=sys.stderr)
        raise SystemExit(2)
    return password


def _follow(args: argparse.Namespace) -> int:
    password = _password("BOURSE_DELIVERY_PASSWORD", args.user)
    client = DeliveryClient(
        args.url, user=args.user, password=password, ca_file=args.ca_file
    )
    store = CursorFile(args.cursor_file) if args.cursor_file else None
    follower = client.follow(
        args.cursor,
        store=store,
        firm=args.firm,
        account=args.account,
        instrument=args.instrument,
        limit=args.limit,
        wait_us=args.wait_us,
        min_rows=args.min_rows,
        restart_on_lost_cursor=args.restart_on_lost_cursor,
        on_retry=lambda e, pause: print(
            f"{e}; {'starting again from a snapshot' if pause == 0 else f'retrying in {pause:g} s'}",
            file=sys.stderr,
        ),
    )
    printed = 0
    started = time.monotonic()
    out = sys.stdout
    # The cursor after the last batch printed whole: where a next run continues.
    resume = follower.cursor
    try:
        for answer in follower.batches():
            if args.count is not None and printed + len(answer.records) > args.count:
                # Stop inside this batch: its cursor is not saved (the rest is read again).
                for record in answer.records[: args.count - printed]:
                    out.write(_dump(record.raw) + "\n")
                printed = args.count
                out.flush()
                break
            for record in answer.records:
                out.write(_dump(record.raw) + "\n")
            printed += len(answer.records)
            out.flush()
            resume = answer.next_cursor
            done = (
                (args.count is not None and printed >= args.count)
                or (args.seconds is not None and time.monotonic() - started >= args.seconds)
                or (args.until_idle and not answer.records)
            )
            if done:
                follower.save()
                break
    except BrokenPipeError:
        return 0
    finally:
        client.close()
    tail = f"; continue with --cursor {resume}" if resume else ""
    print(f"{printed} records{tail}", file=sys.stderr)
    return 0


def _admin(args: argparse.Namespace) -> int:
    password = os.environ.get("BOURSE_ADMIN_PASSWORD")
    admin = AdminClient(args.url, user=args.user, password=password, ca_file=args.ca_file)
    rid = args.request_id
    c = args.command
    if c == "instruments":
        out: Any = admin.instruments()
    elif c == "account":
        out = admin.account(args.id)
    elif c == "book":
        out = admin.book(args.id)
    elif c in ("halt", "resume"):
        out = (admin.halt if c == "halt" else admin.resume)(
            instrument=args.instrument, market=args.market, request_id=rid
        ).raw
    elif c in ("kill", "release"):
        out = (admin.kill if c == "kill" else admin.release)(
            firm=args.firm, account=args.account, request_id=rid
        ).raw
    elif c == "add-account":
        out = admin.add_account(
            args.account, args.firm, cash=args.cash, may_short=args.may_short,
            markets=args.markets.split(",") if args.markets else None, request_id=rid,
        ).raw
    elif c in ("deposit", "withdraw"):
        out = getattr(admin, c)(args.market, args.account, args.amount, request_id=rid).raw
    elif c == "end-of-day":
        out = admin.end_of_day(market=args.market, request_id=rid).raw
    else:  # pragma: no cover - argparse keeps to the choices
        raise SystemExit(f"unknown command {c}")
    print(json.dumps(out, indent=2))
    return 0


def _clearing(args: argparse.Namespace) -> int:
    password = os.environ.get("BOURSE_CLEARING_PASSWORD") if args.user else None
    clearing = ClearingClient(args.url, user=args.user, password=password,
                              ca_file=args.ca_file)
    c = args.command
    if c == "account":
        out: Any = clearing.account(args.id)
    elif c == "firm":
        out = list(clearing.firm_accounts(args.id))
    elif c == "runs":
        out = clearing.runs()
    elif c == "report":
        out = clearing.report(args.id)
    elif c == "run":
        out = clearing.run(args.kind)
    elif c == "status":
        out = clearing.status()
    else:  # pragma: no cover
        raise SystemExit(f"unknown command {c}")
    print(json.dumps(out, indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bourse_client",
        description="bourse's delivery, admin and clearing APIs from the command line",
    )
    sub = p.add_subparsers(dest="api", required=True)

    f = sub.add_parser("follow", help="follow a delivery node's records as JSON lines")
    f.add_argument("--url", default="http://127.0.0.1:8700")
    f.add_argument("--user", help="reader's name (password: BOURSE_DELIVERY_PASSWORD)")
    f.add_argument("--ca-file", help="the venue's authority (PEM) for an https:// URL")
    start = f.add_mutually_exclusive_group()
    start.add_argument("--cursor", help="start after this cursor (default: a snapshot first)")
    start.add_argument(
        "--cursor-file",
        help="resume from the cursor saved in this file and save it after each batch",
    )
    f.add_argument("--firm", type=int)
    f.add_argument("--account", type=int)
    f.add_argument("--instrument", type=int)
    f.add_argument("--limit", type=int)
    f.add_argument("--wait-us", type=int, default=1_000_000, help="long-poll wait (µs)")
    f.add_argument("--min-rows", type=int, help="answer at once when this many are ready")
    f.add_argument("--count", type=int, help="stop after this many records")
    f.add_argument("--seconds", type=float, help="stop after this many seconds")
    f.add_argument("--until-idle", action="store_true",
                   help="stop at the first answer with nothing new")
    f.add_argument("--restart-on-lost-cursor", action="store_true",
                   help="on cursor_too_old or cursor_foreign start again from a snapshot "
                        "instead of stopping")
    f.set_defaults(run=_follow)

    a = sub.add_parser("admin", help="the admin API (password: BOURSE_ADMIN_PASSWORD)")
    a.add_argument("--url", default=os.environ.get("BOURSE_ADMIN_URL", "http://127.0.0.1:8090"))
    a.add_argument("--user", default=os.environ.get("BOURSE_ADMIN_USER", "admin"))
    a.add_argument("--ca-file", default=os.environ.get("BOURSE_ADMIN_CA"))
    a.add_argument("--request-id", help="the action's X-Request-Id (default: a new one)")
    ac = a.add_subparsers(dest="command", required=True)
    ac.add_parser("instruments")
    for name in ("account", "book"):
        ac.add_parser(name).add_argument("id", type=int)
    for name in ("halt", "resume"):
        s = ac.add_parser(name)
        s.add_argument("--instrument", type=int)
        s.add_argument("--market")
    for name in ("kill", "release"):
        s = ac.add_parser(name)
        s.add_argument("--firm", type=int)
        s.add_argument("--account", type=int)
    s = ac.add_parser("add-account")
    s.add_argument("--account", type=int, required=True)
    s.add_argument("--firm", type=int, required=True)
    s.add_argument("--cash", type=int, default=0, help="cash in units of 10^-4")
    s.add_argument("--may-short", action="store_true")
    s.add_argument("--markets", help="comma-separated (default: every market)")
    for name in ("deposit", "withdraw"):
        s = ac.add_parser(name)
        s.add_argument("--market", required=True)
        s.add_argument("--account", type=int, required=True)
        s.add_argument("--amount", type=int, required=True, help="cash in units of 10^-4")
    ac.add_parser("end-of-day").add_argument("--market")
    a.set_defaults(run=_admin)

    c = sub.add_parser("clearing", help="clearing data (password: BOURSE_CLEARING_PASSWORD)")
    c.add_argument("--url", default="http://127.0.0.1:9460")
    c.add_argument("--user", default=os.environ.get("BOURSE_CLEARING_USER"))
    c.add_argument("--ca-file")
    cc = c.add_subparsers(dest="command", required=True)
    for name in ("account", "firm", "report"):
        cc.add_parser(name).add_argument("id", type=int)
    cc.add_parser("runs")
    cc.add_parser("status")
    cc.add_parser("run").add_argument("kind", choices=["intermediate", "end_of_day"])
    c.set_defaults(run=_clearing)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(list(argv) if argv is not None else None)
    try:
        code: int = args.run(args)
        return code
    except errors.ApiError as e:
        print(f"{e.status} {e.code}: {e.message}", file=sys.stderr)
        return 1
    except errors.TransportError as e:
        print(str(e), file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`| head`): not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
