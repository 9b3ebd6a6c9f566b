#!/usr/bin/env bash
# End-to-end tests of `kiln serve` on SmolLM2-135M (CPU): the official `openai` Python client (test_openai.py),
# the hostile-input suite (test_hostile.py), speculative decoding against plain decoding (test_draft.py, on a
# second server started with a random-weight DFlash drafter) and graceful shutdown (test_shutdown.py). Installs `openai` into
# .test-assets/pydeps (once), builds the kiln binary with the test profile (sharing `cargo test`'s artifacts),
# starts the server on a free port, and always stops it.
set -euo pipefail
cd "$(dirname "$0")/../.."
ASSETS="${KILN_TEST_ASSETS:-.test-assets}"
MODEL="$ASSETS/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$MODEL" ]; then
    echo "server-tests: $MODEL is missing; run tools/fetch-test-assets.sh" >&2
    exit 1
fi
PYDEPS="$ASSETS/pydeps"
if ! PYTHONPATH="$PYDEPS" python3 -c "import openai, httpx" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$PYDEPS" "openai>=1.40,<3"
fi
export PYTHONPATH="$PWD/$PYDEPS"

cargo build --quiet --locked --profile test -p kiln-cli
BIN="$PWD/target/debug/kiln"
LOG="$(mktemp)"
DLOG="$(mktemp)"
DRAFT_DIR="$(mktemp -d)"
KEY="server-test-key"
READ_TIMEOUT=2
PID=""
DPID=""
cleanup() {
    for p in "$PID" "$DPID"; do
        if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
            kill "$p" 2>/dev/null || true
            wait "$p" 2>/dev/null || true
        fi
    done
    rm -f "$LOG" "$DLOG"
    rm -rf "$DRAFT_DIR"
}
trap cleanup EXIT

# 8 slots of 256 positions; a small queue so the overflow test can fill it.
"$BIN" serve -m "$MODEL" --port 0 -c 2048 --parallel 8 --queue 8 --api-key "$KEY" \
    --read-timeout "$READ_TIMEOUT" --max-body 1048576 --shutdown-grace 30 >"$LOG" 2>&1 &
PID=$!
URL=""
for _ in $(seq 1 600); do
    URL="$(sed -n 's/.*ready on \(http:[^ ]*\).*/\1/p' "$LOG" | head -n1)"
    [ -n "$URL" ] && break
    if ! kill -0 "$PID" 2>/dev/null; then
        cat "$LOG" >&2
        echo "server-tests: kiln serve exited during start-up" >&2
        exit 1
    fi
    sleep 0.1
done
if [ -z "$URL" ]; then
    cat "$LOG" >&2
    echo "server-tests: kiln serve did not become ready within 60 s" >&2
    exit 1
fi
echo "server-tests: kiln serve ready at $URL"
export KILN_BASE_URL="$URL" KILN_API_KEY="$KEY" KILN_READ_TIMEOUT="$READ_TIMEOUT" KILN_SERVER_PID="$PID"
status=0
python3 tools/server-tests/test_openai.py || status=1
python3 tools/server-tests/test_hostile.py || status=1

# The speculative server: same model and slot size (4 slots of 256 positions), a random drafter.
python3 tools/server-tests/write_drafter.py "$DRAFT_DIR" --block 8
"$BIN" serve -m "$MODEL" --port 0 -c 1024 --parallel 4 --api-key "$KEY" --draft "$DRAFT_DIR" >"$DLOG" 2>&1 &
DPID=$!
DURL=""
for _ in $(seq 1 600); do
    DURL="$(sed -n 's/.*ready on \(http:[^ ]*\).*/\1/p' "$DLOG" | head -n1)"
    [ -n "$DURL" ] && break
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$DURL" ]; then
    cat "$DLOG" >&2
    echo "server-tests: kiln serve --draft did not become ready" >&2
    status=1
else
    KILN_DRAFT_URL="$DURL" python3 tools/server-tests/test_draft.py || { status=1; cat "$DLOG" >&2; }
fi
kill "$DPID" 2>/dev/null || true
wait "$DPID" 2>/dev/null || true
DPID=""
python3 tools/server-tests/test_shutdown.py || status=1
# The server must exit 0 on SIGTERM (sent by test_shutdown.py).
for _ in $(seq 1 400); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$PID" 2>/dev/null; then
    echo "server-tests: kiln serve did not exit after SIGTERM" >&2
    status=1
else
    rc=0
    wait "$PID" || rc=$?
    PID=""
    if [ "$rc" -ne 0 ]; then
        echo "server-tests: kiln serve exited with status $rc after SIGTERM" >&2
        status=1
    fi
fi
if [ "$status" -ne 0 ]; then
    echo "--- server log ---" >&2
    cat "$LOG" >&2
fi
exit "$status"
