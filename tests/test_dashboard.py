"""The dashboard against a real `nbmpi serve`, real 2-rank traced jobs and a real headless Chromium
(Debian's chromium + chromium-driver, selenium): login (wrong token refused), the jobs list, a job's
timeline figure (lanes, arrows, matrix from Bokeh's document), a live job whose timeline grows and
that hangs (where each rank waits), cancel buttons, the Chrome trace download, no request leaving
127.0.0.1; the data endpoints' tokens and owners; the dashboard notebook; `nbmpi demo --keep`."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from liveness import running
from test_server import BOB_TOKEN, CHANNEL_JOB, SLEEP_JOB, Server, job_processes, submit, wait_state

#: Which of the timeline's renderers draw with WebGL (BokehJS renderer views' has_webgl).
WEBGL_IN_USE = """
function* walk(v) { yield v; if (v.children) for (const c of v.children()) yield* walk(c); }
const out = {};
for (const root of Bokeh.index) for (const v of walk(root))
  if (v.model && ["nbmpi_quads", "nbmpi_arrow_heads"].includes(v.model.name)) out[v.model.name] = v.has_webgl;
return out;
"""
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")

# a job that exchanges messages every 50 ms (the timeline grows while it runs) until the test creates
# the file STOP in its directory, then hangs: rank 1 takes from rank 0, which sleeps
STOP = "stop-exchanging"
LIVE_THEN_HANG = """
import os, time
import numpy as np
from nbmpi.workers import ArrayChannel, world
r = world().Get_rank()
ch = ArrayChannel((1000,), np.float64)
for i in range(2400):
    if r == 0:
        ch[0] = 1.0 if os.path.exists("%s") else 0.0     # rank 0 decides, rank 1 echoes: both stop together
        ch.put(1); ch.take(1)
    else:
        ch.take(0); ch.put(0)
    if ch[0] == 1.0:
        break
    time.sleep(0.05)
print("now hanging", flush=True)
if r == 1:
    ch.take(0)
else:
    time.sleep(600)
""" % STOP


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("dash") / "data", max_ranks=4,   # a pool and a job at once
                 extra_args=["--unsafe-shared-account"]).start()   # alice and bob in one account
    srv.add_bob()
    yield srv
    srv.stop()
    assert job_processes(srv.data_dir) == []


@pytest.fixture(scope="module")
def done_job(server):
    """A finished 2-rank traced job (ArrayChannel put/take and an allreduce)."""
    with server.client() as c:
        job = submit(c, CHANNEL_JOB, args=["x"])
        return wait_state(c, job["id"], ("succeeded",), timeout=120)


class Browser:
    """Headless Chromium through chromedriver with a fresh profile; every request it makes is
    collected from the DevTools performance log (``requests``)."""

    def __init__(self, downloads: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="nbmpi-chromium-")
        self.downloads = downloads
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--enable-unsafe-swiftshader",
                  f"--user-data-dir={self.profile}",
                  "--window-size=1400,1000"):
            opts.add_argument(a)
        opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                               "download.prompt_for_download": False})
        opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        self.service = Service(CHROMEDRIVER)
        self.driver = webdriver.Chrome(service=self.service, options=opts)
        self.driver.set_script_timeout(60)
        self.driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        self.requests: list = []

    def collect(self) -> list:
        """URLs requested since the last call (also kept in ``requests``)."""
        urls = []
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                urls.append(msg["params"]["request"]["url"])
        self.requests += urls
        return urls

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def wait_for(self, script: str, timeout: float = 90, what: str = ""):
        """Poll ``script`` (returns a value) until truthy; return it."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.js(script)
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or script}; page text:\n"
                                     + self.js("return document.body.innerText")[:3000])
            time.sleep(0.1)

    def quit(self) -> None:
        pids = []
        try:
            pids = [c.pid for c in psutil.Process(self.service.process.pid).children(recursive=True)]
        except (psutil.Error, AttributeError):
            pass
        self.driver.quit()
        deadline = time.monotonic() + 10
        left = pids
        while left and time.monotonic() < deadline:
            left = [p for p in left if running(p)]
            time.sleep(0.1)
        for p in left:   # a renderer that outlived quit(): ours, by pid
            try:
                psutil.Process(p).kill()
            except psutil.Error:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("downloads"))
    yield b
    b.quit()
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if b.profile in " ".join(p.info["cmdline"] or [])]
    assert left == [], f"chromium processes left: {left}"


# -- API ------------------------------------------------------------------------------------------
def test_data_endpoints_need_the_token_and_hide_other_users_jobs(server, done_job):
    jid = done_job["id"]
    paths = ["/api/v1/dashboard/me", f"/api/v1/dashboard/jobs/{jid}/figure", f"/api/v1/dashboard/jobs/{jid}/timeline",
             f"/api/v1/dashboard/jobs/{jid}/trace.npz"]
    for p in paths:
        assert httpx.get(server.url + p).status_code == 401, p
        r = httpx.get(server.url + p, headers={"Authorization": "Bearer not-a-token-of-anyone-at-all"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", p
    with server.client(BOB_TOKEN) as bob:
        assert bob.get("/api/v1/dashboard/me").json() == {"user": "bob"}
        for p in paths[1:]:
            r = bob.get(p)
            assert r.status_code == 404 and r.json()["detail"] == f"job {jid} not found", p
        assert bob.get(f"/api/v1/jobs/{jid}/trace").status_code == 404
    with server.client() as c:
        for p in paths:
            assert c.get(p).status_code == 200, p
        assert c.get("/api/v1/dashboard/jobs/999999/timeline").status_code == 404
    # the page shell and assets need no token and hold no data
    r = httpx.get(server.url + "/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "dashboard"   # relative: also right under a proxy prefix
    page = httpx.get(server.url + f"/dashboard/jobs/{jid}")
    assert page.status_code == 200 and "connect-src 'self'" in page.headers["content-security-policy"]
    assert "heat" not in page.text and "rank 0 value" not in page.text and "/dashboard/bokeh/static/js/bokeh.min.js" in page.text
    for asset in ("/dashboard/bokeh/static/js/bokeh.min.js", "/dashboard/bokeh/static/js/bokeh-gl.min.js",
                  "/dashboard/static/dashboard.js", "/dashboard/static/dashboard.css"):
        assert httpx.get(server.url + asset).status_code == 200, asset


def test_timeline_data_equal_the_gathered_trace_and_follow_versions(server, done_job):
    from nbmpi.server.client import Client

    jid = done_job["id"]
    with Client(server.url, server.token) as c:
        trace = c.job_trace(jid)                 # the streamed events
        summary = c.summary(jid)                 # gathered by the ranks at exit
        chrome = c.trace(jid)
    assert [r["events"] for r in summary["ranks"]] == [int((trace.ranks == r).sum()) for r in range(2)]
    assert trace.summary()["bytes"] == summary["bytes"] and summary["bytes"][0][1] == 16000
    assert sum(1 for e in chrome["traceEvents"] if e.get("flow_out")) == len(trace.flow_pairs) == 4
    with server.client() as c:
        a = c.get(f"/api/v1/dashboard/jobs/{jid}/timeline", params={"width": 300}).json()
        assert a["available"] and not a["live"] and a["state"] == "succeeded" and a["meta"]["ranks"] == [0, 1]
        seg = a["sources"]["nbmpi_segments"]
        assert set(seg["rank"]) == {0, 1} and len(a["sources"]["nbmpi_arrows"]["x0"]) == 4
        assert a["sentence"] and a["analysis"]["bytes"] == summary["bytes"]
        again = c.get(f"/api/v1/dashboard/jobs/{jid}/timeline", params={"since": a["version"]}).json()
        assert again["unchanged"] and again["version"] == a["version"] and again.get("sources") is None
        f = c.get(f"/api/v1/dashboard/jobs/{jid}/figure", params={"width": 800}).json()
        assert f["item"]["doc"] and f["version"] == a["version"]
        assert c.get(f"/api/v1/dashboard/jobs/{jid}/timeline", params={"width": -1}).status_code == 422


def _leaving(urls, server: Server) -> list:
    """The URLs that would leave the machine: anything but this server (same origin), the browser's
    own pages (chrome:, about:) and in-page data (data:, blob:)."""
    return [u for u in urls if not (u.startswith(server.url + "/") or u.split(":", 1)[0] in
                                    ("chrome", "about", "data", "blob", "devtools", "file"))]


# -- the browser -------------------------------------------------------------------------------------
def _login(browser: Browser, server: Server, token: str) -> None:
    from selenium.webdriver.common.by import By

    d = browser.driver
    box = d.find_element(By.ID, "token")
    box.clear()
    box.send_keys(token)
    d.find_element(By.CSS_SELECTOR, "#login-form button").click()


@needs_browser
def test_browser_login_jobs_timeline_download(server, done_job, browser, tmp_path):
    d = browser.driver
    jid = done_job["id"]
    d.get(server.url + "/")
    browser.wait_for("return !document.getElementById('login').hidden", what="the login form")
    _login(browser, server, "wrong-token-0123456789abcdef")
    err = browser.wait_for("const e = document.getElementById('login-error'); return !e.hidden && e.textContent",
                           what="the login error")
    assert "Wrong token" in err and "401" in err
    assert browser.js("return sessionStorage.getItem('nbmpi-token')") is None
    _login(browser, server, server.token)
    row = browser.wait_for(f"const r = document.querySelector('#jobs tr[data-job=\"{jid}\"]'); return r && r.innerText",
                           what="the job in the jobs list")
    assert "succeeded" in row and "0 0" in row
    assert browser.js("return sessionStorage.getItem('nbmpi-token')") == server.token
    d.find_element("css selector", f'#jobs tr[data-job="{jid}"] a.job-link').click()
    browser.wait_for("return window.Bokeh && Bokeh.documents.length && window.nbmpiStats.updates.length",
                     what="the timeline figure")
    fig = browser.js("""
        const doc = Bokeh.documents[0];
        const seg = doc.get_model_by_name('nbmpi_segments').data;
        const arrows = doc.get_model_by_name('nbmpi_arrows').data;
        const m = doc.get_model_by_name('nbmpi_matrix').data;
        const plot = doc.get_model_by_name('nbmpi_timeline');
        return {ranks: Array.from(new Set(seg.rank)).sort(), states: Array.from(new Set(seg.state)).sort(),
                arrows: arrows.x0.length, heads: doc.get_model_by_name('nbmpi_heads').data.x.length,
                matrix: m.text, backend: plot.output_backend,
                lanes: plot.left[0].ticker.ticks, calls: Array.from(seg.call)};""")
    assert fig["ranks"] == [0, 1] and fig["lanes"] == [0, 1] and fig["backend"] == "canvas"
    assert browser.js(WEBGL_IN_USE) == {"nbmpi_arrow_heads": False, "nbmpi_quads": False}
    # which states survive the per-pixel level of detail depends on how long each one lasted (machine load)
    assert "compute" in fig["states"] and set(fig["states"]) <= {"communication", "compute", "wait"}
    assert len(fig["states"]) >= 2, fig["states"]
    assert fig["arrows"] == fig["heads"] == 4
    assert fig["matrix"] == ["", "15.6 KiB\n2 msg", "15.6 KiB\n2 msg", ""]
    assert any("put(dest=1)" in c for c in fig["calls"]) and any("take(src=0)" in c for c in fig["calls"]), fig["calls"]
    # the figure is drawn: Bokeh made its canvas and the page says what it shows
    assert browser.js("return document.querySelector('#figure .bk-Column, #figure div') !== null")
    assert "events;" in d.find_element("id", "figure-note").text and d.find_element("id", "sentence").text
    logs = browser.wait_for("return document.querySelector('pre.stdout[data-rank=\"1\"]').textContent",
                            what="rank 1's log")
    assert "rank 1 value" in logs and "args ['x']" in logs
    assert "stderr of rank 0" in browser.js("return document.querySelector('pre.stderr[data-rank=\"0\"]').textContent")
    # zoom: a narrower window is fetched and drawn
    n = len(browser.js("return window.nbmpiStats.updates"))
    browser.js("const x = Bokeh.documents[0].get_model_by_name('nbmpi_x'); x.setv({start: x.end * 0.4, end: x.end * 0.6})")
    upd = browser.wait_for(f"const u = window.nbmpiStats.updates; return u.length > {n} && u[u.length - 1]",
                           what="the zoomed window")
    assert upd["start"] > 0 and upd["end"] < browser.js("return Bokeh.documents[0].get_model_by_name('nbmpi_x').end") + 1e-9
    d.save_screenshot(str(tmp_path / "job.png"))
    # the Chrome trace download is the REST trace byte for byte
    d.find_element("id", "download").click()
    target = browser.downloads / f"nbmpi-job-{jid}-trace.json"
    deadline = time.monotonic() + 20
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    with server.client() as c:
        assert target.read_bytes() == c.get(f"/api/v1/jobs/{jid}/trace").content
    # ?backend=webgl draws the same figure with WebGL (the tab stays logged in)
    d.get(server.url + f"/dashboard/jobs/{jid}?backend=webgl")
    browser.wait_for("return window.Bokeh && Bokeh.documents.length && window.nbmpiStats.updates.length",
                     what="the WebGL timeline figure")
    assert browser.js("return Bokeh.documents[0].get_model_by_name('nbmpi_timeline').output_backend") == "webgl"
    assert browser.js(WEBGL_IN_USE) == {"nbmpi_arrow_heads": True, "nbmpi_quads": True}
    urls = browser.collect()
    assert any(u.startswith(server.url + "/dashboard/bokeh/") for u in urls)
    assert _leaving(urls, server) == []


@needs_browser
def test_browser_no_such_job_says_so(server, done_job, browser):
    d = browser.driver
    d.get(f"{server.url}/dashboard/jobs/999999#token={server.token}")
    title = browser.wait_for("const t = document.getElementById('job-title').textContent; "
                             "return t.startsWith('No such job') && t", what="the no-such-job title")
    assert title == "No such job: #999999"
    note = browser.js("return document.getElementById('figure-note').textContent")
    assert note == "There is no job 999999 among your jobs (it never existed, or it is another user's)."
    for el in ("download", "job-cancel", "logs-title", "job-facts"):
        assert not d.find_element("id", el).is_displayed() or not d.find_element("id", el).text, el
    assert not d.find_element("id", "download").is_displayed() and d.title == "nbmpi: no such job 999999"
    # an existing job's page still shows its download link
    d.get(f"{server.url}/dashboard/jobs/{done_job['id']}")
    browser.wait_for("return document.getElementById('job-title').textContent.startsWith('Job #')",
                     what="the job's title")
    assert d.find_element("id", "download").is_displayed() and d.find_element("id", "logs-title").is_displayed()


def test_browser_live_job_grows_hangs_and_is_cancelled(server, browser, tmp_path):
    d = browser.driver
    with server.client() as c:
        job = submit(c, LIVE_THEN_HANG)
        jid = job["id"]
        wait_state(c, jid, ("running",))
        d.get(server.url + f"/dashboard/jobs/{jid}#token={server.token}")     # a token link logs the tab in
        browser.wait_for("return window.Bokeh && Bokeh.documents.length && window.nbmpiStats.updates.length",
                         what="the live figure")
        assert "token=" not in d.current_url and browser.js("return sessionStorage.getItem('nbmpi-token')") == server.token
        counts = []
        deadline = time.monotonic() + 90
        while len(set(counts)) < 3:   # the timeline grows while the job runs
            counts.append(browser.js("return Bokeh.documents[0].get_model_by_name('nbmpi_arrows').data.x0.length"))
            assert time.monotonic() < deadline, counts
            time.sleep(0.3)
        assert counts == sorted(counts)
        (server.data_dir / "jobs" / str(jid) / STOP).write_text("")
        blocked = browser.wait_for(
            "return document.getElementById('blocked').innerText.includes('take(src=0)') && "
            "document.getElementById('blocked').innerText", what="where rank 1 waits")
        assert blocked.startswith("rank 1 has waited") and "in take(src=0) for rank 0, which is not blocked" in blocked
        seg = browser.js("const s = Bokeh.documents[0].get_model_by_name('nbmpi_segments').data;"
                         "const i = s.call.length - 1; return [s.rank[i], s.state[i], s.call[i]]")
        assert seg == [1, "wait", "take(src=0) (blocked now)"]
        d.save_screenshot(str(tmp_path / "hung.png"))
        assert job_processes(server.data_dir)
        d.find_element("id", "job-cancel").click()
        browser.wait_for("return document.getElementById('job-state').textContent === 'cancelled'",
                         what="the cancelled state")
        assert c.get(f"/api/v1/jobs/{jid}").json()["state"] == "cancelled"
        assert browser.wait_for("return document.getElementById('blocked').innerText.startsWith('when the job ended')",
                                what="the past tense")
        deadline = time.monotonic() + 20
        while job_processes(server.data_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job_processes(server.data_dir) == []
    assert _leaving(browser.collect(), server) == []


@needs_browser
def test_browser_overview_cancels_a_job_and_stops_a_pool(server, browser):
    d = browser.driver
    with server.client() as c:
        pool = c.post("/api/v1/pools", json={"ranks": 2, "name": "shared", "idle_timeout": 3600})
        assert pool.status_code == 201, pool.text
        pool = pool.json()
        job = submit(c, SLEEP_JOB.format(seconds=120), name="sleeper")
        wait_state(c, job["id"], ("running",))
        d.get(server.url + f"/dashboard#token={server.token}")
        sel = f'#jobs tr[data-job="{job["id"]}"]'
        row = browser.wait_for(f"const r = document.querySelector('{sel}'); return r && r.innerText.includes('running') "
                               "&& r.innerText", what="the running job")
        assert "sleeper" in row
        prow = browser.wait_for(f"const r = document.querySelector('#pools tr[data-pool=\"{pool['id']}\"]'); "
                                "return r && r.innerText", what="the pool")
        cells = prow.split("\t")
        assert cells[1:5] == ["shared", "running", "2", "root"] and cells[6] == "60 min 0 s", cells
        assert re.fullmatch(r"\d+(\.\d)? (ms|s)", cells[5]), cells          # idle since it started
        d.find_element("css selector", f"{sel} button.cancel").click()
        browser.wait_for(f"const r = document.querySelector('{sel}'); return r && r.innerText.includes('cancelled')",
                         what="the cancelled job in the list")
        rec = c.get(f"/api/v1/jobs/{job['id']}").json()
        assert rec["state"] == "cancelled" and rec["exit_code"] == 130
        assert browser.js(f"return document.querySelector('{sel} button.cancel')") is None
        d.find_element("css selector", f'#pools tr[data-pool="{pool["id"]}"] button.stop').click()
        browser.wait_for(f"const r = document.querySelector('#pools tr[data-pool=\"{pool['id']}\"]'); "
                         "return r && r.innerText.includes('stopped')", what="the stopped pool")
        assert c.get(f"/api/v1/pools/{pool['id']}").json()["state"] == "stopped"


@needs_browser
def test_dashboard_notebook_runs_and_its_figure_draws(tmp_path, browser):
    """notebooks/03-dashboard.ipynb top to bottom (a controller, a job, its figure inline); then its
    outputs as a notebook front end shows them, in Chromium: BokehJS from the output, the figure drawn."""
    from notebook_outputs import execute_notebook

    nb = execute_notebook("03-dashboard.ipynb", tmp_path, timeout=180)
    outs = [cell.get("outputs", []) for cell in nb.cells]
    text = ["".join(o.get("text", "") for o in cell) for cell in outs]
    pid = int(text[1].split("(pid ")[1].split(")")[0])
    assert "dashboard: http://127.0.0.1:" in text[1]
    assert "[rank 0] sum of ranks: 1.0\nsucceeded in" in text[2] and "/dashboard/jobs/1" in text[2], text[2]
    shown = [o for o in outs[4] if o["output_type"] == "display_data"]
    # BokehJS once (one <script> in one output; Bokeh's load_notebook published it twice), then the figure
    js = [o["data"]["text/html"] for o in shown if "bokeh.min.js" in o["data"].get("text/html", "")]
    fig = [o["data"] for o in shown if "nbmpi-timeline" in o["data"].get("text/html", "")]
    assert len(js) == 1 and js[0].count("BEGIN bokeh.min.js") == 1 and len(fig) == 1
    assert not any("application/javascript" in o["data"] for o in shown)
    assert fig[0]["image/svg+xml"].startswith("<svg") and fig[0]["text/html"].count("<svg") == 1
    sentence = outs[5][0]["data"]["text/plain"]
    assert sentence.startswith("'rank 1 computes") and "rank 0 waits" in sentence, sentence
    assert "controller stopped" in text[6] and not psutil.pid_exists(pid)
    data = text[1].split("log in with the token in ")[1].split("client.json)")[0]
    assert data.startswith("/") and not os.path.exists(data), f"the notebook left its controller's folder {data}"
    # what a trusted notebook page runs: the BokehJS output, then the figure's HTML (its script embeds)
    page = tmp_path / "notebook.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{js[0]}"
                    f"{fig[0]['text/html']}</body></html>")
    browser.driver.get(page.as_uri())
    browser.wait_for("return window.Bokeh && Bokeh.documents.length && "
                     "document.querySelector('.nbmpi-static').style.display === 'none'", what="the notebook figure")
    ranks = browser.js("return Array.from(new Set(Bokeh.documents[0].get_model_by_name('nbmpi_segments').data.rank))"
                       ".sort()")
    assert ranks == [0, 1]
    assert browser.js("return Bokeh.documents[0].get_model_by_name('nbmpi_arrows').data.x0.length") > 0
    browser.driver.save_screenshot(str(tmp_path / "notebook.png"))


def test_demo_keep_leaves_the_controller_and_prints_the_dashboard(tmp_path):
    data = tmp_path / "demo"
    p = subprocess.run([sys.executable, "-m", "nbmpi.server.cli", "demo", "-n", "2", "--data-dir", str(data), "--keep"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("== dashboard: "))
    url = line.split("== dashboard: ")[1].split("/dashboard")[0]
    token = json.loads((data / "client.json").read_text())["token"]   # users.json keeps only its hash
    assert f"{url}/dashboard (log in with the token {token})" in line and f"{url}/dashboard#token={token}" in line
    keep = next(x for x in p.stdout.splitlines() if "keeps running" in x)
    pid = int(keep.split("(pid ")[1].split(",")[0])
    assert keep.endswith(f"stop it with: kill {pid}")
    try:
        assert httpx.get(url + "/dashboard").status_code == 200
        jobs = httpx.get(url + "/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}).json()["jobs"]
        assert [j["state"] for j in jobs] == ["succeeded"]
        timeline = httpx.get(url + "/api/v1/dashboard/jobs/1/timeline", headers={"Authorization": f"Bearer {token}"})
        assert timeline.json()["available"]
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while running(pid):
        assert time.monotonic() < deadline, "the kept controller did not stop on SIGTERM"
        time.sleep(0.1)
    assert job_processes(data) == []

