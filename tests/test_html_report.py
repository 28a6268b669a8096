"""``buffet report RUN --html``: one self-contained page per run, opened in a real browser.

The browser tests drive Debian's headless Chromium through the DevTools protocol over a pipe (its
``--remote-debugging-pipe``: JSON messages ending in a NUL byte on the child's file descriptors 3 and 4), so
they see what a person's browser would: uncaught exceptions, console errors, resources that failed to load,
every URL the page requested, whether its images decoded, and a screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from buffet.data.arrays import from_array
from buffet.data.ibp_images import make_images
from buffet.data.splits import add_split, holdout_entries
from buffet.data.synthetic import write_uci_corpus
from buffet.pipeline.cli import main

from helpers import run_main

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="no Chromium on PATH (Debian: apt-get install -y chromium)")
BROWSER_WAIT = 60.0  # seconds: bounds every wait for the browser's answer
VIEWPORT = (1280, 2000)


# Run a command with the descriptors argv[1] and argv[2] as its 3 and 4 (a POSIX shell cannot name those above 9).
AT_THREE_AND_FOUR = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
                     "os.execvp(sys.argv[3], sys.argv[3:])")


def _above_four(fd: int) -> int:
    """``fd`` moved to a descriptor number of 10 or more."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class DevTools:
    """A headless Chromium driven over its DevTools pipe: ``call`` sends a command and returns its result,
    keeping every event that arrives meanwhile in ``events``."""

    def __init__(self, profile: Path):
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # above the descriptors 3 and 4, so that putting them there cannot overwrite one with the other
        to_browser, from_browser = (_above_four(fd) for fd in (to_browser, from_browser))
        command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                   f"--user-data-dir={profile}", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "about:blank"]
        self.log = profile.parent / "chromium.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-c", AT_THREE_AND_FOUR, str(to_browser),
                                             str(from_browser), *command], pass_fds=(to_browser, from_browser),
                                            stdout=log, stderr=log)
        os.close(to_browser)
        os.close(from_browser)
        self.events: list[dict] = []
        self._buffer, self._next_id = b"", 0

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if not select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f"Chromium sent nothing for {BROWSER_WAIT:.0f} s")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise ConnectionError(f"Chromium closed its DevTools pipe (its output: {self.log})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, **params: object) -> dict:
        """The result of DevTools command ``method`` (sent to the page attached as ``session``, if given)."""
        self._next_id += 1
        request = {"id": self._next_id, "method": method, "params": params,
                   **({"sessionId": session} if session else {})}
        os.write(self._write, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + BROWSER_WAIT
        while (message := self._message(deadline)).get("id") != self._next_id:
            self.events.append(message)
        assert "error" not in message, f"{method}: {message['error']}"
        return message["result"]

    def wait_for(self, method: str) -> None:
        """Return once the event ``method`` has arrived (it may have already)."""
        deadline = time.monotonic() + BROWSER_WAIT
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._message(deadline))

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.process.wait(timeout=BROWSER_WAIT)
        except (ConnectionError, TimeoutError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._read)
            os.close(self._write)


def problems(events: list[dict]) -> list[str]:
    """Uncaught exceptions, console errors and failed loads among the page's DevTools events."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            found.append(params["exceptionDetails"].get("exception", {}).get("description", "uncaught exception"))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":  # such as a failed load
            found.append(f"{params['entry']['text']} ({params['entry'].get('url', 'no URL')})")
    return found


def open_page(page: Path, profile: Path) -> dict:
    """Load ``page`` from its file:// URL in headless Chromium: the problems it logged, the URLs it requested,
    how many images it has and how many decoded, and a PNG screenshot of the window."""
    browser = DevTools(profile)
    try:
        target = next(t for t in browser.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        session = browser.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable", session)
        browser.call("Page.navigate", session, url=page.as_uri())
        browser.wait_for("Page.loadEventFired")
        images = browser.call("Runtime.evaluate", session, returnByValue=True, expression=(
            "[document.images.length, [...document.images].filter(i => i.complete && i.naturalWidth > 0).length]"
        ))["result"]["value"]
        shot = base64.b64decode(browser.call("Page.captureScreenshot", session, format="png")["data"])
        events = [e for e in browser.events if e.get("sessionId") == session]
    finally:
        browser.close()
    requested = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    return {"problems": problems(events), "images": images, "screenshot": shot, "requested": requested}


def colours(png: bytes) -> int:
    """How many distinct colours a PNG image has."""
    from matplotlib.image import imread

    rgb = (imread(io.BytesIO(png), format="png")[..., :3] * 255).round().astype(np.uint32)
    return len(np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]))


def assert_self_contained(page: Path) -> str:
    """The page refers to nothing outside itself: no http(s) URL anywhere, every ``src`` a data: URI, and no
    link, script or stylesheet file."""
    text = page.read_text()
    assert not re.search(r"https?://", text)
    sources = re.findall(r'\bsrc="([^"]*)"', text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"<(script|link|iframe)\b|\bhref=|url\(", text)
    return text


def report_page(capsys, run: Path, out: Path) -> Path:
    """``buffet report RUN --out OUT --html`` and the page it wrote, which it lists with the other files."""
    files = run_main(capsys, "report", run, "--out", out, "--html").split()
    assert str(out / "report.html") in files and str(out / "summary.md") in files
    return out / "report.html"


def assert_opens_cleanly(page: Path, profile: Path, n_images: int) -> bytes:
    """The page opens in Chromium from its file with no problem, requests nothing but itself and its data: images,
    shows every image, and its screenshot is a picture rather than a blank window. Returns the screenshot."""
    seen = open_page(page, profile)
    assert seen["problems"] == []
    assert all(url == page.as_uri() or url.startswith("data:") for url in seen["requested"]), seen["requested"]
    assert seen["images"] == [n_images, n_images]
    # a blank window has one colour, a page of text a few hundred; plots in colour have thousands
    assert colours(seen["screenshot"]) > 1000
    return seen["screenshot"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """A small corpus of counts with held-out documents, and 60 noisy 6 x 6 images with held-out entries."""
    folder = tmp_path_factory.mktemp("html-report")
    write_uci_corpus(folder / "docword.txt.gz", n_docs=300, n_words=200, n_topics=6, mean_length=60, seed=1,
                     vocab_path=folder / "vocab.txt")
    assert main(["ingest", "uci", str(folder / "docword.txt.gz"), str(folder / "vocab.txt"),
                 "--out", str(folder / "counts.zarr"), "--holdout", "0.1", "--seed", "0"]) == 0
    images = make_images(n_rows=60, noise_var=0.5, variant="four", seed=0)[0]
    dataset = from_array(images, folder / "images.zarr", "real", rows_per_chunk=16)
    add_split(dataset, "heldout", {"test_mask": holdout_entries(np.ones(images.shape, bool), 0.1, 0)},
              {"kind": "entries"})
    return {"counts": folder / "counts.zarr", "images": folder / "images.zarr"}


def fitted(capsys, model: str, store: Path, run: Path, *options: object) -> Path:
    run_main(capsys, "fit", model, store, "--out", run, "--quiet", *options)
    return run


@needs_chromium
def test_bayesian_nmf_page_opens_in_chromium(tmp_path, stores, capsys):
    """Topics with their top words and weights, the held-out trace and the configuration, seen by Chromium."""
    run = fitted(capsys, "bnmf", stores["counts"], tmp_path / "run", "--k", 6, "--batch-size", 100, "--passes", 2,
                 "--eval-every", 1)
    page = report_page(capsys, run, tmp_path / "report")
    text = assert_self_contained(page)
    assert "<h3>Topics (by share of the tokens)</h3>" in text and text.count("<li>topic ") == 6
    assert "<td>batch_size</td><td><code>100</code></td>" in text
    assert assert_opens_cleanly(page, tmp_path / "profile", n_images=3)[:4] == b"\x89PNG"


@needs_chromium
def test_imf_page_opens_in_chromium(tmp_path, stores, capsys):
    """The evidence by K+, the bases as images, feature usage and the trace of K+, seen by Chromium."""
    run = fitted(capsys, "imf", stores["images"], tmp_path / "run", "--max-k", 3, "--tol", 1e-4, "--n-candidates", 1,
                 "--select", "none")
    page = report_page(capsys, run, tmp_path / "report")
    text = assert_self_contained(page)
    for caption in ("trace", "evidence by k", "bases", "feature usage"):
        assert f"<figcaption>{caption}</figcaption>" in text
    assert "<th>K+</th><th>evidence</th>" in text
    assert_opens_cleanly(page, tmp_path / "profile", n_images=4)


def test_binary_mf_page_embeds_the_report_as_written(tmp_path, stores, capsys):
    """Without a browser: the page of a binary MF run holds the report's own PNG files, byte for byte and in
    its order, its summary table and the run's parameters."""
    run = fitted(capsys, "bmf", stores["images"], tmp_path / "run", "--sweeps", 6, "--burn-in", 3, "--select", "none")
    out = tmp_path / "report"
    text = assert_self_contained(report_page(capsys, run, out))
    embedded = [base64.b64decode(s) for s in re.findall(r'src="data:image/png;base64,([^"]*)"', text)]
    written = [out / name for name in ("trace.png", "trace_features.png", "features.png")]
    assert embedded == [path.read_bytes() for path in written]
    assert "<tr><td>retained_sweeps</td><td>3</td></tr>" in text
    assert "<td>likelihood</td><td><code>gaussian</code></td>" in text
    assert "<title>BMF run " in text


@needs_chromium
def test_the_browser_check_sees_what_goes_wrong(tmp_path):
    """The check above is not blind: an uncaught exception, a console error and a missing image all count."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><p>text</p><img src="missing.png">'
                    '<script>console.error("console says no")</script><script>noSuchFunction()</script></body></html>')
    seen = open_page(page, tmp_path / "profile")
    found = "\n".join(seen["problems"])
    assert "console says no" in found and "noSuchFunction is not defined" in found and "missing.png" in found
    assert seen["images"] == [1, 0]
    assert colours(seen["screenshot"]) < 1000
