#!/usr/bin/env bash
# The test command: fetches the test assets (PyPI/npm, cached in .test-assets/), checks formatting and lints
# (with and without the cuda feature), compiles every CUDA kernel with NVRTC (no GPU needed), runs every Rust test,
# then the server's end-to-end suites with the official openai client. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
# Incremental caches are of no use to a one-shot run and double the target directory's size.
export CARGO_INCREMENTAL=0
bash tools/fetch-test-assets.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy -p kiln-cli -p kiln-engine --features cuda --all-targets --locked -- -D warnings
bash tools/check-kernels.sh
cargo test --workspace --locked
bash tools/server-tests/run.sh
