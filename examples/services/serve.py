"""A small model server for trying gpupool's services: it "loads" for LOAD_SECONDS (its /health answers 503
meanwhile), then answers /health with 200 and POST /v1/generate with a JSON reply. Standard library only.

    gpupool submit examples/services/serve.yaml
    curl -H "Authorization: Bearer $TOKEN" -d '{"prompt": "hi"}' HEAD/api/v1/workloads/ID/proxy/v1/generate
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time

LOAD_SECONDS = float(os.environ.get("LOAD_SECONDS", "5"))
loaded = threading.Event()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        # A body sent with a GET is read too: under HTTP/1.1 keep-alive its bytes would otherwise be taken
        # for the start of the next request on the connection (the head's proxy reuses connections).
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/health":
            self._reply(200 if loaded.is_set() else 503, {"loaded": loaded.is_set()})
        else:
            self._reply(404, {"error": f"no such path {self.path}; try POST /v1/generate"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            prompt = json.loads(self.rfile.read(length) or b"{}").get("prompt", "")
        except ValueError:
            self._reply(400, {"error": 'send a JSON object, e.g. {"prompt": "hi"}'})
            return
        if self.path != "/v1/generate":
            self._reply(404, {"error": f"no such path {self.path}; try POST /v1/generate"})
            return
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        attempt = os.environ.get("GPUPOOL_ATTEMPT", "0")
        replica = os.environ.get("GPUPOOL_REPLICA", "0")  # which copy answered, with replicas: N
        self._reply(200, {"text": prompt[::-1], "gpus": gpus, "attempt": attempt, "replica": replica})

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    port = int(os.environ["GPUPOOL_PORT"])  # given to every service attempt
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"listening on port {port}; loading for {LOAD_SECONDS:g} s", flush=True)
    time.sleep(LOAD_SECONDS)  # a real server loads its model here
    loaded.set()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
