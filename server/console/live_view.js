// The live view: /console/live read once a second, kept for WINDOW_S, drawn per model.
// Rates, mean batch sizes and padding come from two consecutive readings; p50/p99 from the
// latency buckets' growth over the last QUANTILE_READINGS readings (as histogram_quantile).
import { apiJson, KeyNeeded } from "./api.js";
import { modelCard } from "./cards.js";
import { drawChart, format } from "./charts.js";

const POLL_MS = 1000;
const WINDOW_S = 300;
const QUANTILE_READINGS = 5;
const MINUTE_S = 60;

const readings = []; // {time, body}, oldest first
const cards = new Map(); // model name -> {root, charts, stats}
let onServed = () => {};

export function startLive({ served }) {
  onServed = served;
  document.getElementById("window-minutes").textContent = String(WINDOW_S / 60);
  poll();
}

export function latestReading() {
  return readings.length ? readings[readings.length - 1].body : null;
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const body = await apiJson("/console/live");
    readings.push({ time: body.time, body });
    while (readings.length && readings[0].time < body.time - WINDOW_S - 5) readings.shift();
    status.textContent = `updated ${new Date(body.time * 1000).toLocaleTimeString()}`;
    status.classList.remove("error");
    onServed(body.served);
    render(body);
  } catch (error) {
    status.textContent = error instanceof KeyNeeded ? "API key needed" : `no reading: ${error.message}`;
    status.classList.add("error");
  }
  setTimeout(poll, POLL_MS);
}

function model(reading, name) {
  return reading.body.models[name] || null;
}

function perSecond(a, b, field) {
  const dt = b.time - a.time;
  if (!a.model || !b.model || dt <= 0) return null;
  return Math.max(0, b.model[field] - a.model[field]) / dt;
}

function ratio(a, b, sumField, countField) {
  if (!a.model || !b.model) return null;
  const count = b.model[countField] - a.model[countField];
  return count > 0 ? (b.model[sumField] - a.model[sumField]) / count : null;
}

export function quantile(q, bounds, before, after) {
  const grown = after.map((count, i) => count - (before ? before[i] : 0));
  const total = grown[grown.length - 1];
  if (!(total > 0)) return null;
  const rank = q * total;
  for (let i = 0; i < bounds.length; i++) {
    if (grown[i] >= rank) {
      const lower = i ? bounds[i - 1] : 0;
      const below = i ? grown[i - 1] : 0;
      const inside = grown[i] - below;
      return lower + (bounds[i] - lower) * (inside > 0 ? (rank - below) / inside : 1);
    }
  }
  return bounds[bounds.length - 1]; // past the last bound: the last bound, as Prometheus says
}

// Each model's points over the window: one per reading after the first.
function seriesFor(name, bounds) {
  const times = [];
  const points = {
    queue: [], batch: [], padding: [], rps: [], p50: [], p99: [], running: [], waiting: [], tps: [],
  };
  for (let i = 1; i < readings.length; i++) {
    const a = { time: readings[i - 1].time, model: model(readings[i - 1], name) };
    const b = { time: readings[i].time, model: model(readings[i], name) };
    const back = readings[Math.max(0, i - QUANTILE_READINGS)];
    const before = model(back, name);
    times.push(b.time);
    points.queue.push(b.model ? b.model.queue_depth : 0);
    points.batch.push(ratio(a, b, "batched_requests", "batches"));
    const padding = ratio(a, b, "padding_sum", "padding_count");
    points.padding.push(padding === null ? null : padding * 100);
    points.rps.push(perSecond(a, b, "requests"));
    const p = (q) => (b.model ? quantile(q, bounds, before && before.latency, b.model.latency) : null);
    const p50 = p(0.5);
    const p99 = p(0.99);
    points.p50.push(p50 === null ? null : p50 * 1000);
    points.p99.push(p99 === null ? null : p99 * 1000);
    points.running.push(b.model ? b.model.llm_running : 0);
    points.waiting.push(b.model ? b.model.llm_waiting : 0);
    points.tps.push(perSecond(a, b, "generated_tokens"));
  }
  return { times, points };
}

const ENCODER_CHARTS = [
  { key: "queue", title: "Queue depth", series: ["queue"], legend: ["waiting requests"] },
  { key: "batch", title: "Batch size", series: ["batch"], legend: ["requests per batch (mean)"] },
  { key: "padding", title: "Padding", series: ["padding"], legend: ["% of padded tokens"], unit: "%" },
  { key: "rps", title: "Requests/s", series: ["rps"], legend: ["answered"] },
  { key: "latency", title: "Latency", series: ["p50", "p99"], legend: ["p50 ms", "p99 ms"] },
];
const CHAT_CHARTS = [
  { key: "batch", title: "Generations", series: ["running", "waiting"], legend: ["running (batch)", "waiting"] },
  { key: "tps", title: "Tokens/s", series: ["tps"], legend: ["generated"] },
  { key: "rps", title: "Requests/s", series: ["rps"], legend: ["answered"] },
  { key: "latency", title: "Latency", series: ["p50", "p99"], legend: ["p50 ms", "p99 ms"] },
];

function card(entry) {
  let found = cards.get(entry.name);
  if (found) return found;
  const { root, head } = modelCard(entry.name, entry.kind);
  const stats = document.createElement("div");
  stats.className = "stats";
  const grid = document.createElement("div");
  grid.className = "charts";
  const charts = [];
  for (const spec of entry.kind === "chat" ? CHAT_CHARTS : ENCODER_CHARTS) {
    const figure = document.createElement("figure");
    figure.className = "chart";
    const caption = document.createElement("figcaption");
    const name = document.createElement("b");
    name.textContent = spec.title;
    caption.append(name);
    spec.legend.forEach((text, i) => {
      const item = document.createElement("span");
      item.className = i ? "legend-b" : "legend-a";
      item.textContent = text;
      caption.append(item);
    });
    const canvas = document.createElement("canvas");
    canvas.dataset.chart = spec.key;
    figure.append(caption, canvas);
    grid.append(figure);
    charts.push({ spec, canvas });
  }
  root.append(head, stats, grid);
  document.getElementById("live-models").append(root);
  found = { root, charts, stats };
  cards.set(entry.name, found);
  return found;
}

function last(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
  return null;
}

function render(body) {
  const names = new Set(body.served.map((entry) => entry.name));
  for (const [name, found] of cards) {
    if (!names.has(name)) {
      found.root.remove();
      cards.delete(name);
    }
  }
  for (const entry of body.served) {
    const found = card(entry);
    const { times, points } = seriesFor(entry.name, body.latency_bounds_s);
    for (const { spec, canvas } of found.charts) {
      drawChart(canvas, times, spec.series.map((key) => points[key]), {
        windowS: WINDOW_S,
        now: body.time,
        unit: spec.unit || "",
      });
    }
    const reading = body.models[entry.name];
    const facts = [
      ["requests/s", format(last(points.rps))],
      ["p50", `${format(last(points.p50))} ms`],
      ["p99", `${format(last(points.p99))} ms`],
      ["answered", format(reading ? reading.requests : 0)],
      ["errors", format(reading ? reading.errors : 0)],
    ];
    if (entry.kind === "chat") facts.splice(3, 0, ["running", format(reading ? reading.llm_running : 0)]);
    else facts.splice(3, 0, ["batch", format(last(points.batch))], ["queue", format(reading ? reading.queue_depth : 0)]);
    found.stats.replaceChildren(
      ...facts.map(([label, value]) => {
        const item = document.createElement("span");
        item.append(`${label} `);
        const strong = document.createElement("b");
        strong.textContent = value;
        item.append(strong);
        return item;
      }),
    );
  }
  renderRefusals(body);
}

function renderRefusals(body) {
  const minuteAgo = readings.find((r) => r.time >= body.time - MINUTE_S) || readings[0];
  const rows = [];
  for (const [name, reading] of Object.entries(body.models)) {
    const before = minuteAgo.body.models[name];
    for (const [reason, total] of Object.entries(reading.rejections)) {
      const earlier = before && before.rejections[reason] ? before.rejections[reason] : 0;
      rows.push([name, reason, total - earlier, total]);
    }
  }
  for (const [reason, total] of Object.entries(body.connections_refused)) {
    const earlier = minuteAgo.body.connections_refused[reason] || 0;
    rows.push(["(connections)", reason, total - earlier, total]);
  }
  const refused = rows.filter((cells) => cells[3] > 0);
  if (!refused.length) refused.push(["none so far", "", "", ""]);
  const tbody = document.querySelector("#refusals tbody");
  tbody.replaceChildren(
    ...refused.map((cells) => {
      const tr = document.createElement("tr");
      cells.forEach((value, i) => {
        const td = document.createElement("td");
        td.textContent = typeof value === "number" ? format(value) : value;
        if (i >= 2) td.className = "num";
        tr.append(td);
      });
      return tr;
    }),
  );
}
