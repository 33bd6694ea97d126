"""Controller jobs: latency against the same launch without the service, and a burst of trivial jobs.

One command: ``python benchmarks/server_jobs.py [--quick] [--burst N] [--out-dir DIR]``. It starts a
real ``nbmpi serve`` (127.0.0.1, free port, temporary data directory, ``--max-ranks 4``) and measures

* latency of a trivial 2-rank job, side by side and interleaved so all paths see the same load:
  submit-to-finished through the service (POST, then poll every 20 ms until final), the same
  launch path without the service (:func:`nbmpi.workers.launch.launcher.run` called in this process:
  mpiexec, rank guards, rank_entry, trace), and ``nbmpi run -n 2`` as a user types it (which also
  pays for starting the ``nbmpi`` command); the load average is recorded with every sample;
* a burst: N trivial 1-rank jobs submitted at once (16 concurrent clients; N = 1000, 20 with
  --quick): how many succeeded, none lost or missing, the most ranks the records show running at
  once (must stay within --max-ranks), and the slowest ``/api/health`` answer while it ran
  (polled every 100 ms; target within 1 s).

Writes ``benchmarks/results/server_jobs[_quick].json`` and ``.md``; targets are checked from the
measured numbers.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import benchmark_parser, md_table, target, targets_table, write_results  # noqa: E402

from nbmpi.server.client import ApiError, Client  # noqa: E402
from nbmpi.server.demo import start_service, stop_service  # noqa: E402
from nbmpi.workers.launch import launcher# noqa: E402

TRIVIAL = "from nbmpi.workers import world\nprint('rank', world().Get_rank())\n"
MAX_RANKS = 4


def load() -> float:
    """The 1-minute load average now."""
    return os.getloadavg()[0]


def timed(fn) -> tuple:
    """(seconds fn took, load average when it ended)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, load()


def max_concurrent_ranks(jobs) -> int:
    """The most ranks the records show running at the same time (from started_at / finished_at)."""
    edges = []
    for j in jobs:
        if j["started_at"] and j["finished_at"]:
            edges += [(j["started_at"], j["ranks"]), (j["finished_at"], -j["ranks"])]
    best = cur = 0
    for _, d in sorted(edges, key=lambda e: (e[0], e[1])):   # an end before a start at the same instant
        cur += d
        best = max(best, cur)
    return best


def latency(c: Client, script: Path, samples: int) -> dict:
    def via_service():
        job = c.wait(c.submit(TRIVIAL, ranks=2)["id"], print_logs=False, poll=0.02)
        if job["state"] != "succeeded":
            raise RuntimeError(f"latency job ended {job['state']}: {job['message']}")

    def same_launch():
        with open(os.devnull, "w") as null:
            rc = launcher.run(2, [str(script)], stdout=null, quiet=True)
        if rc != 0:
            raise RuntimeError(f"launcher.run exited {rc}")

    def nbmpi_run():
        p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbmpi"), "run", "-n", "2", str(script)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"nbmpi run failed: {p.stderr}")

    paths = {"service": via_service, "launch": same_launch, "cli": nbmpi_run}
    for fn in paths.values():   # warm the OS caches once for every path
        fn()
    got = {k: [] for k in paths}
    for _ in range(samples):
        for k, fn in paths.items():
            got[k].append(timed(fn))
    out = {k: dict(median_s=statistics.median(t for t, _ in v), min_s=min(t for t, _ in v),
                   load_median=statistics.median(l for _, l in v), load_max=max(l for _, l in v),
                   all_s=[t for t, _ in v]) for k, v in got.items()}
    out["overhead_median_s"] = out["service"]["median_s"] - out["launch"]["median_s"]
    out["ratio_median"] = out["service"]["median_s"] / out["launch"]["median_s"]
    out["samples"] = samples
    return out


def burst(url: str, token: str, n: int) -> dict:
    health = []
    stop = threading.Event()

    def poll_health():
        with Client(url, None, timeout=30) as h:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    h.health()
                    health.append(time.perf_counter() - t0)
                except ApiError:
                    health.append(float("inf"))
                stop.wait(0.1)

    def post(_i):
        with Client(url, token, timeout=120) as h:
            try:
                return h.submit(TRIVIAL, ranks=1)["id"]
            except ApiError as exc:
                return exc

    watcher = threading.Thread(target=poll_health, daemon=True)
    watcher.start()
    loads = [load()]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as ex:
        answers = list(ex.map(post, range(n)))
    submitted_s = time.perf_counter() - t0
    accepted = [a for a in answers if isinstance(a, int)]
    with Client(url, token, timeout=120) as c:
        last_report = time.monotonic()
        while True:
            jobs = {j["id"]: j for j in c.jobs()}
            live = [i for i in accepted if jobs.get(i, {}).get("state") in ("queued", "running")]
            if not live:
                break
            if time.monotonic() - last_report > 15:
                last_report = time.monotonic()
                loads.append(load())
                print(f"  burst: {n - len(live)}/{n} final after {time.perf_counter() - t0:.0f} s", flush=True)
            time.sleep(0.5)
    total_s = time.perf_counter() - t0
    stop.set()
    watcher.join()
    loads.append(load())
    finals = [jobs[i] for i in accepted if i in jobs]
    states = [j["state"] for j in finals]
    return dict(submitted=n, accepted=len(accepted), refused=[str(a) for a in answers if not isinstance(a, int)][:5],
                succeeded=states.count("succeeded"), lost=states.count("lost"),
                missing_records=len(set(accepted) - set(jobs)), max_concurrent_ranks=max_concurrent_ranks(finals),
                max_ranks=MAX_RANKS, submit_s=submitted_s, total_s=total_s, jobs_per_s=n / total_s,
                health_max_s=max(health), health_median_s=statistics.median(health), health_samples=len(health),
                load_median=statistics.median(loads), load_max=max(loads))


def main() -> int:
    ap = benchmark_parser(__doc__, "3 latency samples and a burst of 20 (the test suite)")
    ap.add_argument("--burst", type=int, default=None, metavar="N", help="jobs in the burst (default 1000)")
    args = ap.parse_args()
    samples = 3 if args.quick else 10
    burst_n = args.burst or (20 if args.quick else 1000)
    name = "server_jobs_quick" if args.quick else "server_jobs"
    tmp = Path(tempfile.mkdtemp(prefix="nbmpi-bench-server-"))
    script = tmp / "trivial.py"
    script.write_text(TRIVIAL)
    data_dir = tmp / "data"
    proc, url = start_service(data_dir, MAX_RANKS, config=tmp / "client.json", echo=False)
    token = json.loads((tmp / "client.json").read_text())["token"]
    try:
        with Client(url, token, timeout=120) as c:
            print(f"latency: {samples} samples of each path", flush=True)
            lat = latency(c, script, samples)
        print(f"burst: {burst_n} jobs", flush=True)
        b = burst(url, token, burst_n)
    finally:
        stop_service(proc)
    targets = [
        target(f"burst of {burst_n}: jobs succeeded", b["succeeded"], burst_n),
        target("burst: jobs lost or records missing", b["lost"] + b["missing_records"], 0, higher_is_better=False),
        target(f"burst: most ranks running at once (--max-ranks {MAX_RANKS})", b["max_concurrent_ranks"], MAX_RANKS,
               higher_is_better=False),
        target("burst: slowest /api/health answer (s)", b["health_max_s"], 1.0, higher_is_better=False),
        target("latency: service overhead over the same launch (median, s)", lat["overhead_median_s"], 0.5,
               higher_is_better=False),
    ]
    rows = [["nbmpi serve: submit -> finished (poll 20 ms)", "service"],
            ["same launch without the service (launcher.run in-process)", "launch"],
            ["nbmpi run -n 2 (the command, as users type it)", "cli"]]
    md = "## Latency of a trivial 2-rank job (interleaved samples)\n\n" + md_table(
        ["path", "median s", "min s", "load median", "load max"],
        [[label, lat[k]["median_s"], lat[k]["min_s"], lat[k]["load_median"], lat[k]["load_max"]]
         for label, k in rows])
    md += (f"\n\nservice / same launch: {lat['ratio_median']:.3f} (median), overhead "
           f"{lat['overhead_median_s']:.3f} s\n")
    md += f"\n## Burst: {burst_n} trivial 1-rank jobs submitted at once (--max-ranks {MAX_RANKS})\n\n" + md_table(
        ["submitted", "succeeded", "lost", "missing", "max ranks at once", "all POSTs done s", "total s", "jobs/s",
         "health max s", "load median", "load max"],
        [[burst_n, b["succeeded"], b["lost"], b["missing_records"], b["max_concurrent_ranks"], b["submit_s"],
          b["total_s"], b["jobs_per_s"], b["health_max_s"], b["load_median"], b["load_max"]]])
    md += "\n\n## Targets\n\n" + targets_table(targets)
    path = write_results(name, dict(quick=args.quick, latency=lat, burst=b, targets=targets), md,
                         out_dir=Path(args.out_dir) if args.out_dir else None)
    print(Path(str(path)[:-5] + ".md").read_text())
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
