"""Shared helpers of the server tests: the server's address and key from the environment, a tiny test runner."""
import json
import os
import sys
import time
import traceback
import urllib.request

BASE = os.environ["KILN_BASE_URL"]  # e.g. http://127.0.0.1:8080
KEY = os.environ.get("KILN_API_KEY", "")
HOST, PORT = BASE.split("//", 1)[1].split(":")
PORT = int(PORT)


def http(method, path, body=None, headers=None, auth=True, timeout=120):
    """(status, parsed JSON or text) of one request; never raises on HTTP errors."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    if auth and KEY:
        h["Authorization"] = f"Bearer {KEY}"
    h.update(headers or {})
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def metrics():
    """The Prometheus metrics as {name_with_labels: value}."""
    _, text = http("GET", "/metrics")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def wait_idle(timeout=30):
    """Waits until no slot is busy and nothing is queued; returns the last /health body."""
    deadline = time.time() + timeout
    while True:
        status, h = http("GET", "/health")
        if status == 200 and h["slots_busy"] == 0 and h["queue"] == 0:
            return h
        if time.time() > deadline:
            raise AssertionError(f"server not idle after {timeout}s: {status} {h}")
        time.sleep(0.1)


def run(tests):
    """Runs each test function, prints PASS/FAIL lines, exits non-zero on any failure."""
    failed = 0
    for t in tests:
        t0 = time.time()
        try:
            t()
            print(f"PASS {t.__name__} ({time.time() - t0:.1f}s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}", flush=True)
            traceback.print_exc()
    print(f"{len(tests) - failed}/{len(tests)} passed", flush=True)
    sys.exit(1 if failed else 0)
