"""The package's own PEP 517 build backend, in the standard library only.

``pip install ./clients/python`` needs nothing from a package index: no setuptools, no
wheel (``pyproject.toml``: ``requires = []``, ``backend-path = ["build_backend"]``). It builds
a pure-Python wheel of ``src/bourse_client`` (every ``.py`` file and ``py.typed``) with the
metadata below, an sdist of the project directory, and an editable wheel (PEP 660: a
``.pth`` file naming ``src``) for ``pip install -e``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
NAME = "bourse_client"
DIST = "bourse_client"
VERSION = "0.1.0"
TAG = "py3-none-any"
SCRIPTS = {"bourse-client": "bourse_client.cli:main"}


def _metadata() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [
        "Metadata-Version: 2.1",
        "Name: bourse-client",
        f"Version: {VERSION}",
        "Summary: Python client of the bourse venue: the delivery node (order states by "
        "cursor), the admin API and clearing data",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Typing :: Typed",
        "Description-Content-Type: text/markdown",
        "",
        readme,
    ]
    return "\n".join(lines)


def _wheel_file() -> str:
    return "Wheel-Version: 1.0\nGenerator: bourse_build\nRoot-Is-Purelib: true\n" \
           f"Tag: {TAG}\n"


def _entry_points() -> str:
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in SCRIPTS.items())


def _package_files() -> List[Tuple[str, Path]]:
    src = ROOT / "src" / NAME
    files = []
    for path in sorted(src.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix == ".py" or path.name == "py.typed":
            files.append((f"{NAME}/{path.relative_to(src).as_posix()}", path))
    return files


def _digest(data: bytes) -> str:
    h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={h}"


def _write_wheel(directory: str, members: List[Tuple[str, bytes]]) -> str:
    dist_info = f"{DIST}-{VERSION}.dist-info"
    members = members + [
        (f"{dist_info}/METADATA", _metadata().encode("utf-8")),
        (f"{dist_info}/WHEEL", _wheel_file().encode()),
        (f"{dist_info}/entry_points.txt", _entry_points().encode()),
    ]
    record = [f"{name},{_digest(data)},{len(data)}" for name, data in members]
    record.append(f"{dist_info}/RECORD,,")
    members.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    filename = f"{DIST}-{VERSION}-{TAG}.whl"
    with zipfile.ZipFile(os.path.join(directory, filename), "w",
                         compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return filename


# ----- PEP 517 -----


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, str]] = None
                                 ) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, str]] = None
                                 ) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, str]] = None
                                    ) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, str]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory,
                        [(name, path.read_bytes()) for name, path in _package_files()])


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, str]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    pth = (str(ROOT / "src") + "\n").encode()
    return _write_wheel(wheel_directory, [(f"__editable__.{DIST}.pth", pth)])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, str]] = None
                ) -> str:
    base = f"{DIST}-{VERSION}"
    filename = f"{base}.tar.gz"
    keep = ["pyproject.toml", "README.md", "build_backend", "src", "tests"]
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz",
                      format=tarfile.PAX_FORMAT) as tar:
        for top in keep:
            for path in sorted([ROOT / top] + sorted((ROOT / top).rglob("*"))
                               if (ROOT / top).is_dir() else [ROOT / top]):
                if "__pycache__" in path.parts or path.is_dir():
                    continue
                tar.add(str(path), arcname=f"{base}/{path.relative_to(ROOT).as_posix()}")
        pkg_info = _metadata().encode("utf-8")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return filename
