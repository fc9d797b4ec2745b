"""The in-tree build backend writes a wheel pip can trust: every module and py.typed, a
RECORD whose hashes match, the same version as pyproject.toml and the package."""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

import fakes  # noqa: F401  (puts ../src on sys.path)

import bourse_client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build_backend"))
import bourse_build  # noqa: E402


class BuildTest(unittest.TestCase):
    def test_the_wheel_holds_the_package_and_a_true_record(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            name = bourse_build.build_wheel(d)
            self.assertEqual(name, "bourse_client-0.1.0-py3-none-any.whl")
            with zipfile.ZipFile(Path(d) / name) as z:
                names = set(z.namelist())
                modules = {f"bourse_client/{p.name}"
                           for p in (ROOT / "src" / "bourse_client").glob("*.py")}
                self.assertLessEqual(modules | {"bourse_client/py.typed"}, names)
                record = z.read("bourse_client-0.1.0.dist-info/RECORD").decode().splitlines()
                listed = set()
                for line in record:
                    path, digest, size = line.rsplit(",", 2)
                    listed.add(path)
                    if digest:
                        data = z.read(path)
                        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
                        self.assertEqual(digest, "sha256=" + h.rstrip(b"=").decode(), path)
                        self.assertEqual(int(size), len(data))
                self.assertEqual(listed, names)
                entry = z.read("bourse_client-0.1.0.dist-info/entry_points.txt").decode()
                self.assertIn("bourse-client = bourse_client.cli:main", entry)

    def test_one_version_everywhere(self) -> None:
        text = (ROOT / "pyproject.toml").read_text()
        m = re.search(r'^version = "([^"]+)"', text, re.M)
        assert m is not None
        self.assertEqual(m.group(1), bourse_build.VERSION)
        self.assertEqual(bourse_client.__version__, bourse_build.VERSION)


if __name__ == "__main__":
    unittest.main()
