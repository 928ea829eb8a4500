"""The loopback endpoint agents talk to: OpenAI's HTTP API, one base URL per episode.

    server = await endpoint()    # this event loop's, started by its first live episode
    url = server.open(session)   # http://127.0.0.1:PORT/episodes/KEY/v1 for that session
    ...                          # the agent's requests reach only `session`
    server.close_session(session)   # later requests: 410; the last one stops the server

Routes under a base URL: `POST chat/completions`, `POST completions`, `GET models`. The
key in the path is 128 random bits, so a request can only name an episode it was given.
Refusals are OpenAI-style errors naming the field (400), an unknown episode (404) or an
ended one (410); an error of the server's own is a 500 and the server goes on serving.
The server listens on 127.0.0.1 only and speaks HTTP/1.1 (keep-alive; `stream: true` is
answered as server-sent events) through h11, on the event loop of the episodes it serves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import OrderedDict
from typing import Any

import h11

from parity.envs.agent.openai_format import RequestError
from parity.envs.agent.session import AgentSession

log = logging.getLogger(__name__)

MAX_BODY = 64 * 2**20  # bytes of one request body
_ENDED_KEPT = 65536  # ended episodes remembered, to answer 410 rather than 404
_ENDED: OrderedDict[str, None] = OrderedDict()
_SERVERS: dict[asyncio.AbstractEventLoop, EndpointServer] = {}


class EndpointServer:
    """An HTTP server on 127.0.0.1 routing `/episodes/<key>/v1/...` to live sessions."""

    def __init__(self) -> None:
        self.sessions: dict[str, AgentSession] = {}
        self._server: asyncio.Server | None = None
        self.port = 0
        self.started = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def new_key(self) -> str:
        return secrets.token_hex(16)

    def open(self, session: AgentSession) -> str:
        """Serve `session`; returns its base URL."""
        self.sessions[session.key] = session
        return f"http://127.0.0.1:{self.port}/episodes/{session.key}/v1"

    def close_session(self, session: AgentSession) -> None:
        """Stop serving `session`: its later requests are refused (410). The server stops
        with its last session (a loop without agent episodes keeps no port open)."""
        self.sessions.pop(session.key, None)
        _ENDED[session.key] = None
        while len(_ENDED) > _ENDED_KEPT:
            _ENDED.popitem(last=False)
        if not self.sessions and self._server is not None:
            self._server.close()
            if _SERVERS.get(self._server.get_loop()) is self:
                del _SERVERS[self._server.get_loop()]

    async def handle(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        """(status, JSON body or a list of stream chunks) for one request."""
        try:
            return 200, await self._route(method, target, body)
        except RequestError as e:
            return e.status, e.body()
        except Exception as e:  # a bug here must not take the worker's episodes down
            log.exception("agent endpoint failed on %s %s", method, target)
            return 500, RequestError(f"internal error: {type(e).__name__}: {e}", None, 500).body()

    async def _route(self, method: str, target: str, body: bytes) -> Any:
        parts = target.split("?", 1)[0].strip("/").split("/")
        if len(parts) < 4 or parts[0] != "episodes" or parts[2] != "v1":
            raise RequestError(f"no route {target}; use /episodes/<key>/v1/...", None, 404)
        key, route = parts[1], "/".join(parts[3:])
        session = self.sessions.get(key)
        if session is None:
            if key in _ENDED:
                raise RequestError(f"episode {key} has ended", None, 410)
            raise RequestError(f"unknown episode {key}", None, 404)
        if method == "GET" and route == "models":
            return {"object": "list", "data": [{"id": session.model, "object": "model",
                                                "created": 0, "owned_by": "parity"}]}
        if method != "POST" or route not in ("chat/completions", "completions"):
            raise RequestError(f"no route {method} /v1/{route}", None, 404)
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"body: not valid JSON: {e}") from e
        if not isinstance(request, dict):
            raise RequestError("body: must be a JSON object")
        serve = session.chat if route == "chat/completions" else session.complete
        result = await serve(request)
        return _chunks(result) if request.get("stream") else result

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await _next(conn, reader)
                if not isinstance(request, h11.Request):
                    return
                body = bytearray()
                while isinstance(event := await _next(conn, reader), h11.Data):
                    body += event.data
                    if len(body) > MAX_BODY:
                        await _respond(conn, writer, 413, RequestError(
                            f"body: over {MAX_BODY} bytes", None, 413).body())
                        return
                if not isinstance(event, h11.EndOfMessage):
                    return
                status, payload = await self.handle(request.method.decode(),
                                                    request.target.decode(), bytes(body))
                await _respond(conn, writer, status, payload)
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (h11.ProtocolError, ConnectionError, asyncio.IncompleteReadError):
            pass  # a client that hung up or spoke something else: only its connection ends
        except asyncio.CancelledError:
            pass  # the loop is closing with the connection open (asyncio would log it)
        finally:
            writer.close()



async def endpoint() -> EndpointServer:
    """This event loop's endpoint server (one per rollout worker), started if none runs."""
    loop = asyncio.get_running_loop()
    while True:
        server = _SERVERS.get(loop)
        if server is None:
            server = _SERVERS[loop] = EndpointServer()
        await server.started
        if _SERVERS.get(loop) is server:  # not stopped by the last episode on it meanwhile
            return server


async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await reader.read(65536))
    return event


async def _respond(conn: h11.Connection, writer: asyncio.StreamWriter, status: int,
                   payload: Any) -> None:
    if isinstance(payload, list):  # server-sent events
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in payload)
        data += b"data: [DONE]\n\n"
        kind = "text/event-stream"
    else:
        data, kind = json.dumps(payload).encode(), "application/json"
    writer.write(conn.send(h11.Response(status_code=status, headers=[
        ("content-type", kind), ("content-length", str(len(data)))])))
    writer.write(conn.send(h11.Data(data=data)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()


def _chunks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished completion as the stream of chunks that would have delivered it."""
    choice = result["choices"][0]
    base = {k: result[k] for k in ("id", "created", "model")}
    if result["object"] == "text_completion":
        first = {**choice, "finish_reason": None}
        last = {"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}
        return [{**base, "object": "text_completion", "choices": [c]} for c in (first, last)]
    message = dict(choice["message"])
    if "tool_calls" in message:
        message["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    first = {"index": 0, "delta": message, "logprobs": choice["logprobs"], "finish_reason": None}
    last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}
    return [{**base, "object": "chat.completion.chunk", "choices": [c]} for c in (first, last)]
