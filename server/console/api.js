// Calls to this server's own APIs, with the API key when one has been given. A 401 opens the
// key dialog; the key is kept in this tab's session storage only.
const KEY_ITEM = "ferry-api-key";

export class KeyNeeded extends Error {}

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function askForKey() {
  const dialog = document.getElementById("key-dialog");
  if (!dialog.open) dialog.showModal();
}

export function setUpKeyDialog(onKey) {
  const dialog = document.getElementById("key-dialog");
  document.getElementById("key-button").addEventListener("click", askForKey);
  dialog.addEventListener("close", () => {
    if (dialog.returnValue !== "save") return;
    const input = dialog.querySelector("input[name=key]");
    sessionStorage.setItem(KEY_ITEM, input.value.trim());
    input.value = "";
    onKey();
  });
}

export async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    askForKey();
    throw new KeyNeeded("this server asks for an API key");
  }
  return response;
}

// A JSON answer, or an Error carrying the server's own message (OpenAI, KServe or Ferry's shape).
export async function apiJson(path, options = {}) {
  const response = await api(path, options);
  const text = await response.text();
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  if (!response.ok) throw new Error(`${response.status}: ${errorMessage(body)}`);
  return body;
}

export function errorMessage(body) {
  if (typeof body === "string") return body;
  const error = body.error ?? body.detail ?? body;
  if (typeof error === "string") return error;
  return error.message ?? JSON.stringify(error);
}

export function postJson(payload) {
  return {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(payload),
  };
}
