"""A notebook-started pool's cell timelines reached where Jupyter is: a real IPython kernel (jupyter_client)
runs ``%distributed start -n 2`` (a real 2-rank pool) and ``%%distributed`` cells; the link it prints is fetched
THROUGH a real ``jupyter server`` with jupyter-server-proxy (logged in with Jupyter's token): the index lists every
cell, the cell's page holds its timeline (rank lanes, BokehJS from the kernel's server), the trace downloads as
Chrome JSON, nothing is served without the kernel server's key, and ``%distributed stop`` closes the port."""
from __future__ import annotations

import re
import time
from urllib.parse import urljoin, urlsplit

import httpx
import psutil
import pytest

from liveness import running
from test_jupyter_proxy import ASSET, JupyterServer, _login
from test_kernel_ext import Kernel, _alive

PROXIED = re.compile(r"cell timelines: (/proxy/(\d+)/\?key=[\w-]+) under Jupyter's address")
DIRECT = re.compile(r"or (http://127\.0\.0\.1:(\d+)/\?key=[\w-]+) on this host")
PINGPONG = ("%%distributed --timeline\nfor i in range(3):\n    if rank == 0:\n        ch.put(1); ch.take(1)\n"
            "    else:\n        ch.take(0); ch.put(0)")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    jup = JupyterServer(tmp_path_factory.mktemp("jupyter")).start()
    k = None
    pids = []
    try:
        k = Kernel()
        r = k.run("%load_ext nbmpi.kernel_ext\n%distributed start -n 2 --name tl")
        assert r["status"] == "ok", r
        pids = [p.pid for p in psutil.Process(k.pid).children(recursive=True)]
        yield jup, k, r["stdout"]
    finally:
        if k is not None:
            pids += [p.pid for p in psutil.Process(k.pid).children(recursive=True)]
            k.run("%distributed stop tl")   # the pool the last test started (an error if there is none)
            k.shutdown()
        jup.stop()
    deadline = time.monotonic() + 30
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pids) and not running(jup.proc.pid)


def _links(stdout: str):
    p, d = PROXIED.search(stdout), DIRECT.search(stdout)
    assert p and d and p.group(2) == d.group(2), stdout
    return p.group(1), d.group(1), int(p.group(2))


def test_cells_and_timelines_through_the_proxy(stack):
    jup, k, started = stack
    proxied, direct, port = _links(started)
    r = k.run("%%distributed\nfrom nbmpi.workers import ArrayChannel\nch = ArrayChannel(4)\nprint('made')")
    assert r["status"] == "ok", r
    r = k.run(PINGPONG)
    assert r["status"] == "ok", r
    r = k.run("%%distributed\nraise ValueError('on purpose')")
    assert r["status"] == "error", r
    r = k.run("%%distributed --timeout 2\nif rank == 1:\n    ch.take(0)")
    assert r["status"] == "error" and r["ename"] == "DistributedTimeout", r
    st = k.run("%distributed status")
    assert _links(st["stdout"]) == (proxied, direct, port), st
    web = _login(jup)
    try:
        index = web.get(proxied)
        assert index.status_code == 200, (index.status_code, index.text[:300])
        rows = re.findall(r'<tr id="cell-(\d+)">(.*?)</tr>', index.text)
        assert len(rows) == 4, index.text
        cells = {n: row for n, row in rows}
        made, ping, bad, hung = sorted(cells, key=int)
        assert "from nbmpi.workers import ArrayChannel" in cells[made] and ">ok<" in cells[made]
        assert "for i in range(3):" in cells[ping] and ">ok<" in cells[ping] and "0-1" in cells[ping]
        assert "raise ValueError(&#x27;on purpose&#x27;)" in cells[bad] and ">error<" in cells[bad]
        assert "if rank == 1:" in cells[hung] and ">timed out<" in cells[hung]
        key = proxied.split("key=")[1]
        for n in (made, bad, hung):   # traces requested without waiting, built when asked for
            assert f'href="cell/{n}?key={key}"' in cells[n], cells[n]
            got = web.get(urljoin(str(index.url), f"cell/{n}.json?key={key}"))
            assert got.status_code == 200 and got.json()["traceEvents"], (n, got.status_code)
        hung_page = web.get(urljoin(str(index.url), f"cell/{hung}?key={key}"))
        assert hung_page.status_code == 200 and "rank 1" in hung_page.text and "nbmpi_segments" in hung_page.text
        href = re.search(rf'href="(cell/{ping}\?key=[\w-]+)"', cells[ping]).group(1)
        page_url = urljoin(str(index.url), href)
        assert urlsplit(page_url).path == f"/proxy/{port}/cell/{ping}"
        page = web.get(page_url)
        assert page.status_code == 200, page.text[:300]
        assert "rank 0" in page.text and "rank 1" in page.text and "nbmpi_segments" in page.text, page.text[:2000]
        assert "for i in range(3):" in page.text and "<svg" in page.text
        assets = [urljoin(str(page.url), a) for a in ASSET.findall(page.text) if not a.startswith("data:")]
        assert any(urlsplit(a).path == f"/proxy/{port}/bokeh.js" for a in assets), assets
        assert not re.search(r'(?:src|href)="(?:https?:)?//', page.text)   # nothing from outside
        for url in assets:
            assert urlsplit(url).path.startswith(f"/proxy/{port}/"), url
            got = web.get(url)
            assert got.status_code == 200 and got.content, (url, got.status_code)
        js = web.get(urljoin(str(page.url), f"../bokeh.js?key={key}"))
        assert js.status_code == 200 and "Bokeh" in js.text and len(js.content) > 500_000
        trace = web.get(urljoin(str(page.url), f"{ping}.json?key={key}"))
        assert trace.status_code == 200 and "attachment" in trace.headers["content-disposition"]
        events = trace.json()["traceEvents"]
        assert sum(1 for e in events if e.get("flow_out")) == 6, len(events)
        # without the kernel server's key (or with a wrong one) nothing is served, through the proxy or directly
        for url in (f"/proxy/{port}/", f"/proxy/{port}/cell/{ping}", f"/proxy/{port}/bokeh.js",
                    f"/proxy/{port}/cell/{ping}?key=wrong"):
            no = web.get(url)
            assert no.status_code == 403 and "rank 0" not in no.text and "%distributed" in no.text, (url, no.text)
        assert httpx.get(direct.split("?")[0] + f"cell/{ping}", timeout=30).status_code == 403
        assert httpx.get(direct, timeout=30).status_code == 200
    finally:
        web.close()
    # without Jupyter's login the proxy forwards nothing
    anon = httpx.get(jup.url + proxied, timeout=30, follow_redirects=False)
    assert anon.status_code in (302, 403) and "cell-" not in anon.text


def test_timeline_page_in_chromium_through_the_proxy(stack, tmp_path):
    from test_dashboard import CHROMEDRIVER, CHROMIUM, Browser

    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    jup, k, started = stack
    proxied, _, port = _links(started)
    r = k.run("%%distributed\nfrom nbmpi.workers import ArrayChannel\nch = ArrayChannel(4)")
    assert r["status"] == "ok", r
    r = k.run(PINGPONG.replace("--timeline\n", "\n"))   # listed without --timeline too
    assert r["status"] == "ok", r
    b = Browser(tmp_path)
    try:
        b.driver.get(f"{jup.url}/api/status?token={jup.token}")   # logs the browser in to Jupyter (cookie)
        b.collect()
        b.driver.get(jup.url + proxied)
        href = b.wait_for("var a = [...document.querySelectorAll('a')].filter(x => x.textContent === 'timeline');"
                          "return a.length ? a[0].getAttribute('href') : null", what="a timeline link")
        b.driver.get(urljoin(jup.url + proxied, href))
        b.wait_for("return window.Bokeh && Bokeh.documents.length && "
                   "document.querySelector('.nbmpi-static').style.display === 'none'",
                   what="the Bokeh timeline drawn over the static SVG")
        fig = b.js("const doc = Bokeh.documents[0]; const seg = doc.get_model_by_name('nbmpi_segments').data;"
                   "return {ranks: Array.from(new Set(seg.rank)).sort(), calls: Array.from(seg.call),"
                   "lanes: doc.get_model_by_name('nbmpi_timeline').left[0].ticker.ticks,"
                   "arrows: doc.get_model_by_name('nbmpi_arrows').data.x0.length}")
        assert fig["ranks"] == [0, 1] and fig["lanes"] == [0, 1] and fig["arrows"] == 6, fig
        assert any("put(dest=1)" in c for c in fig["calls"]) and any("take(src=0)" in c for c in fig["calls"]), fig
        urls = [u for u in b.collect() if u.startswith("http")]
        assert all(u.startswith(f"{jup.url}/proxy/{port}/") for u in urls), urls   # nothing from elsewhere
        assert any(urlsplit(u).path == f"/proxy/{port}/bokeh.js" for u in urls), urls
        severe = [e for e in b.driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe
    finally:
        b.quit()


def test_stop_closes_the_server(stack):
    _, k, started = stack
    _, direct, _ = _links(started)
    assert httpx.get(direct, timeout=30).status_code == 200
    r = k.run("%distributed stop tl")
    assert r["status"] == "ok" and "cell timelines server stopped" in r["stdout"], r
    with pytest.raises(httpx.ConnectError):
        httpx.get(direct, timeout=30)
    r = k.run("%distributed status")
    assert "cell timelines" not in r["stdout"], r
    # a new pool serves again, on a new port with a new key
    r = k.run("%distributed start -n 2 --name tl")
    assert r["status"] == "ok", r
    _, again, _ = _links(r["stdout"])
    assert again != direct and httpx.get(again, timeout=30).status_code == 200
    assert "<tr id=" not in httpx.get(again, timeout=30).text   # the stopped pool's cells are gone


def test_cell_log_and_server_without_a_pool(monkeypatch):
    """The page server alone, on traces built here: the key, escaping, dropped traces, the JupyterHub prefix."""
    import numpy as np

    from nbmpi.kernel_ext.cell_log import CellLog, CellRecord, first_line
    from nbmpi.kernel_ext.timeline_server import TimelineServer
    from nbmpi.workers.tracing.analysis import Trace
    from nbmpi.workers.tracing.tracer import DIR_RECV, DIR_SEND, kind_names, register_kind
    from test_timeline import _ev

    put, take = register_kind("put"), register_kind("take")
    ms = 1_000_000

    def trace():
        ev = np.stack([_ev(put, DIR_SEND, 1, 6 * ms, 10 * ms), _ev(take, DIR_RECV, 0, 0, 10 * ms)])
        return Trace(ev, np.array([0, 1]), 2, kind_names())

    assert first_line("\n\n  x = 1\ny") == "x = 1" and len(first_line("a" * 200)) == 80
    log = CellLog(keep_traces=2)
    for n in (4, 5, 6):
        log.add(CellRecord(n, "p", [0, 1], first_line(f"<script>alert({n})</script>"), "ok", 0.5, trace=trace(),
                           window=(-10 * ms, 20 * ms)))
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    web = TimelineServer(log).start()
    try:
        proxied, direct = web.links()
        assert proxied == f"/user/alice/proxy/{web.port}/?key={web.key}"
        assert direct == f"http://127.0.0.1:{web.port}/?key={web.key}"
        base, q = direct.split("?")
        index = httpx.get(direct, timeout=30).text
        assert "<script>alert" not in index and "&lt;script&gt;alert(6)" in index
        assert 'href="cell/6?' in index and 'href="cell/5?' in index and 'href="cell/4?' not in index
        assert "trace dropped (only the last 2" in index
        page = httpx.get(f"{base}cell/6?{q}", timeout=30)
        assert page.status_code == 200 and "rank 1" in page.text and "<script>alert" not in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        assert httpx.get(f"{base}cell/4?{q}", timeout=30).status_code == 404
        assert httpx.get(f"{base}cell/6", timeout=30).status_code == 403
        assert httpx.get(f"{base}cell/6?key={web.key[:-1]}", timeout=30).status_code == 403
        log.drop_pool("p")
        assert "No %%distributed cell" in httpx.get(direct, timeout=30).text
    finally:
        web.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(direct, timeout=30)
