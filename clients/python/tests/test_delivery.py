"""The delivery client against a fake node: polls, cursor following, resume from a saved
cursor, every refusal of docs/delivery.md and authentication."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import List, Tuple

import fakes  # noqa: F401  (puts ../src on sys.path)
from fakes import DELIVERY_REFUSALS, FakeDelivery, order, refusal

import bourse_client as bc
from bourse_client import errors


class Sleeps:
    """A stand-in for time.sleep that records the pauses asked."""

    def __init__(self) -> None:
        self.asked: List[float] = []

    def __call__(self, s: float) -> None:
        self.asked.append(s)


def until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


class PollTest(unittest.TestCase):
    def setUp(self) -> None:
        self.node = FakeDelivery()
        self.addCleanup(self.node.close)
        self.client = bc.DeliveryClient(self.node.url)
        self.addCleanup(self.client.close)

    def test_a_poll_answers_dataclasses_with_the_raw_dict_and_the_next_cursor(self) -> None:
        self.node.append(order(1), order(2))
        a = self.client.poll(limit=10)
        self.assertEqual(a.count, 2)
        self.assertEqual(a.next_cursor, self.node.cursor(2))
        first = a.records[0]
        self.assertIsInstance(first, bc.OrderState)
        assert isinstance(first, bc.OrderState)
        self.assertEqual((first.order_id, first.price, first.side), (1001, 10001, "buy"))
        self.assertEqual(first.pos, (0, 101, 0))
        self.assertEqual(first.raw, order(1))
        self.assertEqual(a.oldest_ts_ns, order(1)["ts_ns"])
        q = self.node.requests[-1].query
        self.assertEqual(q, {"limit": "10"})  # no cursor: a snapshot; nothing else sent

    def test_parameters_go_as_the_query_and_the_cursor_comes_back(self) -> None:
        self.node.append(order(1))
        a = self.client.poll(limit=5, wait_us=1000, min_rows=1, firm=1, account=11,
                             instrument=1)
        b = self.client.poll(a.next_cursor, wait_us=0)
        self.assertEqual(b.records, [])
        self.assertEqual(b.next_cursor, a.next_cursor)
        self.assertEqual(self.node.requests[0].query, {
            "firm": "1", "account": "11", "instrument": "1", "limit": "5", "wait_us": "1000",
            "min_rows": "1"})
        self.assertEqual(self.node.requests[1].query["cursor"], a.next_cursor)

    def test_one_connection_serves_every_poll(self) -> None:
        for i in range(5):
            self.node.append(order(i))
            self.client.poll(wait_us=0)
        self.assertEqual(self.node.connections, 1)

    def test_a_trade_a_reject_and_an_unknown_event_become_their_classes(self) -> None:
        withheld = {"order_id": 7, "account": bc.WITHHELD_ACCOUNT,
                    "cl_ord_id": bc.WITHHELD_CL_ORD_ID, "qty_leaves": 0, "qty_filled": 2}
        trade = {"core": 1, "index": 5, "ord": 1, "firms": [1, None], "event": "trade",
                 "trade_id": 9, "instrument": 3, "price": 100, "qty": 2, "aggressor": "buy",
                 "buy": {"order_id": 6, "account": 11, "cl_ord_id": 4, "qty_leaves": 0,
                         "qty_filled": 2},
                 "sell": withheld, "ts_ns": 5}
        reject = {"core": 0, "index": 6, "ord": 0, "firms": [1, 1],
                  "event": "order_rejected", "account": 11, "cl_ord_id": 5, "instrument": 3,
                  "reason": "insufficient_free_cash", "ts_ns": 6}
        other = {"core": 0, "index": 7, "ord": 0, "firms": [1, 1], "event": "news",
                 "ts_ns": 7}
        self.node.append(trade, reject, other)
        t, r, o = self.client.poll().records
        assert isinstance(t, bc.Trade) and isinstance(r, bc.OrderRejected)
        assert isinstance(o, bc.OtherRecord)
        self.assertEqual(t.firms, (1, None))
        self.assertFalse(t.buy.withheld)
        self.assertTrue(t.sell.withheld)
        self.assertFalse(t.auction)
        self.assertEqual(r.reason, "insufficient_free_cash")
        self.assertEqual(o.event, "news")
        self.assertEqual(o.raw, other)
        self.assertEqual(hash(t), hash(t))  # frozen: usable in sets

    def test_status_and_metrics(self) -> None:
        self.assertEqual(self.client.status()["identity"], FakeDelivery.IDENTITY)
        self.assertIn("bourse_delivery_polls_total", self.client.metrics())


class RefusalTest(unittest.TestCase):
    """Each refusal of the table is its own exception, with the status, code, message and
    Retry-After the node sent."""

    expected = {
        "bad_request": errors.BadRequest,
        "cursor_malformed": errors.CursorMalformed,
        "cursor_foreign": errors.CursorForeign,
        "cursor_too_old": errors.CursorTooOld,
        "busy": errors.Busy,
        "rate_limited": errors.RateLimited,
        "catching_up": errors.CatchingUp,
        "filter_not_served": errors.FilterNotServed,
        "cursor_ahead": errors.CursorAhead,
        "unauthenticated": errors.DeliveryUnauthenticated,
        "not_entitled": errors.NotEntitled,
    }

    def setUp(self) -> None:
        self.node = FakeDelivery()
        self.addCleanup(self.node.close)
        self.client = bc.DeliveryClient(self.node.url)
        self.addCleanup(self.client.close)

    def test_every_documented_refusal_raises_its_own_exception(self) -> None:
        self.assertEqual(set(self.expected), {code for code, _, _ in DELIVERY_REFUSALS})
        self.assertEqual(set(self.expected), set(errors.DELIVERY_REFUSALS) - {"not_found"})
        for code, status, headers in DELIVERY_REFUSALS:
            with self.subTest(code=code):
                self.node.force(refusal(status, code, f"the {code} message", headers))
                with self.assertRaises(self.expected[code]) as caught:
                    self.client.poll("0badcafe0000000000000000")
                e = caught.exception
                self.assertIsInstance(e, errors.DeliveryError)
                self.assertEqual((e.status, e.code, e.message),
                                 (status, code, f"the {code} message"))
                self.assertEqual(e.body["error"]["code"], code)
                if "Retry-After" in headers:
                    self.assertEqual(e.retry_after, 1.0)

    def test_refusals_share_the_bases_of_their_meaning(self) -> None:
        self.assertTrue(issubclass(errors.DeliveryUnauthenticated, errors.Unauthenticated))
        self.assertTrue(issubclass(errors.NotEntitled, errors.Forbidden))
        self.assertTrue(issubclass(errors.DeliveryError, errors.BourseError))

    def test_rate_limited_waits_the_pause_its_message_names(self) -> None:
        self.node.force(refusal(429, "rate_limited",
                                "this connection polls more than 5 times a second; retry in "
                                "120 ms (a poll with wait_us waits)", {"Retry-After": "1"}))
        with self.assertRaises(errors.RateLimited) as caught:
            self.client.poll()
        self.assertAlmostEqual(caught.exception.retry_after or 0, 0.12)

    def test_an_unknown_code_falls_back_on_its_status(self) -> None:
        self.node.force(refusal(401, "something_new"), refusal(418, "teapot"))
        with self.assertRaises(errors.DeliveryUnauthenticated):
            self.client.poll()
        with self.assertRaises(errors.DeliveryError) as caught:
            self.client.poll()
        self.assertEqual((caught.exception.status, caught.exception.code), (418, "teapot"))

    def test_the_fake_node_refuses_as_the_real_one(self) -> None:
        self.node.append(order(1))
        with self.assertRaises(errors.CursorMalformed):
            self.client.poll("zz")
        with self.assertRaises(errors.CursorForeign):
            self.client.poll("123456780000000000000001")
        with self.assertRaises(errors.CursorAhead):
            self.client.poll(self.node.cursor(5), wait_us=1000)
        self.node.horizon = 1
        with self.assertRaises(errors.CursorTooOld):
            self.client.poll(self.node.cursor(0))
        from bourse_client.delivery import refusal as delivery_refusal
        r = self.client.http.request("GET", "/v1/nothing")
        self.assertIsInstance(delivery_refusal(r, r.json()), errors.DeliveryNotFound)

    def test_an_unreachable_node_is_a_transport_error(self) -> None:
        self.node.close()
        with self.assertRaises(errors.TransportError):
            bc.DeliveryClient(self.node.url, timeout=2).poll()


class AuthTest(unittest.TestCase):
    def setUp(self) -> None:
        self.node = FakeDelivery(readers={"viewer": ("v-pass", None), "firm-1": ("f-pass", 1)})
        self.addCleanup(self.node.close)
        self.node.append(order(1, firm=1), order(2, firm=2), order(3, firm=1))

    def client(self, **kw) -> bc.DeliveryClient:
        c = bc.DeliveryClient(self.node.url, **kw)
        self.addCleanup(c.close)
        return c

    def test_basic_credentials_go_with_every_request(self) -> None:
        c = self.client(user="viewer", password="v-pass")
        self.assertEqual(len(c.poll().records), 3)
        c.status()
        for req in self.node.requests:
            expected = "Basic " + base64.b64encode(b"viewer:v-pass").decode()
            self.assertEqual(req.headers["authorization"], expected)

    def test_no_or_wrong_credentials_are_unauthenticated(self) -> None:
        for kw in ({}, {"user": "viewer", "password": "wrong"}, {"user": "nobody",
                                                                  "password": "x"}):
            with self.subTest(**kw):
                with self.assertRaises(errors.DeliveryUnauthenticated) as caught:
                    self.client(**kw).poll()
                self.assertEqual(caught.exception.status, 401)
                self.assertIsInstance(caught.exception, errors.Unauthenticated)

    def test_a_firms_reader_reads_its_own_and_is_refused_another_firm(self) -> None:
        c = self.client(user="firm-1", password="f-pass")
        self.assertEqual([r.raw["rec"] for r in c.poll().records], [1, 3])
        with self.assertRaises(errors.NotEntitled):
            c.poll(firm=2)

    def test_an_authorization_header_of_the_callers_choice(self) -> None:
        raw = "Basic " + base64.b64encode(b"firm-1:f-pass").decode()
        self.assertEqual(len(self.client(authorization=raw).poll().records), 2)

    def test_a_user_without_a_password_is_refused_before_sending(self) -> None:
        with self.assertRaises(ValueError):
            bc.DeliveryClient(self.node.url, user="viewer")


class TlsTest(unittest.TestCase):
    """An https:// node (as off the loopback): the client checks its certificate against the
    authority it is given, before any credential is sent."""

    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        made = fakes.make_certificates(self.dir.name)
        if made is None:
            self.skipTest("no openssl command to make a test authority")
        self.ca, cert, key = made
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.node = FakeDelivery(readers={"firm-1": ("pw", 1)}, tls=ctx)
        self.addCleanup(self.node.close)
        self.node.append(order(1))

    def test_the_venues_authority_is_trusted_and_no_other(self) -> None:
        self.assertTrue(self.node.url.startswith("https://"))
        with bc.DeliveryClient(self.node.url, user="firm-1", password="pw",
                               ca_file=self.ca) as c:
            self.assertEqual([r.raw["rec"] for r in c.poll().records], [1])
        with bc.DeliveryClient(self.node.url, user="firm-1", password="pw") as c:
            with self.assertRaises(errors.TransportError) as caught:
                c.poll()
            self.assertIn("CERTIFICATE_VERIFY_FAILED", str(caught.exception))
        self.assertEqual(len(self.node.requests), 1)  # the untrusted one never sent a request


class FollowTest(unittest.TestCase):
    def setUp(self) -> None:
        self.node = FakeDelivery()
        self.addCleanup(self.node.close)
        self.client = bc.DeliveryClient(self.node.url)
        self.addCleanup(self.client.close)
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_following_gets_every_record_once_in_cursor_order_while_they_arrive(self) -> None:
        total = 500

        def writer() -> None:
            for i in range(total):
                self.node.append(order(i))
                if i % 50 == 0:
                    time.sleep(0.01)

        t = threading.Thread(target=writer)
        t.start()
        seen = []
        follower = self.client.follow(limit=37, wait_us=200_000)
        for record in follower:
            seen.append(record.raw["rec"])
            if len(seen) == total:
                break
        t.join()
        self.assertEqual(seen, list(range(total)))
        self.assertEqual(follower.cursor, self.node.cursor(total))
        self.assertEqual(follower.restarts, 0)

    def test_a_long_poll_waits_for_the_next_record(self) -> None:
        follower = self.client.follow(wait_us=2_000_000)
        timer = threading.Timer(0.2, lambda: self.node.append(order(1)))
        timer.start()
        self.addCleanup(timer.cancel)
        first = next(iter(follower))
        self.assertEqual(first.raw["rec"], 1)

    def test_a_restarted_follower_resumes_from_the_saved_cursor(self) -> None:
        self.node.append(*[order(i) for i in range(30)])
        path = Path(self.dir.name) / "sub" / "reader.cursor"
        store = bc.CursorFile(path)
        first: List[int] = []
        for record in self.client.follow(store=store, limit=10, wait_us=0):
            first.append(record.raw["rec"])
            if len(first) == 15:
                break  # in the middle of the second batch: only the first is saved
        self.assertEqual(store.load(), self.node.cursor(10))
        self.node.append(*[order(i) for i in range(30, 40)])
        again = bc.DeliveryClient(self.node.url)
        self.addCleanup(again.close)
        second = [r.raw["rec"] for r in again.follow(store=store, limit=10, wait_us=0)
                  .until_idle()]
        self.assertEqual(second, list(range(10, 40)))
        self.assertEqual(store.load(), self.node.cursor(40))
        self.assertEqual(sorted(set(first) | set(second)), list(range(40)))
        self.assertEqual(os.listdir(path.parent), ["reader.cursor"])  # no temporary left

    def test_the_store_is_written_only_when_the_cursor_moves(self) -> None:
        class Counting(bc.CursorStore):
            def __init__(self) -> None:
                self.saved: List[str] = []

            def load(self) -> None:
                return None

            def save(self, cursor: str) -> None:
                self.saved.append(cursor)

        store = Counting()
        self.node.append(order(0))
        batches = self.client.follow(store=store, wait_us=0).batches()
        for _ in range(4):  # one batch, then three empty answers
            next(batches)
        self.node.append(order(1))
        next(batches)
        next(batches)
        self.assertEqual(store.saved, [self.node.cursor(1), self.node.cursor(2)])

    def test_a_cursor_file_is_written_whole_and_refuses_what_is_no_cursor(self) -> None:
        store = bc.CursorFile(Path(self.dir.name) / "c")
        self.assertIsNone(store.load())
        store.save("00ff")
        self.assertEqual((Path(self.dir.name) / "c").read_text(), "00ff\n")
        with self.assertRaises(ValueError):
            store.save("not hex")
        (Path(self.dir.name) / "c").write_text("garbage\n")
        with self.assertRaises(ValueError):
            store.load()
        store.clear()
        self.assertIsNone(store.load())

    def test_busy_rate_limited_and_catching_up_are_retried_after_their_pause(self) -> None:
        self.node.append(order(1))
        self.node.force(
            refusal(503, "busy", "more than 2 polls at once", {"Retry-After": "1"}),
            refusal(429, "rate_limited", "retry in 250 ms", {"Retry-After": "1"}),
            refusal(503, "catching_up", "replica", {"Retry-After": "1"}),
        )
        sleeps = Sleeps()
        told: List[Tuple[str, float]] = []
        follower = self.client.follow(
            sleep=sleeps, on_retry=lambda e, s: told.append((getattr(e, "code", ""), s)))
        self.assertEqual(next(iter(follower)).raw["rec"], 1)
        self.assertEqual(sleeps.asked, [1.0, 0.25, 1.0])
        self.assertEqual(told, [("busy", 1.0), ("rate_limited", 0.25), ("catching_up", 1.0)])
        self.assertEqual(follower.retries, 3)

    def test_cursor_ahead_is_retried_then_raised(self) -> None:
        sleeps = Sleeps()
        follower = self.client.follow(self.node.cursor(3), wait_us=1000, sleep=sleeps,
                                      cursor_ahead_retries=2)
        with self.assertRaises(errors.CursorAhead):
            follower.next_answer()
        self.assertEqual(len(sleeps.asked), 2)
        # Within what the node gets to, the same cursor is answered once it has.
        self.node.force(refusal(409, "cursor_ahead", "past what this node has applied"))
        self.node.append(*[order(i) for i in range(5)])
        follower = self.client.follow(self.node.cursor(3), sleep=sleeps)
        self.assertEqual([r.raw["rec"] for r in follower.next_answer().records], [3, 4])

    def test_a_lost_cursor_raises_or_restarts_from_a_snapshot(self) -> None:
        self.node.append(*[order(i) for i in range(5)])
        self.node.horizon = 2
        with self.assertRaises(errors.CursorTooOld):
            self.client.follow(self.node.cursor(1)).next_answer()
        foreign = "deadbeef" + "0" * 16
        with self.assertRaises(errors.CursorForeign):
            self.client.follow(foreign).next_answer()
        for start in (self.node.cursor(1), foreign):
            follower = self.client.follow(start, restart_on_lost_cursor=True)
            answer = follower.next_answer()
            self.assertEqual([r.raw["rec"] for r in answer.records], [0, 1, 2, 3, 4])
            self.assertEqual(follower.restarts, 1)

    def test_refusals_that_retrying_cannot_mend_are_raised_at_once(self) -> None:
        for code, status, cls in (("unauthenticated", 401, errors.DeliveryUnauthenticated),
                                  ("not_entitled", 403, errors.NotEntitled),
                                  ("bad_request", 400, errors.BadRequest),
                                  ("cursor_malformed", 400, errors.CursorMalformed),
                                  ("filter_not_served", 400, errors.FilterNotServed)):
            with self.subTest(code=code):
                sleeps = Sleeps()
                self.node.force(refusal(status, code))
                with self.assertRaises(cls):
                    self.client.follow(sleep=sleeps).next_answer()
                self.assertEqual(sleeps.asked, [])

    def test_a_node_that_goes_away_is_reconnected_to(self) -> None:
        self.node.append(order(1))
        follower = self.client.follow(wait_us=0)
        follower.next_answer()
        port = int(self.node.url.rsplit(":", 1)[1])
        self.node.close()
        back: List[FakeDelivery] = []

        def pause(s: float) -> None:
            pauses.append(s)
            if len(pauses) == 3:  # the node comes back after the third failure
                node = FakeDelivery(port=port)
                node.append(order(1), order(2))
                back.append(node)

        pauses: List[float] = []
        follower.sleep = pause
        answer = follower.next_answer()
        self.addCleanup(back[0].close)
        self.assertEqual([r.raw["rec"] for r in answer.records], [2])
        self.assertEqual(pauses, [0.1, 0.2, 0.4])
        back[0].close()
        with self.assertRaises(errors.TransportError):
            self.client.follow(reconnect=False).next_answer()


if __name__ == "__main__":
    unittest.main()
