"""The admin and clearing clients against fake services: requests as docs/admin.md and
docs/clearing.md describe them, credentials, and every refusal as its exception."""

from __future__ import annotations

import json
import unittest

import fakes  # noqa: F401  (puts ../src on sys.path)
from fakes import FakeAdmin, FakeClearing, json_reply, refusal

import bourse_client as bc
from bourse_client import errors


class AdminTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = FakeAdmin()
        self.addCleanup(self.api.close)
        self.admin = bc.AdminClient(self.api.url, password="secret")
        self.addCleanup(self.admin.close)

    def test_an_account_added_is_read_back(self) -> None:
        result = self.admin.add_account(900001, 3, cash=1_000_000_000, markets=["equities"])
        self.assertEqual((result.outcome, result.retried), ("applied", False))
        req = self.api.requests[-1]
        self.assertEqual(json.loads(req.body), {
            "action": "add_account", "account": 900001, "firm": 3, "cash": 1_000_000_000,
            "may_short": False, "markets": ["equities"]})
        self.assertEqual(req.headers["x-request-id"], result.request_id)
        state = self.admin.account(900001)["markets"][0]["state"]
        self.assertEqual(state, {"firm": 3, "cash": 1_000_000_000})

    def test_every_action_sends_the_documented_json(self) -> None:
        a = self.admin
        a.halt(instrument=1)
        a.resume(market="fx")
        a.set_phase("paused")
        a.kill(firm=1)
        a.release(account=7)
        a.deposit("fx", 7, 50)
        a.withdraw("fx", 7, 5)
        a.set_collateral("fx", 7, 9)
        a.margin_call("futures", 7, 0)
        a.end_of_day()
        a.end_of_day(market="fx")
        a.add_instrument("fx", {"instrument": 9, "symbol": "X"})
        self.assertEqual(self.api.applied, [
            {"action": "set_phase", "phase": "halted", "instrument": 1},
            {"action": "set_phase", "phase": "open", "market": "fx"},
            {"action": "set_phase", "phase": "paused"},
            {"action": "kill_switch", "engaged": True, "firm": 1},
            {"action": "kill_switch", "engaged": False, "account": 7},
            {"action": "deposit", "market": "fx", "account": 7, "amount": 50},
            {"action": "withdraw", "market": "fx", "account": 7, "amount": 5},
            {"action": "set_collateral", "market": "fx", "account": 7, "amount": 9},
            {"action": "margin_call", "market": "futures", "account": 7, "amount": 0},
            {"action": "end_of_day"},
            {"action": "end_of_day", "market": "fx"},
            {"action": "add_instrument", "market": "fx",
             "instrument": {"instrument": 9, "symbol": "X"}},
        ])
        ids = [r.headers["x-request-id"] for r in self.api.requests]
        self.assertEqual(len(set(ids)), len(ids))  # a new id per action

    def test_a_request_id_sent_again_applies_once(self) -> None:
        first = self.admin.kill(firm=2, request_id="kill-2")
        again = self.admin.kill(firm=2, request_id="kill-2")
        self.assertEqual((first.retried, again.retried), (False, True))
        self.assertEqual(len(self.api.applied), 1)
        with self.assertRaises(errors.AdminConflict) as caught:
            self.admin.kill(firm=3, request_id="kill-2")
        self.assertEqual((caught.exception.status, caught.exception.code), (409, "conflict"))

    def test_bulk_additions_go_as_ndjson(self) -> None:
        rows = [{"account": 10 + i, "firm": 1, "cash": 5} for i in range(3)]
        result = self.admin.add_accounts(rows, request_id="bulk-1")
        self.assertEqual(result.raw["lines"], 3)
        req = self.api.requests[-1]
        self.assertEqual(req.path, "/v1/accounts/bulk")
        self.assertEqual([json.loads(x) for x in req.body.decode().splitlines()], rows)

    def test_queries(self) -> None:
        self.assertEqual(self.admin.instruments()["outcome"], "ok")
        self.assertEqual(self.admin.book(1)["markets"][0]["state"]["orders"], [])
        self.assertTrue(self.admin.healthy())

    def test_every_refusal_is_its_exception(self) -> None:
        with self.assertRaises(errors.AdminInvalid) as caught:
            self.admin.kill_switch(engaged=True)
        self.assertIn("exactly one", caught.exception.message)
        with self.assertRaises(errors.AdminRejected) as rejected:
            self.admin.withdraw("fx", 7, 10**10)
        self.assertEqual(rejected.exception.body["markets"][0]["reason"],
                         "insufficient_free_cash")
        self.assertEqual(rejected.exception.status, 422)
        wrong = bc.AdminClient(self.api.url, password="wrong")
        self.addCleanup(wrong.close)
        with self.assertRaises(errors.AdminUnauthenticated) as un:
            wrong.instruments()
        self.assertIsInstance(un.exception, errors.Unauthenticated)
        nobody = bc.AdminClient(self.api.url)
        self.addCleanup(nobody.close)
        with self.assertRaises(errors.AdminUnauthenticated):
            nobody.halt()
        viewer = bc.AdminClient(self.api.url, user="watcher", password="look")
        self.addCleanup(viewer.close)
        self.assertEqual(viewer.instruments()["outcome"], "ok")  # a viewer queries
        with self.assertRaises(errors.AdminForbidden):
            viewer.halt()  # but does not act
        self.api.force(json_reply(503, {"outcome": "unavailable",
                                        "error": "core fx did not answer within 10 s"}))
        with self.assertRaises(errors.AdminUnavailable):
            self.admin.end_of_day()


class ClearingTest(unittest.TestCase):
    def setUp(self) -> None:
        self.node = FakeClearing()
        self.addCleanup(self.node.close)
        self.op = bc.ClearingClient(self.node.url, user="op", password="pw")
        self.addCleanup(self.op.close)

    def test_accounts_firms_and_runs(self) -> None:
        self.assertEqual(self.op.account(3)["firm"], 1)
        self.assertEqual([a["account"] for a in self.op.firm_accounts(1, page=4)],
                         list(range(1, 10)))
        self.assertEqual(self.node.requests[-1].query, {"after": "8", "limit": "4"})
        report = self.op.run("intermediate", last_trades=10)
        self.assertEqual(json.loads(self.node.requests[-1].body),
                         {"kind": "intermediate", "last_trades": 10})
        self.assertEqual(self.op.report(report["run_id"]), report)
        self.assertEqual(self.op.runs()["runs"], [{"run_id": 1}])
        self.assertEqual(self.op.settlements("2026-12-01", firm=1)["date"], "2026-12-01")
        self.assertEqual(self.op.status()["standby"], False)

    def test_every_refusal_is_its_exception(self) -> None:
        cases = [
            (lambda: self.op.account(99), errors.UnknownAccount, 404),
            (lambda: self.op.firm(5), errors.UnknownFirm, 404),
            (lambda: self.op.report(7), errors.UnknownRun, 404),
            (lambda: self.op.run(), errors.RunRefused, 409),
            (lambda: self.op.settlements("tomorrow"), errors.ClearingBadRequest, 400),
            (lambda: self.op.get("/v1/nothing"), errors.ClearingNotFound, 404),
        ]
        for call, cls, status in cases:
            with self.subTest(cls=cls.__name__):
                with self.assertRaises(cls) as caught:
                    call()
                self.assertEqual(caught.exception.status, status)
        for code, cls in (("too_many", errors.TooMany), ("no_report", errors.NoReport),
                          ("run_failed", errors.RunFailed)):
            self.node.force(refusal(400 if code == "too_many" else 500 if code == "run_failed"
                                    else 404, code))
            with self.assertRaises(cls):
                self.op.get("/v1/runs/1")

    def test_credentials_and_a_firms_reader(self) -> None:
        firm = bc.ClearingClient(self.node.url, user="f1", password="pw1")
        self.addCleanup(firm.close)
        self.assertEqual(firm.account(1)["firm"], 1)
        for call in (lambda: firm.account(11), lambda: firm.account(99),
                     lambda: firm.run("intermediate"), lambda: firm.report(1)):
            with self.assertRaises(errors.ClearingForbidden):
                call()
        anonymous = bc.ClearingClient(self.node.url)
        self.addCleanup(anonymous.close)
        with self.assertRaises(errors.ClearingUnauthenticated) as caught:
            anonymous.account(1)
        self.assertIsInstance(caught.exception, errors.Unauthenticated)
        self.assertEqual(anonymous.status()["cut"], [1])  # needs no credentials


if __name__ == "__main__":
    unittest.main()
