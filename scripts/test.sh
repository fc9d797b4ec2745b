#!/usr/bin/env bash
# The test command of bourse (README.md): everything CI checks, in one run.
#   scripts/test.sh           full run (about 30-45 minutes on 2 cores from nothing, most of it
#                             compiling; the tests build with Cargo.toml's `ci` profile, release
#                             without LTO, into target/ci/)
# Environment knobs:
#   BOURSE_DIFF_COMMANDS      random commands in the engine's differential test (default 1,000,000)
set -euo pipefail
cd "$(dirname "$0")/.."
export BOURSE_DIFF_COMMANDS="${BOURSE_DIFF_COMMANDS:-1000000}"

step() { printf '\n== %s\n' "$*"; }

step "real peers the tests talk to (scripts/install-test-tools.sh)"
bash scripts/install-test-tools.sh

if cargo fmt --version >/dev/null 2>&1; then
  step "formatting (cargo fmt --check)"
  cargo fmt --all -- --check
fi

if [ -x scripts/gen-sbe.sh ]; then
  step "generated SBE codecs match the schemas (scripts/gen-sbe.sh --check)"
  scripts/gen-sbe.sh --check
fi

step "ARCHITECTURE.md names only files, items and dependencies that exist (scripts/check-architecture.py)"
python3 scripts/check-architecture.py

step "lints (cargo clippy, [workspace.lints] in Cargo.toml; warnings are errors)"
if ! cargo clippy --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
  rustup component add clippy
fi
cargo clippy --workspace --all-targets --profile ci -- -D warnings

step "unit, property, differential and conformance tests (the ci profile: release without LTO)"
cargo test --workspace --profile ci
bin="${CARGO_TARGET_DIR:-target}/ci"

step "the batch interface replays the example trading day"
"$bin"/bourse engine run --input examples/trading-day.jsonl --output /tmp/bourse-events.jsonl --summary
grep -q '"event":"trade"' /tmp/bourse-events.jsonl

step "the main job runs end to end (bourse demo on the replicated venue, 5 seconds)"
"$bin"/bourse demo --seconds 5 --rate 2000 --accounts 1000 --dashboard-port 0

step "the Python client (clients/python): unit tests on fake services, then against bourse demo"
BOURSE_BIN="$(cd "$bin" && pwd)/bourse" python3 -m unittest discover -s clients/python/tests

step "benchmarks run (smoke sizes; figures are in BENCHMARKS.md)"
"$bin"/bourse bench engine --ops 20000 --warmup 2000 --rates 100000 --open-loop-seconds 1 --json >/dev/null
"$bin"/bourse bench capacity --accounts 10000 --positions-per-account 3 --instruments 10 --orders 10000 --json >/dev/null
"$bin"/bourse bench journal --records 2000 --json >/dev/null
"$bin"/bourse bench t2t --packets 2000 --stage-packets 500 --curve-packets 500 --json >/dev/null
"$bin"/bourse bench delivery --commands 20000 --readers 10 --seconds 0.5 --rate 20000 --json >/dev/null
"$bin"/bourse bench admin --accounts 20000 --rate 500 --warmup-s 1 --no-baseline --json >/dev/null
"$bin"/bourse bench clearing --accounts 10000 --positions-per-account 3 --instruments 10 --runs 2 --json >/dev/null

echo
echo "scripts/test.sh: all checks passed"
