// Every call the workbench makes to millm, one function per documented route, so this file reads
// like the API reference (docs/). Nothing here knows about the page: callers render the results
// and the ApiError messages.

const KEY_STORE = "millm.key";

/** An error answer of the API (OpenAI's shape), or a network failure (status 0). */
export class ApiError extends Error {
  constructor(status, error) {
    super(error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = error?.code ?? null;
    this.type = error?.type ?? null;
    this.param = error?.param ?? null;
  }
  /** The key is missing, wrong, or not the admin key (401 invalid_api_key): the page asks for one. */
  get refused() {
    return this.status === 401 || this.code === "invalid_api_key";
  }
}

/** The key the page sends, kept in this browser tab's session only. */
export const key = {
  get: () => sessionStorage.getItem(KEY_STORE) || "",
  set: (value) => (value ? sessionStorage.setItem(KEY_STORE, value) : sessionStorage.removeItem(KEY_STORE)),
};

const listeners = new Set();
/** Calls `fn(error)` for every refused request (the page asks for a key then). */
export function onRefused(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

const changes = new Set();
/** Calls `fn()` after every answered request that may have changed the server (any method but
 *  GET), so what the shell shows of the server's state (the live steering) follows the page's actions. */
export function onChange(fn) {
  changes.add(fn);
  return () => changes.delete(fn);
}

function headers(extra = {}) {
  const h = { ...extra };
  const k = key.get();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    /* not JSON: the status says it */
  }
  const error = new ApiError(response.status, body?.error ?? { message: `${response.status} ${response.statusText}` });
  if (error.refused) listeners.forEach((fn) => fn(error));
  return error;
}

/** One request; the parsed JSON (or text) answer, with the response's headers kept on `.headers`. */
export async function request(method, path, { body, query, text = false, contentType, signal } = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  const init = { method, headers: headers(), signal };
  if (body instanceof FormData) {
    init.body = body; // multipart: the browser writes the Content-Type with its boundary
  } else if (body !== undefined) {
    init.headers["Content-Type"] = contentType || "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, { message: `The server did not answer (${err.message}).`, code: "network" });
  }
  if (!response.ok) throw await failure(response);
  if (method !== "GET") changes.forEach((fn) => fn());
  const value = text ? await response.text() : await response.json();
  return value && typeof value === "object" ? Object.assign(value, { headers: response.headers }) : value;
}

/** Server-sent events of a POST (or GET): calls onEvent(object) per `data:` frame; resolves with the response headers. */
export async function stream(method, path, { body, onEvent, onHeaders, signal } = {}) {
  const init = { method, headers: headers({ Accept: "text/event-stream" }), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(new URL(path, location.origin), init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, { message: `The server did not answer (${err.message}).`, code: "network" });
  }
  if (!response.ok) throw await failure(response);
  onHeaders?.(response.headers);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data || data === "[DONE]") continue;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(500, event.error); // a failure mid-stream, in OpenAI's shape
      onEvent(event);
    }
  }
  return response.headers;
}

const get = (path, query) => request("GET", path, { query });
const post = (path, body = {}) => request("POST", path, { body });
const put = (path, body = {}) => request("PUT", path, { body });
const del = (path, query) => request("DELETE", path, { query });
const enc = encodeURIComponent;

// Health and models (docs/models.md, docs/serving.md)
export const health = {
  /** Readiness answers 503 with the same body while no model is loaded: both are an answer here. */
  ready: async () => {
    const response = await fetch("/api/health/ready");
    return response.json();
  },
  inference: () => get("/api/health/inference"),
};
export const models = {
  served: () => get("/v1/models"),
  list: () => get("/api/models"),
  register: (body) => post("/api/models", body),
  load: (name) => post(`/api/models/${enc(name)}/load`),
  unload: (name) => post(`/api/models/${enc(name)}/unload`),
  lock: (name) => post(`/api/models/${enc(name)}/lock`),
  unlock: (name) => post(`/api/models/${enc(name)}/unlock`),
  remove: (name) => del(`/api/models/${enc(name)}`),
};

// Files and batches: OpenAI's Batch API (docs/batch.md)
export const files = {
  /** Store a JSONL file (a File or Blob) for batches. */
  upload: (file, name) => {
    const form = new FormData();
    form.append("purpose", "batch");
    form.append("file", file, name);
    return request("POST", "/v1/files", { body: form });
  },
  content: (id) => request("GET", `/v1/files/${enc(id)}/content`, { text: true }),
};
export const batches = {
  list: (limit = 50) => get("/v1/batches", { limit }),
  create: (body) => post("/v1/batches", body),
  cancel: (id) => post(`/v1/batches/${enc(id)}/cancel`),
};

// Steered variants: names /v1 clients use as models (docs/variants.md)
export const variants = {
  list: () => get("/api/variants"),
  create: (body) => post("/api/variants", body),
  remove: (name) => del(`/api/variants/${enc(name)}`),
};

// SAEs (docs/steering.md) and their labels (docs/labels.md)
export const saes = {
  list: () => get("/api/saes"),
  get: (id) => get(`/api/saes/${enc(id)}`),
  register: (body) => post("/api/saes", body),
  attach: (id, body = {}) => post(`/api/saes/${enc(id)}/attach`, body),
  detach: (id) => post(`/api/saes/${enc(id)}/detach`),
  remove: (id) => del(`/api/saes/${enc(id)}`),
  /** Every label of the SAE, `{"<index>": "label"}` (the JSON export). */
  labels: (id) => get(`/api/saes/${enc(id)}/labels`),
  search: (id, q, limit = 50, by = "text") => get(`/api/saes/${enc(id)}/features`, { q, limit, by }),
  explain: (id, body) => post(`/api/saes/${enc(id)}/labels/explain`, body),
  labelTopTokens: (id, body) => post(`/api/saes/${enc(id)}/labels/top-tokens`, body),
  embedLabels: (id) => post(`/api/saes/${enc(id)}/labels/embeddings`),
  feature: (id, index, k = 10) => get(`/api/saes/${enc(id)}/features/${index}`, { k }),
  calibration: (id, features) => get(`/api/saes/${enc(id)}/calibration`, { features: features?.join(",") }),
  calibrate: (id, body) => post(`/api/saes/${enc(id)}/calibrate`, body),
  inspect: (id, body) => post(`/api/saes/${enc(id)}/inspect`, body),
  contrast: (id, body) => post(`/api/saes/${enc(id)}/contrast`, body),
};

// Live steering (docs/steering.md)
export const steering = {
  get: () => get("/api/steering"),
  set: (saeId, index, body) => put(`/api/steering/saes/${enc(saeId)}/features/${index}`, body),
  clearOne: (saeId, index) => del(`/api/steering/saes/${enc(saeId)}/features/${index}`),
  setMany: (body) => post("/api/steering/features", body),
  clear: (saeId) => del("/api/steering/features", { sae_id: saeId }),
  enable: () => post("/api/steering/enable"),
  disable: () => post("/api/steering/disable"),
};

/** Profiles, clusters and circuits share their list / get / export / import / activate / delete routes. */
function documents(plural) {
  return {
    list: () => get(`/api/${plural}`),
    get: (key) => get(`/api/${plural}/${enc(key)}`),
    exportText: (key) => request("GET", `/api/${plural}/${enc(key)}/export`, { text: true }),
    /** `query`: `{on_conflict: "rename" | "fail"}` (each kind has its own default). */
    importText: (text, query) => request("POST", `/api/${plural}/import`, { body: text, query }),
    activate: (key, body) => post(`/api/${plural}/${enc(key)}/activate`, body),
    deactivate: () => post(`/api/${plural}/deactivate`),
    remove: (key) => del(`/api/${plural}/${enc(key)}`),
  };
}
export const profiles = {
  ...documents("profiles"),
  create: (body) => post("/api/profiles", body),
  update: (key, body) => put(`/api/profiles/${enc(key)}`, body),
  saveCurrent: (body) => post("/api/profiles/save-current", body),
  exportAllText: () => request("GET", "/api/profiles/export", { text: true }),
};
export const clusters = {
  ...documents("clusters"),
  intensity: (key, intensity) => put(`/api/clusters/${enc(key)}/intensity`, { intensity }),
};
export const circuits = {
  ...documents("circuits"),
  active: () => get("/api/circuits/active", { single: true }),
  /** Every active circuit (several with CIRCUIT_ALLOW_CONCURRENT), with its claimed and composed layers. */
  activeAll: () => get("/api/circuits/active"),
  deactivateOne: (key) => post(`/api/circuits/${enc(key)}/deactivate`),
  claims: () => get("/api/circuits/claims"),
};

// Probes (docs/probes.md) and steering vectors (docs/vectors.md)
export const probes = {
  list: () => get("/api/probes"),
  get: (key) => get(`/api/probes/${enc(key)}`),
  create: (body) => post("/api/probes", body),
  update: (key, body) => put(`/api/probes/${enc(key)}`, body),
  remove: (key) => del(`/api/probes/${enc(key)}`),
  activate: (key) => post(`/api/probes/${enc(key)}/activate`),
  deactivate: (key) => post(`/api/probes/${enc(key)}/deactivate`),
  exportText: (key) => request("GET", `/api/probes/${enc(key)}/export`, { text: true }),
  exportAllText: () => request("GET", "/api/probes/export", { text: true }),
  importText: (text, query) => request("POST", "/api/probes/import", { body: text, query }),
  train: (body) => post("/api/probes/train", body),
};
export const vectors = {
  list: () => get("/api/vectors"),
  explain: (key) => get(`/api/vectors/${enc(key)}/explain`),
};

// Jobs (docs/discovery.md, Jobs) and AutoSteer (docs/autosteer.md)
// Dictionaries: SAEs trained on the served model, and grades (docs/dictionaries.md)
export const dictionaries = {
  train: (body) => post("/api/saes/train", body),
  list: () => get("/api/saes/trainings"),
  get: (id) => get(`/api/saes/trainings/${enc(id)}`),
  cancel: (id) => del(`/api/saes/trainings/${enc(id)}`),
  grade: (sae, body) => post(`/api/saes/${enc(sae)}/grade`, body),
  grades: (sae) => get(`/api/saes/${enc(sae)}/grades`),
  gradeSet: (set, body) => post(`/api/transcoders/${enc(set)}/grade`, body),
  setGrades: (set) => get(`/api/transcoders/${enc(set)}/grades`),
};
export const jobs = {
  list: () => get("/api/jobs"),
  get: (id) => get(`/api/jobs/${enc(id)}`),
  cancel: (id) => del(`/api/jobs/${enc(id)}`),
};
export const autosteer = (body) => post("/api/autosteer", body);
export const lens = (body) => post("/api/lens", body);
// Attribution graphs (docs/attribution.md)
export const attribution = {
  trace: (body) => post("/api/attribution", body),
  start: (body) => post("/api/attribution/jobs", body),
  get: (id) => get(`/api/attribution/${enc(id)}`),
  exportText: (id) => request("GET", `/api/attribution/${enc(id)}/export`, { text: true }),
  importText: (text) => request("POST", "/api/attribution/import", { body: JSON.parse(text) }),
  profile: (id, body) => post(`/api/attribution/${enc(id)}/profile`, body),
  circuit: (id, body) => post(`/api/attribution/${enc(id)}/circuit`, body),
};
export const transcoders = { list: () => get("/api/transcoders") };
export const completion = (body) => post("/v1/completions", body);

// Steering evaluations (docs/evaluation.md, A steering evaluation)
export const evaluations = {
  start: (body) => post("/api/evaluations", body),
  list: () => get("/api/evaluations"),
  get: (id) => get(`/api/evaluations/${enc(id)}`),
  remove: (id) => del(`/api/evaluations/${enc(id)}`),
};

// Monitoring (docs/monitoring.md)
export const monitoring = {
  get: () => get("/api/monitoring"),
  configure: (body) => put("/api/monitoring", body),
  enable: (body) => post("/api/monitoring/enable", body),
  disable: () => post("/api/monitoring/disable"),
  records: (query) => get("/api/monitoring/records", query),
  /** A recorded request's prompts as the model read them (404 monitored_request_not_found once forgotten). */
  request: (id) => get(`/api/monitoring/requests/${enc(id)}`),
  stats: () => get("/api/monitoring/stats"),
  reset: () => post("/api/monitoring/reset"),
  /** Live records; resolves when the stream ends, rejects on an error (abort with `signal`). */
  watch: (onRecord, signal) => stream("GET", "/api/monitoring/stream", { onEvent: onRecord, signal }),
};

// Sensing (docs/sensing.md): `kind` is "cluster" (/api/sensing) or "circuit" (/api/circuit-sensing)
const sensingBase = (kind) => (kind === "cluster" ? "/api/sensing" : "/api/circuit-sensing");
export const sensing = {
  status: (kind) => get(`${sensingBase(kind)}/status`),
  events: (kind, query) => get(`${sensingBase(kind)}/events`, query),
  event: (kind, id) => get(`${sensingBase(kind)}/events/${enc(id)}`),
  enable: (kind, key) => post(`${sensingBase(kind)}/${enc(key)}/enable`),
  disable: (kind, key) => post(`${sensingBase(kind)}/${enc(key)}/disable`),
  configure: (kind, key, body) => put(`${sensingBase(kind)}/${enc(key)}/config`, body),
  /** Every new event of either kind; resolves when the stream ends (abort with `signal`). */
  watch: (onEvent, signal) => stream("GET", "/api/sensing/feed", { onEvent, signal }),
};

// Generation: /v1/chat/completions (docs/openai-api.md) and /api/compare (docs/compare.md)
export const chat = (body, { onEvent, onHeaders, signal }) =>
  stream("POST", "/v1/chat/completions", { body: { ...body, stream: true }, onEvent, onHeaders, signal });
export const compare = (body, { onEvent, onHeaders, signal }) =>
  stream("POST", "/api/compare", { body: { ...body, stream: true }, onEvent, onHeaders, signal });
