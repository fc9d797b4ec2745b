"""``python -m bourse_client``: JSON lines out, the cursor file, exit statuses."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import List, Tuple
from unittest import mock

import fakes
from fakes import FakeAdmin, FakeDelivery, order

from bourse_client import cli


def run(argv: List[str], env: dict) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


class CliTest(unittest.TestCase):
    def setUp(self) -> None:
        self.node = FakeDelivery(readers={"firm-1": ("pw", 1)})
        self.addCleanup(self.node.close)
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def test_follow_prints_json_lines_and_resumes_from_its_cursor_file(self) -> None:
        self.node.append(*[order(i) for i in range(6)])
        cursor = str(Path(self.dir.name) / "c")
        base = ["follow", "--url", self.node.url, "--user", "firm-1", "--cursor-file", cursor,
                "--wait-us", "0", "--limit", "4", "--until-idle"]
        code, out, err = run(base, {"BOURSE_DELIVERY_PASSWORD": "pw"})
        self.assertEqual(code, 0, err)
        self.assertEqual([json.loads(x) for x in out.splitlines()],
                         [order(i) for i in range(6)])
        self.assertIn("6 records", err)
        self.node.append(order(6))
        code, out, _ = run(base, {"BOURSE_DELIVERY_PASSWORD": "pw"})
        self.assertEqual([json.loads(x)["rec"] for x in out.splitlines()], [6])

    def test_count_stops_inside_a_batch_and_names_the_cursor_to_continue(self) -> None:
        self.node.append(*[order(i) for i in range(6)])
        code, out, err = run(["follow", "--url", self.node.url, "--user", "firm-1",
                              "--count", "3", "--limit", "2", "--wait-us", "0"],
                             {"BOURSE_DELIVERY_PASSWORD": "pw"})
        self.assertEqual(code, 0)
        self.assertEqual(len(out.splitlines()), 3)
        self.assertIn(f"continue with --cursor {self.node.cursor(2)}", err)

    def test_a_refusal_exits_1_with_its_code(self) -> None:
        code, _, err = run(["follow", "--url", self.node.url, "--user", "firm-1",
                            "--count", "1"], {"BOURSE_DELIVERY_PASSWORD": "wrong"})
        self.assertEqual(code, 1)
        self.assertIn("401 unauthenticated", err)
        code, _, err = run(["follow", "--url", self.node.url, "--user", "firm-1",
                            "--firm", "2", "--count", "1"], {"BOURSE_DELIVERY_PASSWORD": "pw"})
        self.assertEqual(code, 1)
        self.assertIn("403 not_entitled", err)

    def test_admin_commands(self) -> None:
        api = FakeAdmin()
        self.addCleanup(api.close)
        env = {"BOURSE_ADMIN_PASSWORD": "secret"}
        code, out, err = run(["admin", "--url", api.url, "add-account", "--account", "5",
                              "--firm", "2", "--cash", "100"], env)
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["outcome"], "applied")
        code, out, _ = run(["admin", "--url", api.url, "account", "5"], env)
        self.assertEqual(json.loads(out)["markets"][0]["state"], {"firm": 2, "cash": 100})
        code, _, err = run(["admin", "--url", api.url, "kill"], env)
        self.assertEqual(code, 1)
        self.assertIn("400 invalid", err)

    def test_python_m_bourse_client_runs(self) -> None:
        self.node.append(order(1))
        env = dict(os.environ, BOURSE_DELIVERY_PASSWORD="pw",
                   PYTHONPATH=fakes.SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run(
            [sys.executable, "-m", "bourse_client", "follow", "--url", self.node.url,
             "--user", "firm-1", "--count", "1"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["rec"], 1)


if __name__ == "__main__":
    unittest.main()
