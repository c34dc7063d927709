// The Alnair console: read-only views over the scheduler's and the dispatcher's aggregated
// APIs, reached through the API server (kubectl proxy, or any authenticating front), so every
// read is the user's own and RBAC decides what shows. Live: the scheduler's update stream says
// which view changed; the view is read again. Nothing polls.
"use strict";

const SCHED = new URL("..", location.href).href; // .../scheduler.query.alnair.io/v1alpha1/
const DISP = SCHED.replace("scheduler.query.alnair.io", "dispatcher.query.alnair.io");
const PAGE = { gpus: 100, jobs: 100 };
const state = { view: "gpus", gpuAfter: [""], jobOffset: 0, loaded: {} };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

function gpus(milli) {
  return String(Math.round(milli) / 1000);
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message;
  box.hidden = !message;
}

async function read(url) {
  const resp = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const what = url.includes("dispatcher.") ? "dispatcher" : "scheduler";
    throw new Error(`${what}: ${body.message || resp.status + " " + resp.statusText}`);
  }
  return body;
}

// --- GPUs -------------------------------------------------------------------------------

async function loadGpus() {
  const after = state.gpuAfter[state.gpuAfter.length - 1];
  const query = `limit=${PAGE.gpus}` + (after ? `&continue=${encodeURIComponent(after)}` : "");
  const doc = await read(`${SCHED}gpus?${query}`);
  const summary = document.getElementById("gpu-summary");
  summary.replaceChildren(
    el("tr", {}, ...["model", "nodes", "GPUs", "held", "free", "unhealthy", "utilization",
      "fragmentation"].map((h) => el("th", {}, h))),
    ...doc.summary.map((s) => el("tr", { "data-model": s.model },
      el("td", {}, s.model), el("td", {}, s.nodes), el("td", {}, s.gpus),
      el("td", {}, gpus(s.usedMilli)), el("td", {}, gpus(s.freeMilli)),
      el("td", {}, s.unhealthy), el("td", {}, `${s.utilizationPct}%`),
      el("td", {}, s.fragmentation))),
  );
  const map = document.getElementById("gpu-map");
  map.replaceChildren(...doc.items.map((n) => {
    const cells = n.gpus.map((g) => {
      const kind = !g.healthy ? "bad" : g.usedMilli >= 1000 ? "used" : g.usedMilli > 0 ? "part" : "free";
      const who = g.holders.map((h) => `${h.pod} ${gpus(h.milli)}`).join(", ") || "nobody";
      const title = `GPU ${g.index}: ${g.healthy ? "healthy" : "unhealthy"}, ` +
        `${gpus(g.usedMilli)} held by ${who}, ${g.utilizationPct}% busy`;
      return el("span", { class: `cell ${kind}`, title, "data-gpu": g.index });
    });
    const tint = `background: rgba(224, 160, 48, ${0.45 * n.fragmentation})`;
    return el("div", { class: "node", style: tint, "data-node": n.node, title: `${n.node} (${n.model})` },
      el("div", { class: "name" }, n.node), el("div", { class: "cells" }, ...cells));
  }));
  pager("gpu-pager", state.gpuAfter.length > 1, Boolean(doc.metadata.continue),
    () => { state.gpuAfter.pop(); loadGpus().catch(fail); },
    () => { state.gpuAfter.push(doc.metadata.continue); loadGpus().catch(fail); });
  state.loaded.gpus = true;
}

// --- Queues -----------------------------------------------------------------------------

function usageBar(used, nominal, limit) {
  const top = Math.max(used, nominal + (limit || 0), 1);
  const bar = el("div", { class: "bar", title: `${used} used of ${nominal} nominal` +
    (limit !== undefined ? `, borrowing limit ${limit}` : "") });
  bar.append(el("div", { class: "fill", style: `width: ${(100 * Math.min(used, nominal)) / top}%` }));
  if (used > nominal) {
    bar.append(el("div", { class: "over",
      style: `left: ${(100 * nominal) / top}%; width: ${(100 * (used - nominal)) / top}%` }));
  }
  bar.append(el("div", { class: "limit", style: `left: ${(100 * nominal) / top}%` }));
  return bar;
}

async function loadQueues() {
  const doc = await read(`${DISP}clusterqueues`);
  const table = document.getElementById("queue-table");
  const rows = [];
  for (const q of doc.items) {
    const models = Object.keys(q.nominal).length ? Object.keys(q.nominal) : [""];
    for (const m of models) {
      const used = (q.used || {})[m] || 0;
      rows.push(el("tr", { "data-queue": q.name },
        el("td", {}, q.name), el("td", {}, q.cohort || ""),
        el("td", {}, q.active ? "active" : `inactive: ${q.problem || ""}`),
        el("td", {}, m), el("td", {}, usageBar(used, q.nominal[m] || 0, (q.borrowingLimit || {})[m])),
        el("td", {}, `${used} / ${q.nominal[m] || 0}`), el("td", {}, q.borrowed),
        el("td", {}, q.lent), el("td", {}, q.pending), el("td", {}, q.admitted)));
    }
  }
  table.replaceChildren(
    el("tr", {}, ...["queue", "cohort", "state", "GPU model", "use against quota", "used",
      "borrowed", "lent", "pending", "admitted"].map((h) => el("th", {}, h))),
    ...rows);
  state.loaded.queues = true;
}

// --- Jobs -------------------------------------------------------------------------------

function when(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const delta = Math.round(seconds - Date.now() / 1000);
  const abs = Math.abs(delta);
  const text = abs < 120 ? `${abs}s` : abs < 7200 ? `${Math.round(abs / 60)}m` : `${Math.round(abs / 3600)}h`;
  return delta >= 0 ? `in ${text}` : `${text} ago`;
}

async function loadJobs() {
  const ns = document.getElementById("ns").value.trim();
  const base = ns ? `${DISP}namespaces/${encodeURIComponent(ns)}/queuedworkloads` : `${DISP}queuedworkloads`;
  const doc = await read(`${base}?limit=${PAGE.jobs}&continue=${state.jobOffset}`);
  const now = Date.now() / 1000;
  const ends = doc.items.map((j) => j.predicted_finish_s || 0).filter((t) => t > now);
  const horizon = Math.max(3600, ...ends.map((t) => t - now));
  const rows = doc.items.map((j) => {
    const start = j.predicted_start_s ?? now;
    const finish = j.predicted_finish_s ?? start;
    const left = Math.max(0, (100 * (start - now)) / horizon);
    const width = Math.max(1, (100 * (finish - Math.max(start, now))) / horizon);
    const reason = j.reason ? `${j.reason.kind}: ${j.reason.message}` : "";
    return el("div", { class: `row ${j.status}`, "data-job": j.job, title: reason,
      onclick: () => why(j).catch(fail) },
    el("span", {}, j.job), el("span", { class: `status-${j.status}` }, j.status),
    el("span", {}, j.status === "waiting" ? `#${j.position ?? "?"} ${j.reason ? j.reason.kind : ""}`
      : `${j.gpu_model || ""} ${when(j.predicted_finish_s) ? "ends " + when(j.predicted_finish_s) : ""}`),
    el("div", { class: "span" }, el("i", { style: `left: ${left}%; width: ${Math.min(width, 100 - left)}%` })));
  });
  document.getElementById("timeline").replaceChildren(...rows);
  pager("jobs-pager", state.jobOffset > 0, Boolean(doc.metadata.continue),
    () => { state.jobOffset = Math.max(0, state.jobOffset - PAGE.jobs); loadJobs().catch(fail); },
    () => { state.jobOffset = Number(doc.metadata.continue); loadJobs().catch(fail); });
  state.loaded.jobs = true;
}

async function why(job) {
  const [ns, name] = job.job.split("/");
  const plural = job.kind.toLowerCase() + "s";
  const doc = await read(`${DISP}namespaces/${ns}/${plural}/${name}`);
  const w = doc.workload;
  const fields = [["workload", `${w.kind} ${w.job}`], ["status", w.status],
    ["queue", `${w.queue || ""} (${w.cluster_queue || "?"})`], ["policy", w.policy],
    ["position", w.position], ["GPU model", w.gpu_model],
    ["waits for", w.reason && w.reason.kind], ["because", w.reason && w.reason.message],
    ["predicted start", when(w.predicted_start_s)], ["predicted finish", when(w.predicted_finish_s)]];
  const box = document.getElementById("why");
  box.replaceChildren(el("dl", {}, ...fields.filter(([, v]) => v !== null && v !== undefined && v !== "")
    .flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
  el("button", { type: "button", onclick: () => { box.hidden = true; } }, "close"));
  box.hidden = false;
}

// --- frame ------------------------------------------------------------------------------

function pager(id, back, more, onBack, onMore) {
  const box = document.getElementById(id);
  box.replaceChildren(
    el("button", back ? { type: "button", onclick: onBack } : { type: "button", disabled: "" }, "previous"),
    el("button", more ? { type: "button", onclick: onMore } : { type: "button", disabled: "" }, "next"));
}

function fail(err) {
  showError(err.message || String(err));
}

const loaders = { gpus: loadGpus, queues: loadQueues, jobs: loadJobs };
const timers = {};

function reload(view) {
  // Several updates in a moment are one read.
  clearTimeout(timers[view]);
  timers[view] = setTimeout(() => {
    if (state.view === view) loaders[view]().then(() => showError("")).catch(fail);
    else state.loaded[view] = false;
  }, 250);
}

function show(view) {
  state.view = loaders[view] ? view : "gpus";
  for (const section of document.querySelectorAll(".view")) {
    section.classList.toggle("shown", section.id === state.view);
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.view === state.view);
  }
  if (!state.loaded[state.view]) loaders[state.view]().then(() => showError("")).catch(fail);
}

function live() {
  const badge = document.getElementById("live");
  const stream = new EventSource(`${SCHED}updates`);
  stream.onopen = () => {
    badge.textContent = "live";
    badge.className = "live on";
    // Back after a drop (a slow tab, a restart): what changed meanwhile was not said.
    if (state.wasLive) Object.keys(loaders).forEach(reload);
    state.wasLive = true;
  };
  stream.onerror = () => { badge.textContent = "reconnecting"; badge.className = "live off"; };
  stream.addEventListener("gpus", () => reload("gpus"));
  stream.addEventListener("queues", () => reload("queues"));
  stream.addEventListener("jobs", () => reload("jobs"));
}

window.addEventListener("hashchange", () => show(location.hash.slice(1)));
document.getElementById("jobs-filter").addEventListener("submit", (e) => {
  e.preventDefault();
  state.jobOffset = 0;
  loadJobs().catch(fail);
});
show(location.hash.slice(1) || "gpus");
live();
