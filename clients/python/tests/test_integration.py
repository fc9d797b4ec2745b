"""Against a real venue: ``bourse demo`` (its delivery node and admin API) and a clearing
node (``bourse clearing serve``) following the demo's cores.

The binary comes from ``BOURSE_BIN`` (scripts/test.sh sets it to the ci build); without it
these tests are skipped, saying so. Nothing here depends on timing: each test waits for what
must happen with a generous bound, then checks what must hold.

The demo has no clearing service of its own, so the test starts one with a config naming
the demo's core nodes (which the demo prints) and an empty instruments file: clearing learns
every instrument from the ``instrument_added`` events on the cores' streams.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import fakes  # noqa: F401  (puts ../src on sys.path)

import bourse_client as bc
from bourse_client import errors

_BIN = os.environ.get("BOURSE_BIN")
#: Absolute: the processes start in directories of their own.
BIN = os.path.abspath(_BIN) if _BIN else None
T = TypeVar("T")

#: Generous bounds: the machine may be busy with builds.
START_S = 120.0
WAIT_S = 120.0


def wait_for(what: str, probe: Callable[[], Optional[T]], seconds: float = WAIT_S) -> T:
    """Calls ``probe`` until it returns something other than None (or raises a non-bourse
    error), at most ``seconds``."""
    deadline = time.monotonic() + seconds
    last: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            got = probe()
        except errors.BourseError as e:
            last, got = e, None
        if got is not None:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {seconds:.0f} s (last error: {last!r})")


class Process:
    """A child process whose stdout lines are collected by a thread."""

    def __init__(self, argv: List[str], cwd: str) -> None:
        self.lines: List[str] = []
        self.changed = threading.Condition()
        self.proc = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            bufsize=1,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_line(self, pattern: str, seconds: float = START_S) -> "re.Match[str]":
        rx = re.compile(pattern)
        deadline = time.monotonic() + seconds
        with self.changed:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                if self.proc.poll() is not None and not self.thread.is_alive():
                    raise AssertionError(
                        f"{self.proc.args[0]} exited ({self.proc.returncode}) before "
                        f"printing /{pattern}/:\n" + "\n".join(self.lines[-40:]))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line /{pattern}/ in {seconds:.0f} s:\n"
                                         + "\n".join(self.lines[-40:]))
                self.changed.wait(min(left, 1.0))

    def stop(self) -> None:
        """SIGINT (the demo and the services stop cleanly on it), then SIGKILL if needed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.thread.join(timeout=10)
        if self.proc.stdout is not None and not self.thread.is_alive():
            self.proc.stdout.close()


class Venue:
    """``bourse demo`` with its services on free ports, and what it printed about them."""

    def __init__(self) -> None:
        assert BIN is not None
        self.dir = tempfile.mkdtemp(prefix="bourse-pyclient-")
        self.demo = Process(
            [BIN, "demo", "--seconds", "900", "--rate", "500", "--accounts", "1000",
             "--no-dashboard", "--delivery-port", "0", "--admin-port", "0",
             "--out", str(Path(self.dir) / "report")],
            cwd=self.dir,
        )
        self.clearing: Optional[Process] = None
        try:
            self.demo.wait_line(r"participants offer")
            m = self.demo.wait_line(
                r"delivery: (http://127\.0\.0\.1:\d+)/v1/orders .*readers viewer "
                r"\(password (\w+): .*firm-1 \(password (\w+):")
            self.delivery_url, self.viewer_password, self.firm_password = m.groups()
            m = self.demo.wait_line(r"admin API: (http://127\.0\.0\.1:\d+) \(operator (\S+), "
                                    r"password (\w+)\)")
            self.admin_url, self.admin_user, self.admin_password = m.groups()
            self.cores: List[List[str]] = []
            for line in self.demo.lines:
                m2 = re.search(r"^\s+core \S+\s+nodes ([0-9.:, ]+);", line)
                if m2:
                    self.cores.append([a.strip() for a in m2.group(1).split(",")])
            assert len(self.cores) == 3, self.demo.lines[:10]
        except BaseException:
            self.stop()
            raise

    def start_clearing(self) -> str:
        """A clearing node over the demo's cores; its URL."""
        d = Path(self.dir) / "clearing"
        d.mkdir()
        (d / "instruments.json").write_text("[]\n")
        cores = ", ".join("[" + ", ".join(f'"{a}"' for a in c) + "]" for c in self.cores)
        (d / "clearing.toml").write_text(
            'name = "pyclient-test"\nlisten = "127.0.0.1:0"\n'
            f"cores = [{cores}]\n"
            'instruments = "instruments.json"\nstate_dir = "state"\n'
        )
        assert BIN is not None
        self.clearing = Process([BIN, "clearing", "serve", "--config", str(d / "clearing.toml")],
                                cwd=str(d))
        return self.clearing.wait_line(r"serving (http://127\.0\.0\.1:\d+)").group(1)

    def stop(self) -> None:
        if self.clearing is not None:
            self.clearing.stop()
        self.demo.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


VENUE: Optional[Venue] = None


def setUpModule() -> None:
    global VENUE
    if BIN:
        if not os.access(BIN, os.X_OK):
            raise RuntimeError(f"BOURSE_BIN={BIN} is not an executable")
        VENUE = Venue()


def tearDownModule() -> None:
    if VENUE is not None:
        VENUE.stop()


def venue() -> Venue:
    assert VENUE is not None
    return VENUE


Pos = Tuple[int, int]


def check_cursor_order(test: unittest.TestCase, records: List[bc.Record]) -> None:
    """Every record once; each core's in (index, ord) order."""
    seen = [r.pos for r in records]
    test.assertEqual(len(seen), len(set(seen)), "a record arrived twice")
    last: Dict[int, Pos] = {}
    for r in records:
        here = (r.index, r.ord)
        if r.core in last:
            test.assertGreater(here, last[r.core], f"core {r.core} out of cursor order")
        last[r.core] = here


@unittest.skipUnless(BIN, "BOURSE_BIN is unset: set it to a bourse binary (scripts/test.sh "
                          "uses target/ci/bourse) to run the tests against a real venue")
class DeliveryAgainstTheDemo(unittest.TestCase):
    def viewer(self) -> bc.DeliveryClient:
        v = venue()
        c = bc.DeliveryClient(v.delivery_url, user="viewer", password=v.viewer_password)
        self.addCleanup(c.close)
        return c

    def test_a_viewer_follows_every_record_once_in_cursor_order_while_the_demo_trades(self
                                                                                      ) -> None:
        started_ns = time.time_ns()
        follower = self.viewer().follow(limit=1000, wait_us=500_000)
        records: List[bc.Record] = []
        deadline = time.monotonic() + WAIT_S
        for answer in follower.batches():
            records.extend(answer.records)
            # The snapshot, then the demo's trading seen live, on every core.
            live = [r for r in records if r.ts_ns > started_ns]
            if len(live) >= 1000 and len({r.core for r in live if isinstance(r, bc.Trade)}) == 3:
                break
            self.assertLess(time.monotonic(), deadline, "the demo did not trade enough")
        check_cursor_order(self, records)
        # Trades are final and nothing is evicted in a run this short: every trade of every
        # core from the first (the snapshot starts at the origin), none missing, none twice.
        ids: Dict[int, List[int]] = {}
        for r in records:
            if isinstance(r, bc.Trade):
                ids.setdefault(r.core, []).append(r.trade_id)
        self.assertEqual(set(ids), {0, 1, 2})
        for core, got in ids.items():
            self.assertEqual(got, list(range(1, len(got) + 1)), f"trades of core {core}")
        # An order's state comes again only when it changed, further on, with a higher seq.
        seqs: Dict[Tuple[int, int], int] = {}
        for r in records:
            if isinstance(r, bc.OrderState):
                key = (r.core, r.order_id)
                if key in seqs:
                    self.assertGreater(r.seq, seqs[key])
                seqs[key] = r.seq

    def test_a_restarted_reader_resumes_from_its_cursor_file(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            store = bc.CursorFile(Path(d) / "viewer.cursor")
            first: List[bc.Record] = []
            last_batch: List[bc.Record] = []
            for answer in self.viewer().follow(store=store, limit=100,
                                               wait_us=500_000).batches():
                first.extend(answer.records)
                last_batch = answer.records
                if len(first) >= 500:
                    break
            # Stopped as soon as a batch came: the file holds the cursor before it.
            saved = store.load()
            self.assertIsNotNone(saved)
            # What a restarted program does: a new client, the cursor from the file.
            second: List[bc.Record] = []
            follower = self.viewer().follow(store=store, limit=100, wait_us=500_000)
            self.assertEqual(follower.cursor, saved)
            for answer in follower.batches():
                second.extend(answer.records)
                if len(second) >= 500:
                    break
            self.assertNotEqual(store.load(), saved)
        # Only the batch the first run had not finished is read again (less the orders
        # that changed since, which come later in their new state).
        first_pos = {r.pos for r in first}
        read_again = {r.pos for r in second if r.pos in first_pos}
        self.assertLessEqual(read_again, {r.pos for r in last_batch})
        check_cursor_order(self, first + [r for r in second if r.pos not in first_pos])

    def test_the_command_run_twice_continues_where_the_first_run_stopped(self) -> None:
        v = venue()
        with tempfile.TemporaryDirectory() as d:
            cursor_file = str(Path(d) / "viewer.cursor")
            env = dict(os.environ, BOURSE_DELIVERY_PASSWORD=v.viewer_password,
                       PYTHONPATH=fakes.SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
            runs: List[List[bc.Record]] = []
            for _ in range(2):
                p = subprocess.run(
                    [sys.executable, "-m", "bourse_client", "follow", "--url", v.delivery_url,
                     "--user", "viewer", "--cursor-file", cursor_file, "--limit", "500",
                     "--seconds", "1"],
                    env=env, capture_output=True, text=True, timeout=WAIT_S,
                )
                self.assertEqual(p.returncode, 0, p.stderr)
                runs.append([bc.record_from_dict(json.loads(x)) for x in p.stdout.splitlines()])
        self.assertTrue(runs[0] and runs[1])
        # Each run stopped after a whole batch and saved its cursor: the second starts right
        # after the first, nothing twice, nothing out of order.
        check_cursor_order(self, runs[0] + runs[1])

    def test_a_firms_reader_sees_its_own_records_and_its_side_of_trades(self) -> None:
        v = venue()
        with bc.DeliveryClient(v.delivery_url, user="firm-1",
                               password=v.firm_password) as client:
            records: List[bc.Record] = []
            follower = client.follow(limit=10_000, wait_us=500_000)

            def some_trades() -> Optional[bool]:
                records.extend(follower.next_answer().records)
                return True if any(isinstance(r, bc.Trade) for r in records) else None

            wait_for("a trade of firm 1", some_trades)
        self.assertTrue(records)
        check_cursor_order(self, records)
        for r in records:
            if isinstance(r, bc.Trade):
                self.assertIn(1, r.firms)
                for side, firm in ((r.buy, r.firms[0]), (r.sell, r.firms[1])):
                    self.assertEqual(side.withheld, firm != 1, r.raw)
            else:
                self.assertEqual(r.firms, (1, 1), r.raw)
                if isinstance(r, bc.OrderState):
                    self.assertEqual(r.firm, 1)

    def test_the_node_refuses_as_documented(self) -> None:
        v = venue()
        with bc.DeliveryClient(v.delivery_url, user="firm-1", password="wrong") as c:
            with self.assertRaises(errors.DeliveryUnauthenticated):
                c.poll(wait_us=0)
        with bc.DeliveryClient(v.delivery_url) as c:
            with self.assertRaises(errors.DeliveryUnauthenticated):
                c.status()
        with bc.DeliveryClient(v.delivery_url, user="firm-1",
                               password=v.firm_password) as c:
            with self.assertRaises(errors.NotEntitled):
                c.poll(firm=2, wait_us=0)
            with self.assertRaises(errors.CursorMalformed):
                c.poll("zz", wait_us=0)
            with self.assertRaises(errors.BadRequest):
                c.poll(limit=0, wait_us=0)
            status = c.status()
            self.assertGreaterEqual(status["refusals"]["not_entitled"], 1)


@unittest.skipUnless(BIN, "BOURSE_BIN is unset: set it to a bourse binary to run the tests "
                          "against a real venue")
class AdminAndClearingAgainstTheDemo(unittest.TestCase):
    def admin(self, password: Optional[str] = None) -> bc.AdminClient:
        v = venue()
        a = bc.AdminClient(v.admin_url, user=v.admin_user,
                           password=password or v.admin_password)
        self.addCleanup(a.close)
        return a

    def test_an_account_added_is_read_back(self) -> None:
        admin = self.admin()
        rid = f"pyclient-add-{os.getpid()}"
        result = admin.add_account(900001, 3, cash=1_000_000_000, request_id=rid)
        self.assertEqual((result.outcome, result.retried), ("applied", False))
        markets = admin.account(900001)["markets"]
        self.assertEqual(len(markets), 3)
        for m in markets:
            self.assertEqual((m["state"]["firm"], m["state"]["cash"]), (3, 1_000_000_000), m)
        again = admin.add_account(900001, 3, cash=1_000_000_000, request_id=rid)
        self.assertTrue(again.retried)
        with self.assertRaises(errors.AdminConflict):
            admin.add_account(900002, 3, request_id=rid)
        bulk = admin.add_accounts([{"account": 900201 + i, "firm": 4, "cash": 100}
                                   for i in range(2)])
        self.assertEqual(bulk.outcome, "applied", bulk.raw)
        for m in admin.account(900202)["markets"]:
            self.assertEqual((m["state"]["firm"], m["state"]["cash"]), (4, 100), m)
        self.assertEqual(len(admin.instruments()["markets"]), 3)
        with self.assertRaises(errors.AdminInvalid):
            admin.kill_switch(engaged=True)
        with self.assertRaises(errors.AdminUnauthenticated):
            self.admin(password="wrong").instruments()

    def test_clearing_follows_the_demo_and_reports_a_run(self) -> None:
        v = venue()
        url = v.start_clearing()
        clearing = bc.ClearingClient(url)
        self.addCleanup(clearing.close)
        self.admin().add_account(900101, 7, cash=5_000_000)

        def added() -> Optional[dict]:
            a = clearing.account(900101)
            return a if a.get("firm") == 7 else None

        account = wait_for("clearing reads the account the admin added", added)
        self.assertEqual(len(account["cash"]), 3)
        with self.assertRaises(errors.UnknownAccount):
            clearing.account(4_000_000_000)

        def traded() -> Optional[dict]:
            s = clearing.status()
            return s if s.get("trades", 0) > 0 else None

        wait_for("clearing has read trades", traded)
        report = clearing.run("intermediate")
        self.assertEqual(report["kind"], "intermediate")
        self.assertEqual(report["pending"], 0)
        self.assertTrue(report["accounts"])
        self.assertIn(report["run_id"], [r["run_id"] for r in clearing.runs()["runs"]])
        self.assertEqual(clearing.report(report["run_id"])["state_hash"], report["state_hash"])
        with self.assertRaises(errors.UnknownRun):
            clearing.report(report["run_id"] + 1000)
        firm = report["accounts"][0]["firm"]
        if firm is not None:
            accounts = list(clearing.firm_accounts(firm))
            self.assertIn(report["accounts"][0]["account"], [a["account"] for a in accounts])


if __name__ == "__main__":
    unittest.main()
