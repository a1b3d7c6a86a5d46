"""The first request each of vLLM's API server processes answers, against its later ones.

With ``--api-server-count N`` vLLM runs N API server processes on one port; a new connection goes
to one of them. Sends REQUESTS streamed chat requests one after another, each over a new
connection, to a freshly started server and prints each one's time to its first token (ms): the
requests that land on a process for the first time stand out against the steady ones.

    python scripts/api_server_first.py URL [REQUESTS]
"""

from __future__ import annotations

import json
import sys
import time

import httpx

BODY = {
    "model": "demo",
    "messages": [{"role": "user", "content": "hello there, how are you"}],
    "max_tokens": 4,
    "stream": True,
    "temperature": 0.7,
    "top_p": 0.95,
}


def first_token_ms(url: str) -> float | None:
    """One streamed chat request over a connection of its own: ms to the first content chunk."""
    with httpx.Client(timeout=120) as client:
        t0 = time.perf_counter()
        first = None
        with client.stream("POST", url + "/v1/chat/completions", json=BODY) as response:
            for line in response.iter_lines():
                if first is None and line.startswith("data: ") and '"content"' in line:
                    first = round((time.perf_counter() - t0) * 1000, 1)
        return first


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    print(json.dumps([first_token_ms(sys.argv[1]) for _ in range(n)]))
