"""The console in a real browser: Debian's chromium, headless, driven by selenium through
chromium-driver, against the service served by uvicorn on a free port, with its real job
runner on the tiny BERT (a job trains for real in about a second).

Chromium runs with every host name except 127.0.0.1 unresolvable: /docs and /redoc must render
from the package's own assets, as on an air-gapped machine.

These tests never skip: without chromium, chromium-driver or selenium they fail, saying how to
install them (`make test` installs them). With RAPT_SCREENSHOTS=DIR they also write the
README's screenshots into DIR (``RAPT_SCREENSHOTS=docs/console pytest
tests/test_console_browser.py``).

One server for the module (grouped on one xdist worker: ``make test`` runs ``--dist
loadgroup``); each test signs in with its own API keys, so the tests do not depend on each
other's order."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from _service import LABELS, TEXTS, add_key, service_bert

pytestmark = pytest.mark.xdist_group("console_browser")

INSTALL = ("install them with `apt-get install -y chromium chromium-driver` (Debian; "
           "`make test` does it) and `pip install -e '.[dev]'` (selenium)")
# Every host name but the loopback fails to resolve: the network is off for the page.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
SHOTS = os.environ.get("RAPT_SCREENSHOTS")
MAX_SHOT_BYTES = 150_000
LABEL_NAMES = ("negative", "positive")


def _binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        missing = [n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p]
        pytest.fail(f"the browser tests need {' and '.join(missing)} on PATH: {INSTALL}",
                    pytrace=False)
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.fail(f"the browser tests need selenium: {INSTALL}", pytrace=False)
    return chromium, driver


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(server URL, the module's tmp folder): the service app with its real job runner (real
    tuning of the tiny BERT), served by uvicorn on a free port in a thread of this process (a
    `rapt serve` subprocess would import torch again: seconds on a loaded machine)."""
    import uvicorn

    from rapt.service import Limits, ServiceConfig, create_app

    _binaries()  # fail before the server's seconds are spent
    tmp = tmp_path_factory.mktemp("console_browser")
    cfg = ServiceConfig(db_path=tmp / "svc.db", backbones=["tiny"],
                        limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    app = create_app(cfg, backbones={"tiny": service_bert()})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here and handed over: no race for the port
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait(lambda: server.started or not thread.is_alive(), what="the server to start")
        assert server.started, "the server thread ended before it started serving"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", tmp
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture()
def browser(site):
    """A function that opens a new headless chromium (its own profile and cookie jar)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = _binaries()
    opened = []

    def open_browser():
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--disable-gpu", "--window-size=1200,850", OFFLINE):
            opts.add_argument(arg)
        # The DevTools network events, read back with get_log("performance"): every request
        # a page makes, the ones that fail (no host resolves but the loopback) included.
        opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
        d = webdriver.Chrome(options=opts, service=Service(driver))
        d.implicitly_wait(0)
        opened.append(d)
        return d

    yield open_browser
    for d in opened:
        d.quit()


def _key(site, name: str, **kw) -> str:
    return add_key(site[1], name, **kw)  # the server's SQLite store, in the module's folder


def _wait(cond, timeout: float = 30.0, what: str = "condition"):
    """Poll ``cond``; an element that is not there yet, or went stale because a form's answer
    replaced the page between finding it and reading it, counts as "not yet"."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            value = cond()
        except (NoSuchElementException, StaleElementReferenceException):
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _css(d, sel: str):
    return d.find_element("css selector", sel)


def _all(d, sel: str):
    return d.find_elements("css selector", sel)


def _shot(d, name: str) -> None:
    """With RAPT_SCREENSHOTS: the page as a small PNG (256 colours) for the README."""
    if not SHOTS:
        return
    from PIL import Image

    img = Image.open(io.BytesIO(d.get_screenshot_as_png())).convert("RGB")
    img = img.quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = Path(SHOTS) / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, optimize=True)
    assert out.stat().st_size < MAX_SHOT_BYTES, f"{out}: {out.stat().st_size} bytes"


def _login(d, url: str, key: str) -> None:
    d.get(url + "/console/login")
    _css(d, "input[name=key]").send_keys(key)
    _css(d, "form.login button").click()
    _wait(lambda: d.current_url.rstrip("/").endswith("/console"), what="the jobs page")


def _privatized(texts: list[str], eta: float = 10.0) -> list[str]:
    """``texts`` privatized as `rapt privatize` does it: dχ-privacy on the tiny BERT's
    embeddings (the user's machine's work; the service only ever gets the result)."""
    from rapt.privacy.mechanism import (
        Privatizer,
        candidate_ids_from_tokenizer,
        privatize_texts_detailed,
    )

    bb = service_bert()
    emb = bb.embeddings.detach()
    priv = Privatizer(emb, eta, special_ids=bb.special_ids, seed=0,
                      candidate_ids=candidate_ids_from_tokenizer(bb.tokenizer, emb.shape[0]))
    return privatize_texts_detailed(texts, bb.tokenizer, priv).texts


def _private_csv(path: Path) -> Path:
    """The file `rapt privatize` writes from a labelled CSV: the texts privatized, the label
    names kept."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows([t, LABEL_NAMES[y]] for t, y in zip(_privatized(TEXTS), LABELS,
                                                         strict=True))
    return path


def _job_form(d, url: str, **fields: str) -> str:
    """Start a job from the datasets page; returns its id (from the job page it lands on)."""
    from selenium.webdriver.support.ui import Select

    d.get(url + "/console/datasets")
    Select(_css(d, "#job-form select[name=method]")).select_by_value(fields.pop("method"))
    for name, value in fields.items():
        box = _css(d, f"#job-form input[name={name}]")
        box.clear()
        box.send_keys(value)
    _css(d, "#job-form button").click()
    return _wait(lambda: re.search(r"/console/jobs/(job_\w+)$", d.current_url),
                 what="the job page").group(1)


def _progress(d) -> tuple[str, float]:
    bar = _css(d, "dd progress")
    state = _css(d, "dd.state").text.split()[0]
    return state, float(bar.get_attribute("value") or 0) / float(bar.get_attribute("max"))


def _bar(d) -> float:
    """The first progress bar's fraction."""
    bar = _css(d, "progress")
    return float(bar.get_attribute("value") or 0) / float(bar.get_attribute("max") or 1)


def _requested(d) -> list[str]:
    """The URLs the browser requested since the last call (DevTools network log)."""
    import json

    out = []
    for entry in d.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            out.append(msg["params"]["request"]["url"])
    return out


def _rendered_requests(d) -> list[str]:
    """Every URL the page requested once it has rendered: collected until no new request has
    come for a second (pictures and fonts load after the script has drawn the page)."""
    urls, quiet_since = [], time.time()
    while time.time() - quiet_since < 1.0:
        new = _requested(d)
        if new:
            urls += new
            quiet_since = time.time()
        time.sleep(0.1)
    return urls


def _elsewhere(urls: list[str]) -> list[str]:
    """The URLs that leave the loopback (data: and blob: URLs stay in the page)."""
    from urllib.parse import urlsplit

    return [u for u in urls if urlsplit(u).scheme not in ("data", "blob", "about")
            and urlsplit(u).hostname != "127.0.0.1"]


def test_docs_and_redoc_render_with_the_network_off(site, browser):
    """Both pages render from the package's own assets and request nothing from any other
    host: the network log of each page is checked, not only its rendering (old behaviour:
    ReDoc's script fetched its logo from cdn.redoc.ly, which failed unseen here)."""
    from selenium.common.exceptions import WebDriverException

    d = browser()
    with pytest.raises(WebDriverException, match="ERR_NAME_NOT_RESOLVED"):
        d.get("https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css")  # really off
    assert set(_elsewhere(_requested(d))) == {"https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/"
                                              "swagger-ui.css"}  # and the log does see it
    d.get(site[0] + "/docs")
    title = _wait(lambda: _all(d, "#swagger-ui .info .title"), what="Swagger UI to render")
    assert "rapt provider service" in title[0].text
    assert _wait(lambda: _all(d, "#swagger-ui .opblock"), what="the operations")
    docs = _rendered_requests(d)
    assert site[0] + "/openapi.json" in docs and _elsewhere(docs) == [], docs
    d.get(site[0] + "/redoc")
    heading = _wait(lambda: [h for h in _all(d, "h1") if "rapt provider service" in h.text],
                    what="ReDoc to render")
    assert heading and _all(d, "[role=navigation], .menu-content")
    redoc = _rendered_requests(d)
    assert site[0] + "/openapi.json" in redoc and _elsewhere(redoc) == [], redoc


def test_upload_tune_watch_predict_and_cancel(site, browser, tmp_path):
    url = site[0]
    alice, bob = _key(site, "alice"), _key(site, "bob")
    d = browser()
    d.get(url + "/console/login")
    _shot(d, "login")
    _login(d, url, alice)
    # upload the privatized file, declared at the η it was privatized with
    d.get(url + "/console/datasets")
    assert "rapt privatize data.csv data.private.csv" in _css(d, "pre").text
    _css(d, "#upload-form input[type=file]").send_keys(str(_private_csv(tmp_path / "d.csv")))
    _css(d, "#upload-form input[name=eta]").send_keys("10")
    _css(d, "#upload-form button").click()
    ok = _wait(lambda: _all(d, "p.ok"), what="the upload's confirmation")[0].text
    assert "8 privatized rows" in ok and "0 = negative, 1 = positive" in ok
    dataset = re.search(r"ds_\w+", ok).group(0)
    _shot(d, "datasets")
    # a short job: its page reaches 100 %, then draws the loss curve
    jid = _job_form(d, url, method="prompt", epochs="3", batch_size="1")
    seen = [_progress(d)]
    while seen[-1][0] in ("queued", "running"):
        time.sleep(0.2)
        d.refresh()
        seen.append(_progress(d))
        assert len(seen) < 300, seen
    assert seen[-1] == ("succeeded", 1.0), seen
    assert "100 %" in _css(d, "dd progress").find_element("xpath", "..").text
    line = _css(d, "svg.curve polyline").get_attribute("points").split()
    assert len(line) == 24  # 3 epochs of 8 steps: one point per step
    _shot(d, "job")
    pid = _css(d, "a[href^='/console/prompts/']").text
    # predict a few privatized rows on the prompt's page
    d.get(f"{url}/console/prompts/{pid}")
    queries = _privatized(["a great film with good music", "a dull and boring story",
                           "the best scene ever"])
    _css(d, "#predict-form textarea").send_keys("\n".join(queries))
    _css(d, "#predict-form input[name=label_names]").send_keys("negative, positive")
    _css(d, "#predict-form button").click()
    labels = _wait(lambda: _all(d, "#predictions td.label"), what="the predictions")
    assert len(labels) == 3 and {x.text for x in labels} <= set(LABEL_NAMES)
    assert len(_all(d, "#predictions meter")) == 6
    d.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    _shot(d, "predict")
    # a longer job, cancelled from the jobs list while it runs
    long_job = _job_form(d, url, method="prompt", epochs="100", batch_size="1")
    d.get(url + "/console")
    _wait(lambda: (d.refresh() or True) and f"/console/jobs/{long_job}/cancel" in d.page_source
          and "running" in _css(d, "td.state").text, what="the long job to run")
    if SHOTS:  # a bar some way along, for the picture
        _wait(lambda: (d.refresh() or True) and _bar(d) >= 0.3, what="the long job's progress")
    _shot(d, "jobs")
    row = _css(d, f"form[action='/console/jobs/{long_job}/cancel']")
    row.find_element("css selector", "button").click()
    _wait(lambda: (d.refresh() or True) and "cancelled" in _css(d, "td.state").text,
          what="the job to be cancelled")
    # a second tenant sees nothing of the first
    _css(d, "form[action='/console/logout'] button").click()
    _login(d, url, bob)
    for page in ("/console", "/console/datasets", "/console/prompts"):
        d.get(url + page)
        assert not {jid, long_job, dataset, pid} & set(re.findall(r"\w+_[0-9a-f]{16}",
                                                                   d.page_source)), page
    for page in (f"/console/jobs/{jid}", f"/console/prompts/{pid}"):
        d.get(url + page)
        assert _css(d, "h1").text == "404", page


def test_admin_revokes_a_key_and_the_users_page_stops_working(site, browser):
    url = site[0]
    carol, ops = _key(site, "carol"), _key(site, "ops", admin=True)
    user = browser()
    _login(user, url, carol)
    assert _css(user, ".who").text == "carol"
    admin = browser()
    _login(admin, url, ops)
    admin.get(url + "/console/admin")
    _shot(admin, "admin")
    form = next(f for f in _all(admin, "form[action='/console/admin/keys']")
                if _all(f, "input[placeholder=carol]"))
    form.find_element("css selector", "input[name=confirm]").send_keys("carol")
    form.find_element("css selector", "button[value=revoke]").click()
    _wait(lambda: "revoked" in admin.find_element(
        "xpath", "//tr[td[text()='carol']]").text, what="carol's key to show revoked")
    user.refresh()
    assert user.current_url.endswith("/console/login")
    assert _all(user, "input[name=key]") and not _all(user, ".who")
