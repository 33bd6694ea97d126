// The nbmpi dashboard page: log in with a token kept for the tab, list pools and jobs live,
// show one job (facts, logs, the Bokeh timeline figure that grows while the job runs).
// Every request goes to this page's own origin with "Authorization: Bearer TOKEN".
// Every URL is relative to the controller's root, which the page gets from its <meta name="nbmpi-root">
// (relative to the page's address), so the page also works under a proxy's prefix
// (jupyter-server-proxy: /proxy/PORT/dashboard/).
"use strict";
(function () {
  const KEY = "nbmpi-token";
  const POLL_MS = 1000;
  const LIVE = new Set(["queued", "running"]);
  // page options in the address: ?backend=webgl (draw with WebGL; the default canvas is faster for the
  // few thousand bars that the level of detail leaves, and does not depend on a GPU) and ?detail=full
  // (no level of detail)
  const OPTS = new URLSearchParams(location.search);
  const BACKEND = OPTS.get("backend") === "webgl" ? "webgl" : "canvas";
  const FULL = OPTS.get("detail") === "full";
  const $ = (id) => document.getElementById(id);
  const ROOT = new URL(document.querySelector('meta[name="nbmpi-root"]').content, location.href).pathname;
  const at = (path) => ROOT + path.replace(/^\//, "");   // "/api/v1/jobs" -> ROOT + "api/v1/jobs"
  const S = {
    token: null, timer: null, jobId: null, job: null, doc: null, version: null, follow: true,
    applying: 0, seq: 0, figureTried: false, logOffsets: {}, figureWidth: 1200, lastSet: [0, 0],
  };
  // measurements the tests and the benchmark read (no effect on the page)
  window.nbmpiStats = { updates: [], polls: 0, lastError: null };

  class Unauthorized extends Error {}

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "dataset") Object.assign(e.dataset, v);
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null) e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
    return e;
  }

  async function detail(r) {
    try {
      const j = await r.json();
      return typeof j.detail === "string" ? j.detail : JSON.stringify(j.detail);
    } catch (e) {
      return `${r.status} ${r.statusText}`;
    }
  }

  async function api(path, opts) {
    const o = Object.assign({ cache: "no-store" }, opts || {});
    o.headers = Object.assign({ Authorization: "Bearer " + S.token }, o.headers || {});
    const r = await fetch(at(path), o);
    if (r.status === 401) throw new Unauthorized(await detail(r));
    if (!r.ok) {
      const e = new Error(await detail(r));
      e.status = r.status;
      throw e;
    }
    return r;
  }

  // -- time formatting -------------------------------------------------------------------
  // a job id that is not one of the user's jobs: say so, and show nothing of a job page
  function showNoSuchJob() {
    $("job-title").textContent = `No such job: #${S.jobId}`;
    document.title = `nbmpi: no such job ${S.jobId}`;
    $("job-facts").replaceChildren();
    for (const id of ["job-actions", "logs-title", "logs", "figure", "sentence", "blocked"]) $(id).hidden = true;
    $("figure-note").textContent = `There is no job ${S.jobId} among your jobs (it never existed, or it is another user's).`;
  }

  const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString([], { hour12: false }) : "-");
  function span(s) {
    if (s == null || !isFinite(s)) return "-";
    if (s < 1) return `${(s * 1000).toFixed(0)} ms`;
    if (s < 120) return `${s.toFixed(1)} s`;
    if (s < 7200) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    return `${(s / 3600).toFixed(1)} h`;
  }
  const now = () => Date.now() / 1000;

  // -- log in / out --------------------------------------------------------------------------
  function show(section) {
    for (const id of ["login", "overview", "job"]) $(id).hidden = id !== section;
    $("logout").hidden = section === "login";
  }

  function showLogin(message) {
    clearTimeout(S.timer);
    S.timer = null;
    show("login");
    $("who").textContent = "";
    const err = $("login-error");
    err.hidden = !message;
    err.textContent = message || "";
    $("token").focus();
  }

  async function login(token, fromForm) {
    S.token = token;
    try {
      const me = await (await api("/api/v1/dashboard/me")).json();
      sessionStorage.setItem(KEY, token);
      $("who").textContent = `user ${me.user}`;
      $("login-error").hidden = true;
      route();
    } catch (e) {
      sessionStorage.removeItem(KEY);
      S.token = null;
      if (e instanceof Unauthorized) {
        showLogin(fromForm ? "Wrong token: the service refused it (401). Use a token from the service's users file."
          : "Your token is no longer accepted (401); log in again.");
      } else {
        showLogin(`Cannot reach the service: ${e.message}`);
      }
    }
  }

  function onAuthError(e) {
    if (e instanceof Unauthorized) {
      sessionStorage.removeItem(KEY);
      S.token = null;
      showLogin("Your token is no longer accepted (401); log in again.");
      return true;
    }
    window.nbmpiStats.lastError = String(e && e.message || e);
    return false;
  }

  // -- the overview: pools and jobs --------------------------------------------------------------
  function stateCell(state) {
    return el("td", {}, el("span", { class: `state state-${state}` }, state));
  }

  function renderPools(answer) {
    const body = $("pools").querySelector("tbody");
    const note = $("pools-note");
    body.replaceChildren();
    if (answer.disabled) {
      note.hidden = false;
      note.textContent = answer.disabled;
      return;
    }
    note.hidden = answer.pools.length > 0;
    note.textContent = "No pools. Start one with %distributed connect or POST /api/v1/pools.";
    for (const p of answer.pools.slice().reverse()) {
      const idle = p.state === "running" ? now() - (p.last_used_at || p.started_at || p.created_at) : null;
      const stoppable = p.state === "running" || p.state === "starting";
      const stop = el("button", {
        class: "stop", onclick: async (ev) => {
          ev.target.disabled = true;
          ev.target.textContent = "stopping...";
          try { await api(`/api/v1/pools/${p.id}`, { method: "DELETE" }); } catch (e) { if (onAuthError(e)) return; alertRow(ev.target, e); }
          refreshOverview();
        },
      }, "stop");
      body.append(el("tr", { dataset: { pool: p.id } },
        el("td", {}, p.id), el("td", {}, p.name || "-"), stateCell(p.state), el("td", {}, p.ranks),
        el("td", {}, p.owner), el("td", {}, idle == null ? "-" : span(idle)),
        el("td", {}, p.idle_timeout ? span(p.idle_timeout) : "none"), el("td", {}, clock(p.started_at)),
        el("td", { class: "message" }, p.message || ""), el("td", {}, stoppable ? stop : "")));
    }
  }

  function alertRow(button, e) {
    button.replaceWith(el("span", { class: "error" }, e.message));
  }

  function cancelButton(job, onDone) {
    return el("button", {
      class: "cancel", onclick: async (ev) => {
        ev.target.disabled = true;
        ev.target.textContent = "cancelling...";
        try {
          await api(`/api/v1/jobs/${job.id}`, { method: "DELETE" });
        } catch (e) {
          if (onAuthError(e)) return;
          alertRow(ev.target, e);
        }
        onDone();
      },
    }, "cancel");
  }

  function runTime(j) {
    if (!j.started_at) return "-";
    return span((j.finished_at || now()) - j.started_at);
  }

  function renderJobs(jobs) {
    const body = $("jobs").querySelector("tbody");
    body.replaceChildren();
    if (!jobs.length) {
      body.append(el("tr", {}, el("td", { colspan: 11, class: "note" },
        "No jobs yet. Submit one with `nbmpi submit script.py -n 2`.")));
    }
    for (const j of jobs.slice().reverse()) {
      body.append(el("tr", { dataset: { job: j.id } },
        el("td", {}, el("a", { href: at(`/dashboard/jobs/${j.id}`), class: "job-link" }, `#${j.id}`)),
        el("td", {}, j.name || j.script_name), stateCell(j.state), el("td", {}, j.ranks),
        el("td", {}, clock(j.created_at)), el("td", {}, clock(j.started_at)), el("td", {}, runTime(j)),
        el("td", {}, j.exit_code == null ? "-" : j.exit_code),
        el("td", {}, j.rank_exit_codes ? j.rank_exit_codes.map((c) => (c == null ? "-" : c)).join(" ") : "-"),
        el("td", { class: "message" }, j.message || ""),
        el("td", {}, LIVE.has(j.state) ? cancelButton(j, refreshOverview) : "")));
    }
  }

  async function refreshOverview() {
    clearTimeout(S.timer);
    try {
      const [jobs, pools] = await Promise.all([
        api("/api/v1/jobs").then((r) => r.json()),
        api("/api/v1/pools").then((r) => r.json()).catch((e) => {
          if (e.status === 501) return { disabled: e.message };
          throw e;
        }),
      ]);
      renderPools(pools);
      renderJobs(jobs.jobs);
      $("refreshed").textContent = `refreshed ${clock(now())}, every ${POLL_MS / 1000} s`;
      window.nbmpiStats.polls++;
    } catch (e) {
      if (onAuthError(e)) return;
      $("refreshed").textContent = `refresh failed: ${e.message}; retrying`;
    }
    S.timer = setTimeout(refreshOverview, POLL_MS);
  }

  // -- one job -----------------------------------------------------------------------------------
  function renderFacts(j) {
    $("job-title").textContent = `Job #${j.id}: ${j.name || j.script_name}`;
    for (const id of ["job-actions", "logs-title", "logs", "figure", "sentence", "blocked"]) $(id).hidden = false;
    document.title = `nbmpi job ${j.id} (${j.state})`;
    const facts = $("job-facts");
    const codes = j.rank_exit_codes ? j.rank_exit_codes.map((c, r) => `rank ${r}: ${c == null ? "-" : c}`).join(", ") : "-";
    const items = [
      ["state", el("span", { class: `state state-${j.state}`, id: "job-state" }, j.state)], ["ranks", j.ranks],
      ["submitted", clock(j.created_at)], ["started", clock(j.started_at)], ["finished", clock(j.finished_at)],
      ["run time", runTime(j)], ["exit code", j.exit_code == null ? "-" : j.exit_code], ["per rank", codes],
      ["script", j.script_name + (j.args.length ? " " + j.args.join(" ") : "")],
    ];
    if (j.pool) items.push(["pool", j.pool]);
    if (j.message) items.push(["message", j.message]);
    facts.replaceChildren(...items.map(([k, v]) => el("div", {}, el("span", { class: "k" }, k), el("span", { class: "v" }, v))));
    $("job-cancel").hidden = !LIVE.has(j.state);
    const dl = $("download");
    dl.classList.toggle("disabled", !j.trace_available);
    $("download-note").textContent = j.trace_available
      ? "(Chrome trace JSON: open it in Perfetto, ui.perfetto.dev, or chrome://tracing)"
      : (LIVE.has(j.state) ? "(available when the job has ended)" : "(being written from what the ranks recorded, or none was recorded)");
  }

  async function downloadTrace(ev) {
    ev.preventDefault();
    if (!S.job || !S.job.trace_available) return;
    try {
      const blob = await (await api(`/api/v1/jobs/${S.jobId}/trace`)).blob();
      const url = URL.createObjectURL(blob);
      const a = el("a", { href: url, download: `nbmpi-job-${S.jobId}-trace.json` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      if (!onAuthError(e)) $("download-note").textContent = `download failed: ${e.message}`;
    }
  }

  async function refreshLogs(j) {
    const box = $("logs");
    const n = Math.min(j.ranks, 64);
    if (box.childElementCount !== n) {
      box.replaceChildren();
      for (let r = 0; r < n; r++) {
        box.append(el("details", { open: r < 4 ? "" : null, dataset: { rank: r } },
          el("summary", {}, `rank ${r}`),
          el("pre", { class: "stdout", dataset: { rank: r } }), el("pre", { class: "stderr", dataset: { rank: r } })));
      }
      if (j.ranks > n) box.append(el("p", { class: "note" }, `showing ranks 0-${n - 1} of ${j.ranks}; others: nbmpi logs ${j.id} --rank R`));
    }
    const fetches = [];
    for (const d of box.querySelectorAll("details")) {
      if (!d.open) continue;
      const r = Number(d.dataset.rank);
      for (const stream of ["stdout", "stderr"]) {
        const key = `${r}.${stream}`;
        const off = S.logOffsets[key] || 0;
        fetches.push(api(`/api/v1/jobs/${j.id}/logs?rank=${r}&stream=${stream}&offset=${off}`).then(async (resp) => {
          const text = await resp.text();
          S.logOffsets[key] = Number(resp.headers.get("X-Log-Size") || off);
          if (text) {
            const pre = d.querySelector(`pre.${stream}`);
            pre.textContent = (pre.textContent + text).slice(-1 << 20);
          }
        }));
      }
    }
    await Promise.all(fetches);
  }

  function model(name) {
    return S.doc ? S.doc.get_model_by_name(name) : null;
  }

  function setNarrative(a) {
    $("sentence").textContent = a.sentence || "";
    const ul = $("blocked");
    ul.replaceChildren(...(a.blocked || []).map((s) => el("li", {}, s)));
  }

  function frames(n) {
    return new Promise((resolve) => {
      const step = (k) => (k ? requestAnimationFrame(() => step(k - 1)) : resolve());
      step(n);
    });
  }

  async function applyWindow(a, t0, t1) {
    S.version = a.version;
    S.applying++;
    try {
      for (const [name, data] of Object.entries(a.sources || {})) {
        const m = model(name);
        if (m) m.data = data;
      }
      const xr = model("nbmpi_x");
      if (S.follow && xr && a.meta && (xr.start !== 0 || Math.abs(xr.end - a.meta.duration_s) > 1e-12)) {
        S.lastSet = [0, a.meta.duration_s];
        xr.setv({ start: 0, end: a.meta.duration_s });
      }
    } finally {
      S.applying--;
    }
    setNarrative(a);
    const meta = a.meta || {};
    $("figure-note").textContent = `${meta.events} events; ${meta.shown} of ${meta.in_window} segments drawn in this ` +
      `window${meta.merged ? " (those narrower than a pixel merged: zoom in for detail)" : ""}; ` +
      `${meta.arrows_shown} of ${meta.arrows_in_window} messages.` + (S.follow ? "" : " Zoomed in: the reset tool shows the whole run again.");
    await frames(2);
    const t2 = performance.now();
    window.nbmpiStats.updates.push({ at: t2, fetch_ms: t1 - t0, apply_ms: t2 - t1, total_ms: t2 - t0, shown: meta.shown,
      in_window: meta.in_window, start: meta.start_s, end: meta.end_s });
  }

  function windowQuery() {
    const xr = model("nbmpi_x");
    let q = `width=${FULL ? 0 : S.figureWidth}`;
    if (!S.follow && xr) q += `&start=${Math.max(xr.start, 0)}&end=${Math.max(xr.end, 0)}`;
    return q;
  }

  async function fetchWindow() {
    const seq = ++S.seq;
    const t0 = performance.now();
    try {
      const a = await (await api(`/api/v1/dashboard/jobs/${S.jobId}/timeline?${windowQuery()}`)).json();
      const t1 = performance.now();
      if (seq !== S.seq || !a.available) return;   // a newer window was asked meanwhile
      await applyWindow(a, t0, t1);
    } catch (e) {
      onAuthError(e);
    }
  }

  let debounce = null;
  window.nbmpiRangeChanged = function (start, end) {
    const eps = 1e-9 * Math.max(1, Math.abs(S.lastSet[1]));
    if (S.applying || (Math.abs(start - S.lastSet[0]) <= eps && Math.abs(end - S.lastSet[1]) <= eps)) return;
    S.follow = false;
    clearTimeout(debounce);
    debounce = setTimeout(fetchWindow, 120);
  };

  // the figure's reset tool: back to the whole run, following it while the job runs
  window.nbmpiReset = function () {
    S.follow = true;
    clearTimeout(debounce);
    fetchWindow();
  };

  async function loadFigure(j) {
    const box = $("figure");
    S.figureWidth = Math.max(Math.floor(box.clientWidth) - 80, 400);
    const a = await (await api(`/api/v1/dashboard/jobs/${j.id}/figure?width=${FULL ? 0 : S.figureWidth}` +
      `&backend=${BACKEND}`)).json();
    if (!a.available) {
      $("figure-note").textContent = `No timeline: ${a.reason}.`;
      $("figure-note").classList.toggle("unreadable", /^trace unreadable/.test(a.reason || ""));
      if (/being indexed/.test(a.reason || "")) S.figureTried = false;   // ask again at the next refresh
      return false;
    }
    $("figure-note").textContent = "";
    const views = await window.Bokeh.embed.embed_item(a.item, "figure");
    S.doc = (views && views[0] && views[0].model && views[0].model.document) || window.Bokeh.documents[window.Bokeh.documents.length - 1];
    S.version = a.version;
    S.lastSet = [a.meta.start_s, a.meta.end_s];
    const t = performance.now();
    await applyWindow(a, t, t);
    return true;
  }

  async function pollTimeline(final) {
    const seq = S.seq;
    const since = final ? "" : `since=${S.version}&`;   // the job ended: one last full answer
    const a = await (await api(`/api/v1/dashboard/jobs/${S.jobId}/timeline?${since}${windowQuery()}`)).json();
    if (!a.available || a.unchanged || seq !== S.seq) return;
    const t = performance.now();
    await applyWindow(a, t, t);
  }

  async function refreshJob() {
    clearTimeout(S.timer);
    let live = true;
    try {
      const wasLive = !S.job || LIVE.has(S.job.state);
      const j = await (await api(`/api/v1/jobs/${S.jobId}`)).json();
      S.job = j;
      live = LIVE.has(j.state);
      renderFacts(j);
      if (wasLive || !S.logsDone) {
        await refreshLogs(j);
        S.logsDone = !live;
      }
      if (!S.doc) {
        if (live || !S.figureTried) {
          S.figureTried = true;
          await loadFigure(j);
        }
      } else if (wasLive) {
        await pollTimeline(!live);
      }
      window.nbmpiStats.polls++;
    } catch (e) {
      if (onAuthError(e)) return;
      if (e.status === 404) return showNoSuchJob();
      $("figure-note").textContent = `Refresh failed: ${e.message}`;
    }
    // a job just ended: its trace index and Chrome trace are written after its record (a few polls)
    const settling = !live && (!S.figureTried || (S.job && !S.job.trace_available)) && (S.settle = (S.settle || 0) + 1) <= 40;
    if (live || settling) S.timer = setTimeout(refreshJob, POLL_MS);
  }

  // -- routing ------------------------------------------------------------------------------------
  function route() {
    const m = /\/dashboard\/jobs\/(\d+)\/?$/.exec(location.pathname);
    if (m) {
      S.jobId = Number(m[1]);
      show("job");
      refreshJob();
    } else {
      show("overview");
      refreshOverview();
    }
  }

  function start() {
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (m) {   // a token link: keep the token for this tab, drop it from the address bar and history
      sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      login($("token").value.trim(), true);
    });
    $("logout").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      S.token = null;
      showLogin("Logged out.");
    });
    $("job-cancel").addEventListener("click", async (ev) => {
      ev.target.disabled = true;
      try {
        await api(`/api/v1/jobs/${S.jobId}`, { method: "DELETE" });
      } catch (e) {
        if (!onAuthError(e)) $("figure-note").textContent = `Cancel failed: ${e.message}`;
      }
      ev.target.disabled = false;
      refreshJob();
    });
    $("download").addEventListener("click", downloadTrace);
    const token = sessionStorage.getItem(KEY);
    if (token) login(token, false);
    else showLogin(null);
  }

  start();
})();
