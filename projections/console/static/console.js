// gpuledger console: refresh the page's content when the ledger grows (server-sent
// events from /api/events), and draw the Tenants page's plots with Chart.js.
// The server renders every value, escaped; this script only swaps whole rendered
// fragments and passes numbers to the chart library, never builds HTML from data.
"use strict";

const charts = [];
// One colour per queue, the same for its allocated and its fair line.
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

function drawCharts() {
  for (const c of charts.splice(0)) c.destroy();
  const data = document.getElementById("chart-data");
  if (!data || typeof window.Chart === "undefined") return;
  const d = JSON.parse(data.textContent);
  const queues = d.tenants.map((t) => t.queue);
  const pcts = ["p50", "p90", "p95", "p99"];
  const bars = (id, suffix) => {
    const el = document.getElementById(id);
    if (!el) return;
    // The server picks the axis unit as the tables' durations pick theirs (duration_unit).
    const [per, unit] = d[`${suffix}_unit`];
    charts.push(new window.Chart(el, {
      type: "bar",
      data: {
        labels: queues,
        datasets: pcts.map((p) => ({
          label: p,
          data: d.tenants.map((t) => (t[`${p}_${suffix}`] == null ? null : t[`${p}_${suffix}`] / per)),
        })),
      },
      options: { animation: false, scales: { y: { title: { display: true, text: unit } } } },
    }));
  };
  bars("chart-ttr", "ttr_s");
  bars("chart-completion", "completion_s");
  const alloc = document.getElementById("chart-alloc");
  if (alloc) {
    const datasets = [];
    Object.entries(d.series).forEach(([queue, points], i) => {
      const color = PALETTE[i % PALETTE.length];
      const line = { pointRadius: 0, borderColor: color, backgroundColor: color };
      datasets.push({ ...line, label: `${queue} allocated`, data: points.map((p) => ({ x: p.at_s / 3600, y: p.allocated })) });
      datasets.push({ ...line, label: `${queue} fair`, data: points.map((p) => ({ x: p.at_s / 3600, y: p.fair })), borderDash: [4, 4] });
    });
    charts.push(new window.Chart(alloc, {
      type: "line",
      data: { datasets },
      options: { animation: false, parsing: false, scales: { x: { type: "linear", title: { display: true, text: "hours of ledger time" } }, y: { title: { display: true, text: "GPUs" } } } },
    }));
  }
  const usage = document.getElementById("chart-usage");
  if (usage) {
    const keys = ["allocated_gpu_hours", "running_gpu_hours", "utilised_gpu_hours"];
    charts.push(new window.Chart(usage, {
      type: "bar",
      data: { labels: d.usage.map((u) => u.queue), datasets: keys.map((k) => ({ label: k.replace(/_/g, " "), data: d.usage.map((u) => u[k]) })) },
      options: { animation: false },
    }));
  }
}

async function refresh() {
  const url = new URL(window.location.href);
  url.searchParams.set("fragment", "1");
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) return;
  const content = document.getElementById("content");
  content.innerHTML = await response.text();
  drawCharts();
}

function follow() {
  const live = document.getElementById("live");
  const offset = document.getElementById("offset");
  const source = new EventSource("/api/events");
  let shown = Number(offset.textContent);
  source.addEventListener("ledger", (e) => {
    const msg = JSON.parse(e.data);
    live.classList.toggle("stale", Boolean(msg.error));
    live.title = msg.error ? `follower: ${msg.error}` : "updates when the ledger grows";
    if (msg.next_offset !== shown) {
      shown = msg.next_offset;
      offset.textContent = String(shown);
      refresh();
    }
  });
  source.onerror = () => live.classList.add("stale");
  source.onopen = () => live.classList.remove("stale");
}

// The slider picks a moment between the first and the last record; the text field is
// what is sent, as an ISO time on a live ledger or seconds from 0 on a simulated one.
function travel() {
  const form = document.getElementById("travel");
  const slider = document.getElementById("travel-slider");
  const field = document.getElementById("travel-at");
  if (!form || !slider || !field) return;
  const wall = form.dataset.wall === "1";
  slider.addEventListener("input", () => {
    const ms = Number(slider.value);
    field.value = wall ? new Date(ms).toISOString() : `${Math.round(ms / 1000)}s`;
  });
  slider.addEventListener("change", () => form.submit());
}

// A running what-if: reload its page every second until it has finished.
function followWhatIf() {
  const run = document.getElementById("whatif-run");
  if (run && run.dataset.state === "running") window.setTimeout(() => window.location.reload(), 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  drawCharts();
  travel();
  followWhatIf();
  // A page of a past moment does not change when the ledger grows: it is not refreshed.
  if (!new URL(window.location.href).searchParams.get("at")) follow();
});
