#!/usr/bin/env python3
"""Checks that ARCHITECTURE.md names only things that exist (run by scripts/test.sh).

What it checks:
  1. Every file path it names (`crates/x/src/y.rs`, `gateway/src/router.rs`, `docs/admin.md`,
     `scripts/netbed.sh`, a bare `net.rs` in backticks, ...) exists. A path is looked up from
     the repository root, from `crates/`, and from the crate the section or table row is about.
  2. Every `file.rs::Item::item` names items defined in that very file (a method defined in a
     submodule file is a stale reference: name that file).
  3. Every backticked constant (`LOG_TAIL_ENTRIES_MAX`) is defined under crates/.
  4. Every backticked `Type::item` after a file in the same table row or paragraph is defined
     in that file; elsewhere, `Type::item` is defined in a file that defines `Type`, in the
     crate the section is about or anywhere under crates/.
  5. The table in "Dependencies between crates" lists exactly each crate's `bourse-*`
     [dependencies] in its Cargo.toml, and the crates that use it.
Fails listing every reference it could not find.

Usage: scripts/check-architecture.py [ARCHITECTURE.md]
"""
import functools
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "ARCHITECTURE.md")
CRATES = sorted(d for d in os.listdir(os.path.join(ROOT, "crates"))
                if os.path.isfile(os.path.join(ROOT, "crates", d, "Cargo.toml")))
# Names of files a running venue writes (not files in the tree).
RUNTIME_DIRS = ("store_dir", "state_dir", "node-<id>")
EXTS = ("rs", "md", "toml", "sh", "py", "xml", "yaml", "yml", "jsonl", "json")

_file_cache = {}


def read(path):
    if path not in _file_cache:
        with open(path, encoding="utf-8", errors="replace") as f:
            _file_cache[path] = f.read()
    return _file_cache[path]


def rs_files(base):
    out = []
    for d, _, files in os.walk(base):
        out += [os.path.join(d, f) for f in files if f.endswith(".rs")]
    return sorted(out)


ALL_RS = [f for c in CRATES for f in rs_files(os.path.join(ROOT, "crates", c))]


DEF_RES = [
    re.compile(r"\b(?:fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)\s+(\w+)"),
    re.compile(r"^\s*(?:pub(?:\([\w:]+\))?\s+)?(\w+)\s*(?::(?!:)|[,({])", re.M),  # field or variant
    re.compile(r"^\s*(\w+),?\s*$", re.M),  # unit variant
    re.compile(r"\bimpl\b(?:<[^>]*>)?[^\n{]*?\bfor\s+(\w+)"),  # a type with a trait impl
    re.compile(r"\bimpl\b(?:<[^>]*>)?\s+(\w+)"),
]
USE_RE = re.compile(r"\bpub\s+use\b([^;]*);")


@functools.lru_cache(maxsize=None)
def names_in(text):
    """The names Rust source `text` defines (items, methods, variants, fields, impl'd types)."""
    out = set()
    for r in DEF_RES:
        out.update(r.findall(text))
    for u in USE_RE.findall(text):  # re-exports
        out.update(re.findall(r"\w+", u))
    return frozenset(out)


def defines(text, name):
    return name in names_in(text)


def resolve_path(tok, crates_ctx):
    """The file or directory `tok` names, or None."""
    tok = tok.rstrip("/")
    cands = [tok, os.path.join("crates", tok)]
    for c in crates_ctx:
        cands += [os.path.join("crates", c, tok), os.path.join("crates", c, "src", tok)]
    for c in cands:
        p = os.path.join(ROOT, c)
        if os.path.exists(p):
            return p
    if "/" not in tok:  # a bare file name: one in the context's crates, else unique anywhere
        for c in crates_ctx:
            hits = [f for f in rs_files(os.path.join(ROOT, "crates", c)) if os.path.basename(f) == tok]
            if len(hits) == 1:
                return hits[0]
        hits = [f for f in ALL_RS if os.path.basename(f) == tok]
        if len(hits) == 1:
            return hits[0]
    return None


def crate_of(path):
    rel = os.path.relpath(path, ROOT).split(os.sep)
    return rel[1] if rel[0] == "crates" and len(rel) > 1 else None


def check_items(path, items):
    """Each of `items` (Type::method chain) is defined in the file `path`; returns the missing."""
    text = read(path)
    return [i for i in items if not defines(text, i)]


def find_anywhere(items, crates_ctx):
    """`A::b`: some file (in the context crates, else anywhere) defines both A and b."""
    bases = [f for c in crates_ctx for f in rs_files(os.path.join(ROOT, "crates", c))] or ALL_RS
    for files in (bases, ALL_RS):
        for f in files:
            t = read(f)
            if all(defines(t, i) for i in items):
                return True
    return False


def blocks(text):
    """(section heading, block text, first line number): paragraphs, list items, table rows."""
    section, buf, start = "", [], 0
    in_code = False
    for no, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("#"):
            if buf:
                yield section, " ".join(buf), start
            section, buf = line, []
            continue
        new_block = not line.strip() or line.startswith("|") or line.startswith("- ")
        if new_block and buf:
            yield section, " ".join(buf), start
            buf = []
        if line.strip():
            if not buf:
                start = no
            buf.append(line)
    if buf:
        yield section, " ".join(buf), start


PATH_RE = re.compile(r"(?<![\w./<>-])((?:[\w.<>-]+/)+[\w.-]+\.(?:%s)|(?:[\w.<>-]+/)+)(?![\w/])" % "|".join(EXTS))
TICK_RE = re.compile(r"`([^`]+)`")
FILEREF_RE = re.compile(r"^((?:[\w-]+/)*[\w-]+\.rs)((?:::\w+)+)?(?:\(\))?$")
CONST_RE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
ITEMREF_RE = re.compile(r"^([A-Z]\w*|[a-z_]\w*)((?:::\w+)+)(?:\(\))?$")


def main():
    text = read(DOC)
    problems = []
    checked = {"paths": 0, "items": 0}

    doc = os.path.basename(DOC)

    def bad(line, what):
        p = f"{doc}:{line}: {what}"
        if p not in problems:
            problems.append(p)

    for section, block, line in blocks(text):
        m = re.search(r"`crates/([\w-]+)`", section)
        sec_crates = [m.group(1)] if m and m.group(1) in CRATES else []
        row_crates = list(sec_crates)
        last_file = None
        # file paths anywhere in the block, in backticks or not
        for tok in PATH_RE.findall(block):
            if "<" in tok or tok.split("/")[0] in RUNTIME_DIRS or tok.startswith(("http", "../")):
                continue
            if tok.startswith(("crates/", "docs/", "scripts/", "deploy/", "schemas/", "examples/", ".ci/")) or tok.endswith(".rs") or "/src/" in tok or "/tests/" in tok:
                checked["paths"] += 1
                if resolve_path(tok, row_crates) is None:
                    bad(line, f"path `{tok}` does not exist")
        # backticked references, in order, so that `Type::fn` after a file refers to that file
        for tok in TICK_RE.findall(block):
            tok = tok.strip()
            fm = FILEREF_RE.match(tok)
            if fm:
                fpath = resolve_path(fm.group(1), row_crates)
                checked["paths"] += 1
                if fpath is None:
                    bad(line, f"path `{fm.group(1)}` does not exist")
                    last_file = None
                    continue
                last_file = fpath
                c = crate_of(fpath)
                if c and c not in row_crates:
                    row_crates.insert(0, c)
                if fm.group(2):
                    items = fm.group(2).strip(":").split("::")
                    checked["items"] += 1
                    missing = check_items(fpath, items)
                    if missing:
                        bad(line, f"`{tok}`: {', '.join(missing)} not defined in {os.path.relpath(fpath, ROOT)}")
                continue
            if CONST_RE.match(tok):  # a constant: defined somewhere under crates/
                checked["items"] += 1
                if not any(defines(read(f), tok) for f in ALL_RS):
                    bad(line, f"`{tok}`: no constant of that name under crates/")
                continue
            im = ITEMREF_RE.match(tok)
            if not im or tok.startswith(("std::", "tokio::", "openraft::", "crossbeam")):
                continue
            first = im.group(1)
            items = [first] + im.group(2).strip(":").split("::")
            crates_ctx = list(row_crates)
            if first.startswith("bourse_"):
                c = first[len("bourse_"):]
                if c not in CRATES:
                    checked["items"] += 1
                    bad(line, f"`{tok}`: no crate {c}")
                    continue
                crates_ctx, items = [c], items[1:]
                # a module path: bourse_x::module::Item
                while len(items) > 1 and items[0][0].islower():
                    sub = resolve_path(items[0] + ".rs", [c]) or resolve_path(items[0] + "/mod.rs", [c])
                    if sub is None:
                        break
                    items = items[1:]
            elif first[0].islower() and resolve_path(first + ".rs", row_crates):
                # module::Item, as `transport::dial`
                fpath = resolve_path(first + ".rs", row_crates)
                checked["items"] += 1
                missing = check_items(fpath, items[1:])
                if missing:
                    bad(line, f"`{tok}`: {', '.join(missing)} not defined in {os.path.relpath(fpath, ROOT)}")
                continue
            elif first[0].islower():
                continue  # a config key or a Rust path this checker does not know
            checked["items"] += 1
            if last_file and block.startswith("|") and check_items(last_file, items[:1]) == []:
                missing = check_items(last_file, items)
                if missing:
                    bad(line, f"`{tok}`: {', '.join(missing)} not defined in {os.path.relpath(last_file, ROOT)} (the row's file)")
                continue
            if not find_anywhere(items, crates_ctx):
                bad(line, f"`{tok}`: no file defines {' and '.join(items)}")

    problems += check_dependencies(text)
    if problems:
        print(f"check-architecture: {len(problems)} stale reference(s) in {os.path.relpath(DOC, ROOT)}:")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    print(f"check-architecture: {checked['paths']} paths, {checked['items']} item references and "
          f"the dependency table of {len(CRATES)} crates checked; all exist")


def cargo_deps(crate):
    toml = read(os.path.join(ROOT, "crates", crate, "Cargo.toml"))
    m = re.search(r"^\[dependencies\]\n(.*?)(?=^\[|\Z)", toml, re.S | re.M)
    deps = re.findall(r"^bourse-([\w-]+)\s*=", m.group(1) if m else "", re.M)
    return sorted(set(deps))


def check_dependencies(text):
    """The "Dependencies between crates" table: `| crate | depends on (ours) | ... |`."""
    m = re.search(r"^## Dependencies between crates\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return ["ARCHITECTURE.md: no section \"Dependencies between crates\""]
    rows = {}
    for line in m.group(1).split("\n"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2:
            cm = re.fullmatch(r"`([\w-]+)`", cells[0])
            if cm:
                rows[cm.group(1)] = (sorted(re.findall(r"`([\w-]+)`", cells[1])),
                                     sorted(re.findall(r"`([\w-]+)`", cells[2])) if len(cells) > 2 else [])
    out = []
    names = {c: re.search(r'^name\s*=\s*"bourse-([\w-]+)"', read(os.path.join(ROOT, "crates", c, "Cargo.toml")), re.M).group(1) for c in CRATES}
    by_name = {v: k for k, v in names.items()}
    uses = {c: sorted(by_name.get(d, d) for d in cargo_deps(c)) for c in CRATES}
    for c in CRATES:
        want = uses[c]
        users = sorted(d for d in CRATES if c in uses[d])
        if c not in rows:
            out.append(f"ARCHITECTURE.md: dependency table has no row for `{c}` (Cargo.toml: {', '.join(want) or 'none'})")
            continue
        if rows[c][0] != want:
            out.append(f"ARCHITECTURE.md: dependency row `{c}` says it uses {', '.join(rows[c][0]) or 'none'}; "
                       f"crates/{c}/Cargo.toml says {', '.join(want) or 'none'}")
        if rows[c][1] != users:
            out.append(f"ARCHITECTURE.md: dependency row `{c}` says it is used by {', '.join(rows[c][1]) or 'none'}; "
                       f"the Cargo.toml files say {', '.join(users) or 'none'}")
    for c in rows:
        if c not in CRATES:
            out.append(f"ARCHITECTURE.md: dependency table names `{c}`, not a crate")
    return out


if __name__ == "__main__":
    main()
