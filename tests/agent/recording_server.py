"""A tiny real HTTP server that speaks the agent protocol and records what it got.

It dedupes by ``seq`` like the real server (stores only seq above the highest held), so
tests can check "exactly once" on what it stored and "never resent" on what it received.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class RecordingServer:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[dict[str, Any]] = []  # every finding change POSTed
        self.stored: list[dict[str, Any]] = []  # the ones accepted (seq above last)
        self.reports: list[int] = []  # stored report seqs
        self.events: list[dict[str, Any]] = []  # timeline events, each id once
        self.last_seq = 0
        self.last_report_seq = 0
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != "Bearer node-token":
                    self._reply(401, {"error": {"code": "unauthorized", "message": "bad token"}})
                elif self.path.endswith("/findings"):
                    self._reply(200, owner._findings(body["findings"]))
                elif self.path.endswith("/events"):
                    self._reply(200, owner._events(body["events"]))
                else:
                    self._reply(200, owner._reports(body["reports"]))

            def _reply(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def down(self) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd = None

    def _findings(self, findings: list[dict[str, Any]]) -> dict[str, Any]:
        with self.lock:
            self.received.extend(findings)
            fresh = [f for f in findings if f["seq"] > self.last_seq]
            self.stored.extend(fresh)
            if fresh:
                self.last_seq = fresh[-1]["seq"]
            return {
                "node_id": "n1",
                "accepted": len(fresh),
                "duplicates": len(findings) - len(fresh),
                "last_seq": self.last_seq,
            }

    def _reports(self, reports: list[dict[str, Any]]) -> dict[str, Any]:
        with self.lock:
            fresh = [r["seq"] for r in reports if r["seq"] > self.last_report_seq]
            self.reports.extend(fresh)
            if fresh:
                self.last_report_seq = fresh[-1]
            return {
                "node_id": "n1",
                "accepted": len(fresh),
                "duplicates": 0,
                "last_seq": self.last_report_seq,
                "report_interval_s": 10.0,
            }

    def _events(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        with self.lock:
            held = {e["id"] for e in self.events}
            fresh = [e for e in events if e["id"] not in held]
            self.events.extend(fresh)
            return {"node_id": "n1", "accepted": len(fresh), "duplicates": len(events) - len(fresh)}
