"""backbones/checkpoints/download.py against a real HTTP server on 127.0.0.1 that fails the way networks fail: a body
cut short of its Content-Length, a chunked body whose connection drops, a body without a length that stops early,
replies other than 200. Each is retried with back-off (shortened here), then refused with the bytes received and
expected, and nothing incomplete is left in torch.hub's cache; an unreadable cached file is downloaded anew."""

import http.server
import logging
import os
import threading

import pytest
import torch

from backbones import load_model_weights
from backbones.checkpoints import download as dl
from backbones.checkpoints.download import cache_path, fetch
from backbones.errors import CheckpointError


class _FlakyServer:
    """Serves ``files`` (name -> bytes); ``script[name]`` is the behaviour of each successive request of that file
    (the last one repeats): 'ok', 'cut' (Content-Length N, N // 3 bytes sent, connection closed), 'drop' (chunked,
    the connection closed after the first chunk), 'unsized' (no length, the first third sent, closed) or an HTTP
    status code."""

    def __init__(self):
        self.files, self.script, self.requests = {}, {}, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked replies need it

            def do_GET(self):
                name = self.path.lstrip("/")
                server.requests.append(name)
                steps = server.script.get(name, ["ok"])
                step = steps[min(len(server.requests_of(name)) - 1, len(steps) - 1)]
                body = server.files[name]
                self.close_connection = True
                if isinstance(step, int):
                    self.send_response(step)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                if step == "drop":
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    part = body[: len(body) // 3]
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    return
                if step != "unsized":
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body if step == "ok" else body[: len(body) // 3])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def requests_of(self, name):
        return [r for r in self.requests if r == name]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def flaky(tmp_path, monkeypatch):
    """The server, torch.hub's cache in ``tmp_path``, and a back-off of milliseconds; serves ``w.pth``, a
    ``torch.save`` zip archive of a few KiB."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(dl, "BACKOFF_S", 0.01)
    srv = _FlakyServer()
    torch.save({"w": torch.arange(1000.0)}, tmp_path / "w.pth")
    srv.files["w.pth"] = (tmp_path / "w.pth").read_bytes()
    yield srv
    srv.close()


def _cache_listing(url):
    folder = os.path.dirname(cache_path(url))
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1000))


@pytest.mark.parametrize(
    "step, says",
    [
        ("cut", r"received {third} of {size} bytes \(Content-Length\): the connection closed early"),
        ("drop", r"the connection failed after {third} bytes: IncompleteRead"),
        ("unsized", r"received {third} bytes, which are not a readable checkpoint: not a complete torch zip"),
        (503, r"HTTP status 503"),
    ],
)
def test_a_failing_download_is_retried_then_refused_and_nothing_is_cached(flaky, step, says):
    flaky.script["w.pth"] = [step]
    size = len(flaky.files["w.pth"])
    url = f"{flaky.url}/w.pth"
    with pytest.raises(CheckpointError, match=says.format(third=size // 3, size=size)) as info:
        load_model_weights(_Lin(), url)
    assert f"{dl.ATTEMPTS} attempts); nothing was cached" in str(info.value)
    assert flaky.requests == ["w.pth"] * dl.ATTEMPTS
    assert _cache_listing(url) == []  # neither the file nor a temp file
    # the server fixed: the next run downloads the file, instead of failing again on a cut file in the cache
    flaky.script["w.pth"] = ["ok"]
    assert load_model_weights(_Lin(), url).loaded == ["w"]
    assert _cache_listing(url) == ["w.pth"]


def test_a_failure_then_a_complete_download_loads(flaky, caplog):
    flaky.script["w.pth"] = ["cut", 503, "ok"]
    url = f"{flaky.url}/w.pth"
    with caplog.at_level(logging.WARNING, logger="backbones"):
        model = _Lin()
        assert load_model_weights(model, url).loaded == ["w"]
    assert torch.equal(model.w.detach(), torch.arange(1000.0))
    assert flaky.requests == ["w.pth"] * 3
    assert "attempt 1 of 4 failed (received" in caplog.text and "attempt 2 of 4 failed (HTTP status 503" in caplog.text


def test_a_client_error_is_refused_at_once(flaky):
    flaky.script["w.pth"] = [404]
    with pytest.raises(CheckpointError, match=r"HTTP status 404 Not Found; 1 attempt\); nothing was cached"):
        fetch(f"{flaky.url}/w.pth")
    assert flaky.requests == ["w.pth"]


def test_an_unreadable_cached_file_is_deleted_and_downloaded_anew(flaky, caplog):
    url = f"{flaky.url}/w.pth"
    path = cache_path(url)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:  # cut by a full disk or a killed copy; no hash to check it against
        f.write(flaky.files["w.pth"][:1000])
    with caplog.at_level(logging.WARNING, logger="backbones"):
        assert fetch(url) == path
    assert "is not a readable checkpoint (not a complete torch zip archive" in caplog.text
    assert flaky.requests == ["w.pth"]
    assert open(path, "rb").read() == flaky.files["w.pth"]
    assert fetch(url) == path and flaky.requests == ["w.pth"]  # complete now: a cache hit


def test_unreadable_tells_a_cut_safetensors_file(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.arange(1000.0)}, tmp_path / "w.safetensors")
    data = (tmp_path / "w.safetensors").read_bytes()
    with open(tmp_path / "w.safetensors", "rb") as f:
        assert dl.unreadable(f) is None
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with open(tmp_path / "cut.safetensors", "rb") as f:
        assert dl.unreadable(f) == f"its safetensors header names {len(data)} bytes, the file has {len(data) - 10}"
