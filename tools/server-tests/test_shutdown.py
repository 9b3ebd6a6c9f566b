"""Graceful shutdown: with a stream running, SIGTERM stops new connections but lets the stream finish with
[DONE]; the server then exits (the caller checks the exit status is 0)."""
import json
import os
import signal
import socket
import time

from common import HOST, KEY, PORT, run

PID = int(os.environ["KILN_SERVER_PID"])


def test_sigterm_finishes_running_stream():
    body = json.dumps({"messages": [{"role": "user", "content": "Write a story about a lighthouse."}],
                       "max_tokens": 40, "temperature": 0, "stream": True}).encode()
    auth = f"Authorization: Bearer {KEY}\r\n".encode() if KEY else b""
    s = socket.create_connection((HOST, PORT), timeout=60)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth +
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while got.count(b"data:") < 3:
        got += s.recv(4096)
    os.kill(PID, signal.SIGTERM)
    while b"data: [DONE]" not in got:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    assert b"data: [DONE]" in got, got[-500:]
    assert b'"finish_reason":"length"' in got, got[-500:]
    # New connections are refused once the listener is closed.
    time.sleep(0.5)
    try:
        socket.create_connection((HOST, PORT), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    assert refused, "the server still accepts connections after SIGTERM"


if __name__ == "__main__":
    run([test_sigterm_finishes_running_stream])
