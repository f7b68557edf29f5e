// Batches: OpenAI's Batch API from the page. Upload a JSONL file and start a batch over it (the
// endpoint, the window, packing), follow every batch's progress and counts (polled while any is
// live), cancel one, and download its output and error files.

import { useEffect, useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, Note, Panel, Progress, Table, download, html, useAction, useLoad } from "../ui.js";

const ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/probes/score"];
const LIVE = new Set(["validating", "in_progress", "finalizing", "cancelling"]);
const CANCELLABLE = new Set(["validating", "in_progress"]);
const POLL_MS = 1000;

const when = (seconds) => new Date(seconds * 1000).toLocaleString();

function StartBatch({ onStarted }) {
  const act = useAction();
  const [file, setFile] = useState(null);
  const [form, setForm] = useState({ endpoint: ENDPOINTS[0], window: "24h", pack: false });
  const set = (key) => (e) => setForm((f) => ({ ...f, [key]: e.target.type === "checkbox" ? e.target.checked : e.target.value }));
  const start = (e) => {
    e.preventDefault();
    act.run(async () => {
      const stored = await api.files.upload(file, file.name);
      const batch = await api.batches.create({
        input_file_id: stored.id, endpoint: form.endpoint, completion_window: form.window, pack: form.pack,
      });
      onStarted(batch);
    });
  };
  return html`<form class="row" aria-label="New batch" onSubmit=${start}>
    <label>JSONL file <input type="file" accept=".jsonl,.json,application/jsonl,text/plain"
      onChange=${(e) => setFile(e.target.files?.[0] || null)} /></label>
    <label>Endpoint <select value=${form.endpoint} onChange=${set("endpoint")}>
      ${ENDPOINTS.map((url) => html`<option value=${url}>${url}</option>`)}</select></label>
    <label>Window <input value=${form.window} onInput=${set("window")} size="5" name="completion-window" /></label>
    <label class="inline"><input type="checkbox" checked=${form.pack} onChange=${set("pack")} /> Pack scoring lines</label>
    <button type="submit" disabled=${act.busy || !file}>Start batch</button>
    <${ErrorNote} error=${act.error} />
  </form>`;
}

function Counts({ batch }) {
  const { total, completed, failed } = batch.request_counts;
  return html`<${Progress} done=${completed + failed} total=${total} unit="lines" />
    <div class="meta">${completed} completed · ${failed} failed</div>`;
}

function Status({ batch }) {
  const { status } = batch;
  const tone = status === "completed" ? "good" : ["failed", "expired", "cancelled"].includes(status) ? "bad" : "";
  const waiting = batch.millm?.waiting_reason;
  return html`<span class=${`badge ${tone}`} data-status=${status}>${status}</span>
    ${waiting && waiting !== "queued" ? html`<div class="meta">waiting: ${waiting.replaceAll("_", " ")}</div>` : null}
    ${batch.millm?.lease_mode ? html`<div class="meta">lease: ${batch.millm.lease_mode}</div>` : null}
    ${batch.errors?.data?.length ? html`<div class="error">${batch.errors.data.at(-1).message}</div>` : null}`;
}

export default function BatchesView() {
  const list = useLoad(() => api.batches.list());
  const act = useAction();
  const [started, setStarted] = useState(null);
  const batches = list.value?.data || [];
  const live = batches.some((b) => LIVE.has(b.status));
  useEffect(() => {
    if (!live) return undefined;
    const timer = setTimeout(list.reload, POLL_MS);
    return () => clearTimeout(timer);
  }, [list.value]);
  const save = (id, name) => act.run(async () => download(await api.files.content(id), name, "application/jsonl"));
  const run = (fn) => act.run(async () => { await fn(); await list.reload(); });
  return html`<${Panel} title="Batches" actions=${html`<button class="secondary" onClick=${list.reload}>Refresh</button>`}>
    <p class="note">A JSONL file of requests (one <code>{"custom_id", "method": "POST", "url", "body"}</code> a line) runs
      in the background, behind interactive requests; every OpenAI client can do the same through /v1/batches.</p>
    <${StartBatch} onStarted=${(batch) => { setStarted(batch.id); list.reload(); }} />
    ${started ? html`<${Note}>Batch ${started} started.<//>` : null}
    <${ErrorNote} error=${list.error || act.error} />
    <${Table} label="Batches" rows=${batches} rowKey=${(b) => b.id} empty="No batch yet."
      columns=${[
        ["Batch", (b) => html`<strong>${b.id}</strong><div class="meta">${b.endpoint}${b.model ? ` · ${b.model}` : ""}${b.millm?.pack ? " · packed" : ""}</div>
          <div class="meta">${when(b.created_at)}</div>`],
        ["Status", (b) => html`<${Status} batch=${b} />`],
        ["Progress", (b) => html`<${Counts} batch=${b} />`],
        ["", (b) => html`<div class="actions">
          ${CANCELLABLE.has(b.status) ? html`<button class="danger" disabled=${act.busy}
            onClick=${() => run(() => api.batches.cancel(b.id))} aria-label=${`Cancel ${b.id}`}>Cancel</button>` : null}
          ${b.output_file_id ? html`<button class="secondary" onClick=${() => save(b.output_file_id, `${b.id}_output.jsonl`)}
            aria-label=${`Download the output of ${b.id}`}>Output</button>` : null}
          ${b.error_file_id ? html`<button class="secondary" onClick=${() => save(b.error_file_id, `${b.id}_error.jsonl`)}
            aria-label=${`Download the errors of ${b.id}`}>Errors</button>` : null}
        </div>`],
      ]} />
  <//>`;
}
