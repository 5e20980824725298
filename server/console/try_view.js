// "Try a model": one form per kind of model, each calling Ferry's public API as a user's own
// client would (OpenAI chat with SSE, OpenAI embeddings, /predict, /v1/rerank, KServe metadata).
import { api, apiJson, errorMessage, postJson } from "./api.js";
import { format } from "./charts.js";
import { sampleRow } from "./served_view.js";

const FORMS = {
  chat: "form-chat",
  embedding: "form-embedding",
  classification: "form-classification",
  rerank: "form-rerank",
  image: "form-image",
  tensor: "form-tensor",
};
let served = [];
let chat = [];
let aborter = null;

const $ = (id) => document.getElementById(id);

export function setUpTry() {
  $("try-model").addEventListener("change", () => showForm());
  $("form-chat").addEventListener("submit", guarded(sendChat));
  $("chat-stop").addEventListener("click", () => aborter && aborter.abort());
  $("chat-clear").addEventListener("click", () => {
    chat = [];
    $("chat-log").replaceChildren();
  });
  $("form-embedding").addEventListener("submit", guarded(compareSentences));
  $("form-classification").addEventListener("submit", guarded(classifyText));
  $("form-rerank").addEventListener("submit", guarded(rerank));
  $("form-image").addEventListener("submit", guarded(classifyImage));
  $("form-image").image.addEventListener("change", previewImage);
  $("form-tensor").addEventListener("submit", guarded(predictRow));
}

// The served models from the live reading; the list is rebuilt only when it changes.
export function updateModels(entries) {
  const names = entries.map((e) => e.name).join("\n");
  if (names === served.map((e) => e.name).join("\n")) return;
  served = entries;
  const select = $("try-model");
  const keep = select.value;
  select.replaceChildren(
    ...entries.map((entry) => {
      const option = document.createElement("option");
      option.value = entry.name;
      option.textContent = `${entry.name} (${entry.kind})`;
      return option;
    }),
  );
  const chatModel = entries.find((e) => e.kind === "chat");
  select.value = entries.some((e) => e.name === keep) ? keep : chatModel ? chatModel.name : names.split("\n")[0];
  showForm();
}

function selected() {
  return served.find((e) => e.name === $("try-model").value);
}

function showForm() {
  const entry = selected();
  $("try-kind").textContent = entry ? entry.kind : "";
  $("try-error").hidden = true;
  for (const [kind, id] of Object.entries(FORMS)) $(id).hidden = !entry || entry.kind !== kind;
  if (entry && entry.kind === "chat") {
    const honoured = new Set((entry.limits && entry.limits.sampling_options) || []);
    $("form-chat").repetition_penalty.disabled = !honoured.has("repetition_penalty");
  }
  if (entry && entry.kind === "tensor") tensorFields(entry.name).catch(showError);
}

function showError(error) {
  if (error.name === "AbortError") return;
  $("try-error").textContent = error.message;
  $("try-error").hidden = false;
}

function guarded(handler) {
  return async (event) => {
    event.preventDefault();
    $("try-error").hidden = true;
    try {
      await handler(event.target);
    } catch (error) {
      showError(error);
    }
  };
}

// -- chat ------------------------------------------------------------------------------------

function message(role, text) {
  const line = document.createElement("div");
  line.className = `message ${role}`;
  const who = document.createElement("span");
  who.className = "role";
  who.textContent = role;
  const content = document.createElement("span");
  content.className = "content";
  content.textContent = text;
  line.append(who, content);
  $("chat-log").append(line);
  return content;
}

function number(form, name) {
  const field = form[name];
  return field.value === "" || field.disabled ? undefined : Number(field.value);
}

async function sendChat(form) {
  const text = form.message.value.trim();
  if (!text) return;
  form.message.value = "";
  chat.push({ role: "user", content: text });
  message("user", text);
  const answer = message("assistant", "");
  answer.parentElement.dataset.streaming = "true";
  const system = form.system.value.trim();
  const payload = {
    model: selected().name,
    messages: [...(system ? [{ role: "system", content: system }] : []), ...chat],
    stream: true,
    stream_options: { include_usage: true },
    temperature: number(form, "temperature"),
    top_p: number(form, "top_p"),
    max_tokens: number(form, "max_tokens"),
    seed: number(form, "seed"),
  };
  const penalty = number(form, "repetition_penalty");
  if (penalty !== undefined && penalty !== 1) payload.repetition_penalty = penalty;
  aborter = new AbortController();
  $("chat-stop").disabled = false;
  const started = performance.now();
  let firstToken = null;
  let usage = null;
  try {
    const response = await api("/v1/chat/completions", { ...postJson(payload), signal: aborter.signal });
    if (!response.ok) throw new Error(`${response.status}: ${errorMessage(await response.json())}`);
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(errorMessage(chunk));
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (firstToken === null) firstToken = performance.now() - started;
        answer.textContent += delta.content;
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      }
    }
    chat.push({ role: "assistant", content: answer.textContent });
  } finally {
    answer.parentElement.dataset.streaming = "false";
    $("chat-stop").disabled = true;
    aborter = null;
  }
  const seconds = (performance.now() - started) / 1000;
  const tokens = usage ? usage.completion_tokens : null;
  $("chat-stats").textContent =
    `first token ${format(firstToken)} ms · ${format(seconds)} s` +
    (tokens ? ` · ${tokens} tokens, ${format(tokens / seconds)} tokens/s` : "");
}

// Server-sent events: `data: {json}` blocks, until `data: [DONE]`.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

// -- encoders --------------------------------------------------------------------------------

async function compareSentences(form) {
  const body = await apiJson(
    "/v1/embeddings",
    postJson({ model: selected().name, input: [form.a.value, form.b.value] }),
  );
  const [a, b] = body.data.map((item) => item.embedding);
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  const cosine = dot / Math.sqrt(na * nb);
  $("embedding-result").textContent =
    `cosine similarity ${cosine.toFixed(4)} · ${a.length} dimensions · ${body.usage.prompt_tokens} tokens`;
  $("embedding-result").dataset.cosine = String(cosine);
}

function probabilityRows(target, probabilities) {
  const sorted = Object.entries(probabilities).sort((x, y) => y[1] - x[1]).slice(0, 10);
  const table = document.createElement("table");
  table.className = "grid";
  for (const [label, p] of sorted) {
    const tr = document.createElement("tr");
    const name = document.createElement("td");
    name.textContent = label;
    const value = document.createElement("td");
    value.className = "num";
    value.textContent = p.toFixed(4);
    const barCell = document.createElement("td");
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${Math.round(p * 200)}px`;
    barCell.append(bar);
    tr.append(name, value, barCell);
    table.append(tr);
  }
  target.replaceChildren(table);
}

function showOutputs(target, outputs) {
  const row = outputs[0] || {};
  const probabilities = row.probabilities || Object.values(row).find(isClassMap) || softmax(row.logits);
  if (probabilities) return probabilityRows(target, probabilities);
  const pre = document.createElement("pre");
  pre.className = "code";
  pre.textContent = JSON.stringify(row, null, 2);
  target.replaceChildren(pre);
}

// A classifier graph's logits as probabilities by class index.
function softmax(logits) {
  if (!Array.isArray(logits) || !logits.every((v) => typeof v === "number")) return null;
  const top = Math.max(...logits);
  const exp = logits.map((v) => Math.exp(v - top));
  const total = exp.reduce((a, b) => a + b, 0);
  return Object.fromEntries(exp.map((v, i) => [`class ${i}`, v / total]));
}

function isClassMap(value) {
  return value && typeof value === "object" && !Array.isArray(value) &&
    Object.values(value).every((v) => typeof v === "number");
}

async function classifyText(form) {
  const body = await apiJson("/predict", postJson({ model: selected().name, inputs: [form.text.value] }));
  showOutputs($("classification-result"), body.outputs);
}

async function rerank(form) {
  const documents = form.documents.value.split("\n").map((d) => d.trim()).filter(Boolean);
  const body = await apiJson(
    "/v1/rerank",
    postJson({ model: selected().name, query: form.query.value, documents }),
  );
  $("rerank-result").replaceChildren(
    ...body.results.map((result) => {
      const item = document.createElement("li");
      item.textContent = `${result.relevance_score.toFixed(4)}  ${documents[result.index]}`;
      return item;
    }),
  );
}

function previewImage() {
  const file = $("form-image").image.files[0];
  const preview = $("image-preview");
  if (preview.src) URL.revokeObjectURL(preview.src);
  preview.hidden = !file;
  if (file) preview.src = URL.createObjectURL(file);
}

async function classifyImage(form) {
  const file = form.image.files[0];
  const body = await apiJson(`/predict?model=${encodeURIComponent(selected().name)}`, {
    method: "POST",
    headers: { "Content-Type": file.type },
    body: file,
  });
  showOutputs($("image-result"), body.outputs);
}

// -- a row for a plain graph (tabular and other tensor models) ------------------------------

async function tensorFields(name) {
  const metadata = await apiJson(`/v2/models/${encodeURIComponent(name)}`);
  const box = $("tensor-inputs");
  box.replaceChildren(
    ...metadata.inputs.map((input) => {
      const label = document.createElement("label");
      label.textContent = `${input.name} (${input.datatype}, shape [${input.shape.join(", ")}])`;
      const field = document.createElement("input");
      field.name = input.name;
      field.value = JSON.stringify(sampleRow(input));
      label.append(field);
      return label;
    }),
  );
}

async function predictRow(form) {
  const inputs = {};
  for (const field of $("tensor-inputs").querySelectorAll("input")) {
    let value;
    try {
      value = JSON.parse(field.value);
    } catch {
      throw new Error(`${field.name}: not JSON (a number list such as [1.5, 2], or "text")`);
    }
    inputs[field.name] = [value];
  }
  const body = await apiJson("/predict", postJson({ model: selected().name, inputs }));
  showOutputs($("tensor-result"), body.outputs);
}
