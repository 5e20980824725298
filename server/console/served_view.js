// "What is served": each model's signature (KServe model metadata), its backend and batching
// limits (KServe model configuration; an LLM's from the live reading), and a curl command.
import { apiJson, apiKey } from "./api.js";
import { modelCard } from "./cards.js";

let shown = "";
let pending = "";

export async function updateServed(entries) {
  const names = entries.map((e) => `${e.name}:${e.kind}`).join("\n");
  if (names === shown || names === pending) return;
  pending = names;
  const cards = await Promise.all(entries.map(describe));
  document.getElementById("served-models").replaceChildren(...cards);
  pending = "";
  // Asked again at the next reading where a model could not be described (no key yet).
  if (!cards.some((card) => card.querySelector(".error"))) shown = names;
}

// A row of zeros (empty strings for text) in an input's shape, batch axis left out.
export function sampleRow(input) {
  const inner = input.shape.slice(1).map((d) => (d > 0 ? d : 1));
  const fill = input.datatype === "BYTES" ? "" : 0;
  const build = (dims) => (dims.length ? Array.from({ length: dims[0] }, () => build(dims.slice(1))) : fill);
  return build(inner);
}

async function describe(entry) {
  const badge = entry.parent ? `${entry.kind}, adapter on ${entry.parent}` : entry.kind;
  const { root, head } = modelCard(entry.name, badge);
  root.append(head);
  try {
    if (entry.kind === "chat") {
      root.append(facts([
        ["backend", "LLM engine (OpenAI API)"],
        ["generations at once", entry.limits.max_running],
        ["context", `${entry.limits.max_context_tokens} tokens`],
        ["sampling beyond temperature/top_p", (entry.limits.sampling_options || []).join(", ") || "none"],
      ]));
    } else {
      const path = `/v2/models/${encodeURIComponent(entry.name)}`;
      const [metadata, config] = await Promise.all([apiJson(path), apiJson(`${path}/config`)]);
      root.append(facts(limits(config)), signature(metadata), axisRules(config));
      entry = { ...entry, inputs: metadata.inputs };
    }
  } catch (error) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = error.message;
    root.append(p);
  }
  const curl = document.createElement("pre");
  curl.className = "code";
  curl.textContent = curlFor(entry);
  root.append(curl);
  return root;
}

function limits(config) {
  const batching = config.dynamic_batching || {};
  const policy = batching.default_queue_policy || {};
  const parameters = config.parameters || {};
  const instances = (config.instance_group || []).map((g) => `${g.count} × ${g.kind}`).join(", ");
  const rows = [
    ["backend", config.backend || config.platform],
    ["max batch size", config.max_batch_size || "no batching (one request a run)"],
    ["batches at once", instances],
  ];
  if (batching.max_queue_delay_microseconds !== undefined) {
    rows.push(["max queue delay", `${batching.max_queue_delay_microseconds / 1000} ms`]);
  }
  if (policy.max_queue_size !== undefined) rows.push(["max queue size", policy.max_queue_size]);
  if (parameters.max_batch_tokens) rows.push(["max padded tokens a batch", parameters.max_batch_tokens.string_value]);
  if (parameters.max_sequence_length) rows.push(["longest input", `${parameters.max_sequence_length.string_value} tokens`]);
  if (parameters["ferry.batching"]) rows.push(["batching rule", parameters["ferry.batching"].string_value]);
  return rows;
}

function facts(rows) {
  const table = document.createElement("table");
  table.className = "grid facts";
  for (const [name, value] of rows) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = name;
    const td = document.createElement("td");
    td.textContent = String(value);
    tr.append(th, td);
    table.append(tr);
  }
  return table;
}

function signature(metadata) {
  const table = document.createElement("table");
  table.className = "grid signature";
  const head = document.createElement("tr");
  for (const name of ["", "name", "datatype", "shape (-1: dynamic axis)"]) {
    const th = document.createElement("th");
    th.textContent = name;
    head.append(th);
  }
  table.append(head);
  for (const [side, tensors] of [["input", metadata.inputs], ["output", metadata.outputs]]) {
    for (const tensor of tensors) {
      const tr = document.createElement("tr");
      for (const value of [side, tensor.name, tensor.datatype, `[${tensor.shape.join(", ")}]`]) {
        const td = document.createElement("td");
        td.textContent = value;
        tr.append(td);
      }
      table.append(tr);
    }
  }
  return table;
}

// A plain graph's configuration says how each dynamic axis is batched, and why.
function axisRules(config) {
  const rules = Object.entries(config.parameters || {}).filter(([name]) => name.startsWith("ferry.axis."));
  const list = document.createElement("ul");
  list.className = "muted";
  for (const [name, value] of rules) {
    const item = document.createElement("li");
    item.textContent = `${name.slice("ferry.axis.".length)}: ${value.string_value}`;
    list.append(item);
  }
  return list;
}

function curlFor(entry) {
  const url = window.location.origin;
  const key = apiKey() ? ` \\\n  -H "Authorization: Bearer $FERRY_API_KEY"` : "";
  const json = (path, body) =>
    `curl -s ${url}${path} -H 'content-type: application/json'${key} \\\n  -d '${JSON.stringify(body)}'`;
  switch (entry.kind) {
    case "chat":
      return json("/v1/chat/completions", {
        model: entry.name, messages: [{ role: "user", content: "Hello!" }], max_tokens: 32,
      });
    case "embedding":
      return json("/v1/embeddings", { model: entry.name, input: ["Ferry batches requests."] });
    case "rerank":
      return json("/v1/rerank", { model: entry.name, query: "batching", documents: ["a", "b"] });
    case "image":
      return `curl -s "${url}/predict?model=${encodeURIComponent(entry.name)}" -H 'content-type: image/jpeg'${key} \\\n  --data-binary @picture.jpg`;
    case "tensor": {
      const inputs = Object.fromEntries((entry.inputs || []).map((i) => [i.name, [sampleRow(i)]]));
      return json("/predict", { model: entry.name, inputs });
    }
    default:
      return json("/predict", { model: entry.name, inputs: ["What a wonderful day!"] });
  }
}
