"""HTTP front end with SGLang's endpoint shapes (stdlib only).

Why stdlib ``http.server``: the engine must run anywhere the plugin runs, with no new
dependency. ``ThreadingHTTPServer`` gives a thread per connection; HTTP/1.1 keep-alive
is supported (load generators reuse connections) and streams use chunked transfer
encoding with Server-Sent Events (``data: {...}\\n\\n`` ... ``data: [DONE]``), one event per
engine step, so under speculation one event carries several tokens, as in SGLang.

Every handler validates its input and answers 400 with a JSON error for anything
malformed; unexpected exceptions become 500s. Bad input never kills the server.

:class:`Handler` joins the endpoint classes (:mod:`.admin_endpoints`, :mod:`.generation_endpoints`,
both on the plumbing of :mod:`.transport`) and routes each method and path to one of them.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from pytest_ddtree.refserver.admin_endpoints import AdminEndpoints
from pytest_ddtree.refserver.openai_endpoints import OpenAIEndpoints
from pytest_ddtree.refserver.request_params import BadRequest
from pytest_ddtree.refserver.state import ServerState

__all__ = ["Handler", "RefHTTPServer", "ServerState", "make_server"]


class Handler(AdminEndpoints, OpenAIEndpoints):
    """One connection; dispatches on method + path."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        st = self.state
        if st.hung.is_set():
            self._hang()
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", "/health"): self.h_health,
            ("GET", "/health_generate"): self.h_health,
            ("GET", "/server_info"): self.h_server_info,
            ("GET", "/get_server_info"): self.h_server_info,
            ("GET", "/model_info"): self.h_model_info,
            ("GET", "/get_model_info"): self.h_model_info,
            ("GET", "/flush_cache"): self.h_flush_cache,
            ("POST", "/flush_cache"): self.h_flush_cache,
            ("GET", "/metrics"): self.h_metrics,
            ("GET", "/start_profile"): self.h_start_profile,
            ("POST", "/start_profile"): self.h_start_profile,
            ("GET", "/stop_profile"): self.h_stop_profile,
            ("POST", "/stop_profile"): self.h_stop_profile,
            ("GET", "/v1/models"): self.h_models,
            ("POST", "/generate"): self.h_generate,
            ("POST", "/v1/completions"): self.h_completions,
            ("POST", "/v1/chat/completions"): self.h_chat,
            ("POST", "/tokenize"): self.h_tokenize,
            ("POST", "/v1/tokenize"): self.h_tokenize,
            ("POST", "/detokenize"): self.h_detokenize,
            ("POST", "/v1/detokenize"): self.h_detokenize,
        }
        handler = routes.get((method, path))
        trickle = _TRICKLED.get(path)
        if trickle is not None and self.trickled(trickle):
            return
        try:
            if handler is None:
                if method in ("POST", "PUT"):
                    self._drain_body()
                # Starlette's own answers (SGLang's app is FastAPI): {"detail": ...}
                if any(p == path for _, p in routes):
                    self.send_json(405, {"detail": "Method Not Allowed"})
                else:
                    self.send_json(404, {"detail": "Not Found"})
                return
            handler()
        except BadRequest as exc:
            self.send_bad_request(path, exc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug must not kill the server
            st.log("ERROR:    " + "".join(traceback.format_exception(exc)).rstrip())
            try:
                self.send_error_json(500, f"internal error: {exc!r}")
            except OSError:
                self.close_connection = True


#: The paths the trickle fault slows here (a /generate trickles in h_generate: stream or not).
_TRICKLED = {"/health": "health", "/health_generate": "health", "/server_info": "server_info",
             "/get_server_info": "server_info", "/v1/chat/completions": "chat"}


class RefHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def make_server(state: ServerState, host: str, port: int) -> RefHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    return RefHTTPServer((host, port), handler)
