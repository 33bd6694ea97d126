"""Controller job throughput and latency: `nbmpi serve` vs running the same job directly.

One command: ``python benchmarks/server_jobs.py [--quick] [--out DIR]``. It starts a real
``nbmpi serve`` (127.0.0.1, free port, temporary data directory) and measures

* latency: submit-to-finished of a trivial 2-rank job (POST, then poll every 20 ms
  until the state is final), side by side with the wall time of the same program
  under ``nbmpi run -n 2`` (the peer without a service), and their ratio;
* burst: N trivial 2-rank jobs submitted at once (concurrent POSTs, N=100, 10 with
  --quick) with ``--max-ranks 4``: how many succeeded, none lost, total time from the
  first POST to the last job finished, jobs per second.

Writes ``benchmarks/results/server_jobs[_quick].json`` and ``.md`` with PASS/FAIL
per target, computed here from the measured numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import md_table, target, targets_table, write_results  # noqa: E402

from nbmpi.server.demo import start_service, stop_service  # noqa: E402

TRIVIAL = "from nbmpi.workers import world\nprint('rank', world().Get_rank())\n"
FINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")


def start_server(data_dir: Path, max_ranks: int):
    """The controller via the demo's start_service, plus the generated token."""
    proc, url = start_service(data_dir, max_ranks, config=data_dir.parent / "client.json", echo=False)
    token = next(iter(json.loads((data_dir / "users.json").read_text())))
    return proc, url, token


def wait_final(c: httpx.Client, job_id: int, poll: float = 0.02, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = c.get(f"/api/v1/jobs/{job_id}").json()
        if job["state"] in FINAL:
            return job
        if time.monotonic() > deadline:
            return job
        time.sleep(poll)


def direct_run(script: Path) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "nbmpi.workers.cli", "run", "-n", "2", str(script)],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"nbmpi run failed: {p.stderr}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few samples, 10-job burst")
    ap.add_argument("--out", default=None, help="results directory (default benchmarks/results)")
    args = ap.parse_args()
    samples = 3 if args.quick else 10
    burst_n = 10 if args.quick else 100
    name = "server_jobs_quick" if args.quick else "server_jobs"
    tmp = Path(tempfile.mkdtemp(prefix="nbmpi-bench-server-"))
    script = tmp / "trivial.py"
    script.write_text(TRIVIAL)
    proc, url, token = start_server(tmp / "data", max_ranks=4)
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
            # latency, interleaved with the direct peer so both see the same machine load
            svc, direct, queue_delay = [], [], []
            for _ in range(samples):
                direct.append(direct_run(script))
                t0 = time.perf_counter()
                r = c.post("/api/v1/jobs", json=dict(code=TRIVIAL, ranks=2))
                job = wait_final(c, r.json()["id"])
                svc.append(time.perf_counter() - t0)
                if job["state"] != "succeeded":
                    raise RuntimeError(f"latency job ended {job['state']}: {job['message']}")
                queue_delay.append(job["started_at"] - job["created_at"])
            lat = dict(samples=samples, service_median_s=statistics.median(svc), service_min_s=min(svc),
                       direct_median_s=statistics.median(direct), direct_min_s=min(direct),
                       ratio_median=statistics.median(svc) / statistics.median(direct),
                       overhead_median_s=statistics.median(svc) - statistics.median(direct),
                       queue_delay_median_s=statistics.median(queue_delay), service_all_s=svc, direct_all_s=direct)

            # burst: all submitted at once
            def post(_i):
                with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as h:
                    return h.post("/api/v1/jobs", json=dict(code=TRIVIAL, ranks=2))

            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=16) as ex:
                answers = list(ex.map(post, range(burst_n)))
            t_submitted = time.perf_counter() - t0
            accepted = [a.json()["id"] for a in answers if a.status_code == 201]
            finals = [wait_final(c, i, poll=0.2) for i in accepted]
            total = time.perf_counter() - t0
            states = [j["state"] for j in finals]
            all_ids = {j["id"] for j in c.get("/api/v1/jobs").json()["jobs"]}
        burst = dict(submitted=burst_n, accepted=len(accepted), succeeded=states.count("succeeded"),
                     not_succeeded=burst_n - states.count("succeeded"), lost=states.count("lost"),
                     missing_records=len(set(accepted) - all_ids), submit_s=t_submitted, total_s=total,
                     jobs_per_s=burst_n / total, max_ranks=4)
    finally:
        stop_service(proc)
    targets = [
        target(f"burst of {burst_n}: jobs succeeded", burst["succeeded"], burst_n),
        target("burst: jobs lost or missing", burst["lost"] + burst["missing_records"], 0, higher_is_better=False),
        target("latency overhead over nbmpi run (median, s)", lat["overhead_median_s"], 0.5, higher_is_better=False),
    ]
    md = "## Latency of a trivial 2-rank job\n\n" + md_table(
        ["path", "median s", "min s"],
        [["nbmpi serve: submit -> finished (poll 20 ms)", lat["service_median_s"], lat["service_min_s"]],
         ["nbmpi run -n 2 (no service)", lat["direct_median_s"], lat["direct_min_s"]],
         ["ratio service / direct", lat["ratio_median"], ""],
         ["queue delay (created -> started)", lat["queue_delay_median_s"], ""]])
    md += f"\n\n## Burst: {burst_n} trivial 2-rank jobs submitted at once (--max-ranks 4)\n\n" + md_table(
        ["submitted", "accepted", "succeeded", "lost", "missing", "all POSTs done s", "total s", "jobs/s"],
        [[burst_n, burst["accepted"], burst["succeeded"], burst["lost"], burst["missing_records"],
          burst["submit_s"], burst["total_s"], burst["jobs_per_s"]]])
    md += "\n\n## Targets\n\n" + targets_table(targets)
    path = write_results(name, dict(quick=args.quick, latency=lat, burst=burst, targets=targets), md,
                         out_dir=Path(args.out) if args.out else None)
    print(Path(str(path)[:-5] + ".md").read_text())
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
