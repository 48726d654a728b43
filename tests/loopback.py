"""A test HTTP server on 127.0.0.1 served from a thread, for the tests' own stand-ins."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import HTTPServer


@contextmanager
def served(server: HTTPServer) -> Iterator[str]:
    """Serve ``server`` (bound to 127.0.0.1) in a daemon thread; yields its base URL, and shuts
    it down and closes its socket on the way out."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
