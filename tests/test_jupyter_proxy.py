"""The controller's dashboard reached where Jupyter is: a real `nbmpi serve` behind a real `jupyter server`
(jupyter_server with the jupyter-server-proxy extension) on 127.0.0.1, a random port and a token. Through
``/proxy/PORT/...`` the page, every asset it names (resolved as a browser resolves them), the REST calls the
page makes (relative to the root it names) and the ``/`` redirect work; and in headless Chromium the page logs
in and lists a job, with every request it makes going through the proxy."""
from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from liveness import running
from test_server import Server, submit, wait_state

ASSET = re.compile(r'(?:src|href)="([^"#]+)"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """A real ``jupyter server`` (with jupyter-server-proxy) on 127.0.0.1, its own config/data/runtime dirs."""

    def __init__(self, root: Path):
        self.root = root
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "JupyterServer":
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(self.root / "config"), JUPYTER_DATA_DIR=str(self.root / "data"),
                   JUPYTER_RUNTIME_DIR=str(self.root / "runtime"))
        self.log = open(self.root / "jupyter.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
             "--ServerApp.port_retries=0", "--ServerApp.allow_root=True", f"--IdentityProvider.token={self.token}", "--ServerApp.open_browser=False",
             f"--ServerApp.root_dir={self.root}", "--ServerApp.jpserver_extensions={'jupyter_server_proxy': True}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/api/status", params={"token": self.token}, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("jupyter server did not start: " + (self.root / "jupyter.log").read_text()[-3000:])
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("proxied") / "data").start()
    jup = None
    try:
        jup = JupyterServer(tmp_path_factory.mktemp("jupyter")).start()
        yield srv, jup
    finally:
        if jup is not None:
            jup.stop()
        srv.stop()
    assert not running(srv.proc.pid) and (jup is None or not running(jup.proc.pid))


def _login(jup: JupyterServer) -> httpx.Client:
    """An HTTP client logged in to the Jupyter server (its cookie), as a browser tab would be."""
    c = httpx.Client(base_url=jup.url, timeout=60, follow_redirects=True)
    assert c.get("/api/status", params={"token": jup.token}).status_code == 200
    return c


def test_dashboard_through_jupyter_server_proxy(stack):
    srv, jup = stack
    cport = urlsplit(srv.url).port
    prefix = f"/proxy/{cport}/"
    web = _login(jup)
    try:
        # the controller's root redirects (relatively) to its page under the proxy's prefix
        r = web.get(prefix)
        assert r.status_code == 200 and str(r.url).endswith(prefix + "dashboard"), r.url
        for page_path, root in ((prefix + "dashboard", "./"), (prefix + "dashboard/", "../"),
                                (prefix + "dashboard/jobs/1", "../../")):
            page = web.get(page_path)
            assert page.status_code == 200 and f'<meta name="nbmpi-root" content="{root}">' in page.text, page.text[:500]
            base = urljoin(str(page.url), root)
            assert urlsplit(base).path == prefix
            assets = [urljoin(str(page.url), a) for a in ASSET.findall(page.text)]
            assert len(assets) >= 5, assets   # icon, style sheet, BokehJS (core, GL), the page's script, links
            for url in assets:
                assert urlsplit(url).path.startswith(prefix), url
                got = web.get(url)
                assert got.status_code == 200 and got.content, (url, got.status_code)
        # the REST calls of the page: relative to the root it names, with the controller's bearer token
        api = urljoin(jup.url + prefix + "dashboard/jobs/1", "../../")
        me = web.get(api + "api/v1/dashboard/me", headers={"Authorization": f"Bearer {srv.token}"})
        assert me.status_code == 200 and me.json()["user"], me.text
        no = web.get(api + "api/v1/dashboard/me")
        assert no.status_code == 401, no.text
    finally:
        web.close()
    # without Jupyter's login the proxy answers nothing of the controller
    anon = httpx.get(jup.url + prefix + "dashboard", timeout=30, follow_redirects=False)
    assert anon.status_code in (302, 403) and "nbmpi-root" not in anon.text


def test_dashboard_in_chromium_through_the_proxy(stack, tmp_path):
    from test_dashboard import CHROMEDRIVER, CHROMIUM, Browser

    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    srv, jup = stack
    with srv.client() as c:
        job = submit(c, "print('hello from rank', __import__('nbmpi').workers.world().Get_rank())")
        wait_state(c, job["id"], ("succeeded",), timeout=120)
    cport = urlsplit(srv.url).port
    b = Browser(tmp_path)
    try:
        b.driver.get(f"{jup.url}/api/status?token={jup.token}")   # logs the browser in to Jupyter (cookie)
        b.driver.get(f"{jup.url}/proxy/{cport}/dashboard#token={srv.token}")
        b.wait_for(f"return [...document.querySelectorAll('#jobs a.job-link')].some(a => a.textContent === '#{job['id']}')",
                   what="the job in the list")
        href = b.js(f"return [...document.querySelectorAll('#jobs a.job-link')].find(a => a.textContent === "
                    f"'#{job['id']}').getAttribute('href')")
        assert href == f"/proxy/{cport}/dashboard/jobs/{job['id']}", href
        b.driver.get(f"{jup.url}{href}")
        b.wait_for("return document.getElementById('job-title').textContent", what="the job page")
        urls = b.collect()
        ours = [u for u in urls if u.startswith("http")]
        assert ours and all(u.startswith(f"{jup.url}/") for u in ours), ours
        assert not [u for u in ours if urlsplit(u).path.startswith(("/dashboard", "/api/v1"))], ours
    finally:
        b.quit()
