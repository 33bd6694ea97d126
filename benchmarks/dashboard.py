"""Dashboard timeline on 100,000 events: zoom and pan in a real browser, level of detail vs none,
WebGL vs canvas, side by side; and the README's screenshot of a real job's page.

One command: ``python benchmarks/dashboard.py [--quick] [--out-dir DIR] [--screenshot PATH]``. It starts a
real ``nbmpi serve`` (127.0.0.1, free port, temporary data directory), runs

* the demo's example job (1-D heat equation, 2 ranks) and saves a screenshot of its job page
  (``benchmarks/results/dashboard.png`` unless ``--screenshot``; none with ``--quick``);
* a 2-rank ArrayChannel ping-pong of 25,000 round trips (100,000 trace events; 10,000 with
  ``--quick``), and opens its job page in headless Chromium (Debian's chromium + chromium-driver,
  WebGL in software: SwiftShader) in four ways:

  - ``LOD + canvas``: the dashboard as shipped (the server sends each window at the plot's pixel
    width, segments narrower than a pixel merged; the timeline's quads drawn on a 2-D canvas);
  - ``LOD + WebGL``: the same drawn with WebGL (``?backend=webgl``);
  - ``all + canvas`` / ``all + WebGL``: every segment of the window sent and drawn (``?detail=full``).

  For each: the first figure (page load to drawn), the frame time of 30 pan steps of 1% at the full
  view (one animation frame per step; 10 steps for the "all" ways, whose frames take seconds), and 8 zoom steps (each halves the window): the first frame at
  the new range and the time until the refined window is drawn (debounce, fetch, apply, two frames).

Server side, cold and warm: the figure endpoint's first call for the job (joins the streamed files,
builds columns and the Bokeh document) and a repeat, and the median of window requests.

Writes ``benchmarks/results/dashboard[_quick].json`` and ``.md`` with PASS/FAIL per target, computed
here from the measured numbers.
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import RESULTS, benchmark_parser, md_table, target, targets_table, write_results  # noqa: E402

from nbmpi.server.demo import EXAMPLE, start_service, stop_service  # noqa: E402

PINGPONG = """
import numpy as np
from nbmpi.workers import ArrayChannel, world
r = world().Get_rank()
ch = ArrayChannel((10,), np.float64)
for i in range({n}):
    if r == 0:
        ch.put(1); ch.take(1)
    else:
        ch.take(0); ch.put(0)
"""
CONFIGS = [("LOD + canvas", ""), ("LOD + WebGL", "?backend=webgl"), ("all + canvas", "?detail=full"),
           ("all + WebGL", "?backend=webgl&detail=full")]
FIGURE_READY = ("return window.Bokeh && Bokeh.documents.length && window.nbmpiStats.updates.length && "
                "window.nbmpiStats.updates[0]")
WEBGL_IN_USE = """
function* walk(v) { yield v; if (v.children) for (const c of v.children()) yield* walk(c); }
for (const root of Bokeh.index) for (const v of walk(root))
  if (v.model && v.model.name === "nbmpi_quads") return v.has_webgl;
return null;
"""
MEASURE = """
window.nbmpiBench = null;
const done = (r) => { window.nbmpiBench = r; };
(async () => {
  const doc = Bokeh.documents[0];
  const xr = doc.get_model_by_name("nbmpi_x");
  const frame = () => new Promise((r) => requestAnimationFrame(() => r(performance.now())));
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const updates = () => window.nbmpiStats.updates;
  async function refined(n, t0) {          // the next window drawn after update n, or null in 15 s
    while (performance.now() < t0 + 15000) {
      if (updates().length > n) return updates()[updates().length - 1];
      await sleep(5);
    }
    return null;
  }
  const full = [xr.start, xr.end], w = full[1] - full[0];
  await frame(); await frame();
  const pan = [];
  let t = performance.now();
  for (let k = 0; k < PAN_STEPS; k++) {
    xr.setv({start: xr.start + 0.01 * w, end: xr.end + 0.01 * w});
    const f = await frame();
    pan.push(f - t);
    t = f;
  }
  await refined(updates().length - 1, performance.now());
  await sleep(400);
  const zoom = [];
  for (let k = 0; k < ZOOM_STEPS; k++) {
    const n = updates().length;
    const c = full[0] + 0.37 * w, half = w * Math.pow(0.5, k + 1) / 2;
    const t0 = performance.now();
    xr.setv({start: c - half, end: c + half});
    const f1 = await frame();
    const u = await refined(n, t0);
    zoom.push({frame_ms: f1 - t0, refined_ms: u ? u.at - t0 : null, fetch_ms: u ? u.fetch_ms : null,
               apply_ms: u ? u.apply_ms : null, shown: u ? u.shown : null, in_window: u ? u.in_window : null});
    await sleep(200);
  }
  done({pan, zoom});
})().catch((e) => done({error: String(e)}));
"""


def start_browser(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--enable-unsafe-swiftshader", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def wait_for(drv, script: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        v = drv.execute_script(script)
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {script}\n{drv.execute_script('return document.body.innerText')[:2000]}")
        time.sleep(0.2)


def run_job(c: httpx.Client, code: str, **kw) -> dict:
    job = c.post("/api/v1/jobs", json=dict(code=code, ranks=2, **kw)).json()
    while job["state"] in ("queued", "running"):
        time.sleep(0.1)
        job = c.get(f"/api/v1/jobs/{job['id']}").json()
    if job["state"] != "succeeded":
        raise RuntimeError(f"job {job['id']} {job['state']}: {job['message']}")
    return job


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else None


def take_screenshot(drv, c: httpx.Client, url: str, shot: Path) -> None:
    """Run the demo's example job and save a screenshot of its job page to ``shot``."""
    heat = run_job(c, EXAMPLE.read_text(), script_name=EXAMPLE.name, args=["--steps", "200"], name="heat (demo)")
    drv.get(f"{url}/dashboard/jobs/{heat['id']}")
    wait_for(drv, FIGURE_READY)
    time.sleep(1.0)
    shot.parent.mkdir(parents=True, exist_ok=True)
    drv.save_screenshot(str(shot))


def measure_server(c: httpx.Client, job_id) -> tuple:
    """The figure endpoint's first call and a repeat, and 10 window requests (each half the last one's span).
    Returns ``(the first figure's meta, the server figures)``."""
    t0 = time.perf_counter()
    first = c.get(f"/api/v1/dashboard/jobs/{job_id}/figure", params={"width": 1200}).json()
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    c.get(f"/api/v1/dashboard/jobs/{job_id}/figure", params={"width": 1200})
    warm = time.perf_counter() - t0
    d = first["meta"]["duration_s"]
    win = []
    for k in range(10):
        t0 = time.perf_counter()
        c.get(f"/api/v1/dashboard/jobs/{job_id}/timeline",
              params={"width": 1200, "start": d * 0.3, "end": d * (0.3 + 0.5 ** k)})
        win.append(time.perf_counter() - t0)
    return first["meta"], dict(figure_cold_s=cold, figure_warm_s=warm, window_median_s=statistics.median(win),
                               lod_rows_full_view=first["meta"]["shown"])


def measure_config(drv, url: str, job_id, name: str, query: str, pan_steps: int, zoom_steps: int) -> dict:
    """Open the job page one way (``query``), wait for the first figure, then pan and zoom in the page;
    returns that way's figures (raises RuntimeError naming the way if the page's measurement failed)."""
    drv.get(f"{url}/dashboard/jobs/{job_id}{query}")
    u0 = wait_for(drv, FIGURE_READY, timeout=300)
    webgl = drv.execute_script(WEBGL_IN_USE)
    steps = pan_steps if name.startswith("LOD") else min(pan_steps, 10)   # all segments: seconds a frame
    drv.execute_script(MEASURE.replace("PAN_STEPS", str(steps)).replace("ZOOM_STEPS", str(zoom_steps)))
    m = wait_for(drv, "return window.nbmpiBench", timeout=1800)
    if "error" in m:
        raise RuntimeError(f"{name}: {m['error']}")
    zoom = m["zoom"]
    return dict(
        first_figure_ms=u0["at"], first_rows=u0["shown"], webgl=webgl,
        pan_frame_median_ms=statistics.median(m["pan"]), pan_frame_p95_ms=pct(m["pan"], 0.95),
        zoom_frame_median_ms=statistics.median(z["frame_ms"] for z in zoom),
        refine_median_ms=pct([z["refined_ms"] for z in zoom], 0.5),
        refine_max_ms=max((z["refined_ms"] for z in zoom if z["refined_ms"] is not None), default=None),
        refine_fetch_median_ms=pct([z["fetch_ms"] for z in zoom], 0.5),
        refine_apply_median_ms=pct([z["apply_ms"] for z in zoom], 0.5),
        refined=sum(z["refined_ms"] is not None for z in zoom), zoom_steps=len(zoom),
        raw=m)


def measure(tmp: Path, rounds: int, pan_steps: int, zoom_steps: int, shot) -> dict:
    """Start the service and the browser in ``tmp``, take the screenshot (unless ``shot`` is None), run the
    ping-pong job and measure the server and every way of drawing; stops both and removes ``tmp`` after."""
    proc, url = start_service(tmp / "data", 2, config=tmp / "client.json", echo=False)
    token = json.loads((tmp / "client.json").read_text())["token"]
    drv = None
    out: dict = dict(events=None, configs={}, server={})
    try:
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300)
        drv = start_browser(str(tmp / "chromium"))
        drv.get(f"{url}/dashboard#token={token}")
        wait_for(drv, "return document.getElementById('jobs') && !document.getElementById('overview').hidden")
        if shot is not None:
            take_screenshot(drv, c, url, shot)
            out["screenshot"] = str(shot)
        big = run_job(c, PINGPONG.format(n=rounds), name=f"ping-pong x{rounds}")
        meta, out["server"] = measure_server(c, big["id"])
        out["events"] = meta["events"]
        out["segments"] = meta["in_window"]
        for name, query in CONFIGS:
            out["configs"][name] = measure_config(drv, url, big["id"], name, query, pan_steps, zoom_steps)
    finally:
        if drv is not None:
            drv.quit()
        stop_service(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def evaluate_targets(out: dict, rounds: int) -> list:
    """The targets, computed from the measured figures ``out``."""
    cf = out["configs"]
    ship, full = cf["LOD + canvas"], cf["all + canvas"]
    return [
        target("as shipped (LOD + canvas): pan frame, median ms (smooth: >= 20 frames/s)",
               ship["pan_frame_median_ms"], 50.0, False),
        target("as shipped (LOD + canvas): zoom step to refined window drawn, median ms", ship["refine_median_ms"],
               500.0, False),
        target("as shipped (LOD + canvas): every zoom step refined", ship["refined"], ship["zoom_steps"]),
        target("pan frame speed-up of LOD over all segments (canvas), x",
               full["pan_frame_median_ms"] / ship["pan_frame_median_ms"], 3.0),
        target("events in the trace", out["events"], rounds * 4),
    ]


def markdown(out: dict, rounds: int, pan_steps: int, zoom_steps: int) -> str:
    """The markdown report: the browser table, the server table, the targets."""
    rows = [[name, v["webgl"], v["first_rows"], v["first_figure_ms"], v["pan_frame_median_ms"], v["pan_frame_p95_ms"],
             v["zoom_frame_median_ms"], v["refine_median_ms"], v["refine_max_ms"], v["refine_fetch_median_ms"],
             v["refine_apply_median_ms"]] for name, v in out["configs"].items()]
    s = out["server"]
    return (f"Job: 2-rank ArrayChannel ping-pong, {rounds} round trips: {out['events']} trace events, "
            f"{out['segments']} timeline segments (compute / wait / communication). Headless Chromium "
            f"{'(WebGL in software, SwiftShader)'}, plot about 1,300 px wide.\n\n"
            "## In the browser\n\n"
            + md_table(["timeline", "WebGL used", "rows drawn (full view)", "first figure ms (page load to drawn)",
                        "pan frame median ms", "pan frame p95 ms", "zoom: first frame median ms",
                        "zoom: refined window drawn, median ms", "max ms", "fetch median ms",
                        "apply+2 frames median ms"],
                       rows)
            + f"\n\nPan: {pan_steps} steps (10 for 'all') of 1% of the full view, one animation frame each "
              f"(60 Hz: 16.7 ms at best). Zoom: {zoom_steps} steps halving the window; "
              "'refined' = from the range change to the new window's data "
              "drawn (includes the page's 120 ms debounce).\n\n"
            "## Server (cold and warm)\n\n"
            + md_table(["figure endpoint, first call s (join files, columns, Bokeh document)",
                        "figure endpoint, repeat s", "window request median s", "rows in the full-view window"],
                       [[s["figure_cold_s"], s["figure_warm_s"], s["window_median_s"], s["lod_rows_full_view"]]])
            + "\n\n## Targets\n\n" + targets_table(out["targets"]) + "\n")


def main() -> int:
    """The command: measure, evaluate the targets, write ``dashboard[_quick].json`` and ``.md``. Returns 0 iff
    every target passes."""
    ap = benchmark_parser(__doc__, "10,000 events, fewer steps, no screenshot")
    ap.add_argument("--screenshot", default=None, help="where the job page's PNG goes (default "
                    "RESULTS/dashboard.png; none with --quick)")
    args = ap.parse_args()
    rounds = 5000 if args.quick else 25000
    pan_steps, zoom_steps = (10, 4) if args.quick else (30, 8)
    shot = None if args.quick and not args.screenshot else Path(args.screenshot or (Path(args.out_dir or RESULTS) / "dashboard.png"))
    tmp = Path(tempfile.mkdtemp(prefix="nbmpi-bench-dash-"))
    out = measure(tmp, rounds, pan_steps, zoom_steps, shot)
    targets = evaluate_targets(out, rounds)
    out["targets"] = targets
    md = markdown(out, rounds, pan_steps, zoom_steps)
    write_results("dashboard_quick" if args.quick else "dashboard", out, md, Path(args.out_dir) if args.out_dir else None)
    print(md)
    return 0 if all(t["status"] == "PASS" for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
