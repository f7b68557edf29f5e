// Small pieces every view uses: the html tag, loading/acting state, error messages, tables,
// file import/export, and the server context (which model is loaded, which SAEs are attached).

import { h, createContext } from "preact";
import { useCallback, useContext, useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";
import * as api from "./api.js";

export const html = htm.bind(h);

/** What the shell knows about the server: readiness, the served model, attached SAEs. */
export const ServerContext = createContext({ ready: false, model: null, saes: [], attached: [], refresh: () => {} });
export const useServer = () => useContext(ServerContext);

/** Runs `load()` now and whenever `deps` change: {value, error, loading, reload}. */
export function useLoad(load, deps = []) {
  const [state, setState] = useState({ value: undefined, error: null, loading: true });
  const generation = useRef(0);
  const reload = useCallback(async () => {
    const mine = ++generation.current;
    setState((s) => ({ ...s, loading: true }));
    try {
      const value = await load();
      if (mine === generation.current) setState({ value, error: null, loading: false });
    } catch (error) {
      if (mine === generation.current) setState((s) => ({ value: s.value, error, loading: false }));
    }
  }, deps);
  useEffect(() => {
    reload();
  }, [reload]);
  return { ...state, reload };
}

/** An action's busy flag and error: `run(fn)` shows the error instead of dropping it. */
export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const run = useCallback(async (fn) => {
    setBusy(true);
    setError(null);
    try {
      return await fn();
    } catch (err) {
      if (err?.name !== "AbortError") setError(err);
      return undefined;
    } finally {
      setBusy(false);
    }
  }, []);
  return { busy, error, run, setError };
}

/** An error as a readable line: the API's code and message (never a silent no-op). */
export function ErrorNote({ error }) {
  if (!error) return null;
  const status = error.status ? `${error.status} ` : "";
  const code = error.code ? `${error.code}: ` : "";
  return html`<p class="error" role="alert">${status}${code}${error.message || String(error)}</p>`;
}

/** A polite status line (shown while loading, or a short confirmation). */
export const Note = ({ children }) => html`<p class="note" role="status">${children}</p>`;

/** A panel with a heading and optional actions on the right. */
export function Panel({ title, actions, children, id }) {
  return html`<section class="panel" id=${id} aria-label=${title}>
    <header class="panel-head"><h2>${title}</h2><div class="actions">${actions}</div></header>
    ${children}
  </section>`;
}

/** A plain table: `columns` are [heading, row => cell] pairs. */
export function Table({ columns, rows, empty = "Nothing yet.", rowKey = (r, i) => i, label }) {
  if (!rows?.length) return html`<p class="empty">${empty}</p>`;
  return html`<div class="table-wrap"><table aria-label=${label}>
    <thead><tr>${columns.map(([head]) => html`<th scope="col">${head}</th>`)}</tr></thead>
    <tbody>${rows.map((row, i) => html`<tr key=${rowKey(row, i)}>${columns.map(([, cell]) => html`<td>${cell(row, i)}</td>`)}</tr>`)}</tbody>
  </table></div>`;
}

/** A number to a few significant digits (null as an em dash). */
export function num(value, digits = 4) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(digits)));
}

/** A count with its noun: plural(1, "feature") is "1 feature", plural(3, "entry", "entries") "3 entries". */
export const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** Saves `text` as a file the user downloads. */
export function download(text, filename, type = "application/json") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** A file picker that hands the chosen file's text to `onText`. */
export function FileImport({ label, onText, accept = ".json,application/json" }) {
  const read = async (event) => {
    const file = event.target.files?.[0];
    if (file) onText(await file.text(), file.name);
    event.target.value = "";
  };
  return html`<label class="file-button">${label}<input type="file" accept=${accept} onChange=${read} /></label>`;
}

/** A link to a feature's card. */
export const FeatureLink = ({ sae, index, children }) =>
  html`<a href=${`#/features/${encodeURIComponent(sae)}/${index}`} class="feature-link">#${index}${children ? html` ${children}` : ""}</a>`;

/** A select of the attached SAEs (the value is the SAE id). */
export function SaePicker({ value, onChange, label = "SAE" }) {
  const { attached } = useServer();
  if (!attached.length) return html`<span class="note">No SAE is attached (Models & SAEs).</span>`;
  return html`<label class="inline">${label}
    <select value=${value} onChange=${(e) => onChange(e.target.value)}>
      ${attached.map((s) => html`<option value=${s.id}>${s.id} · layer ${s.attached_layer}</option>`)}
    </select></label>`;
}

/** The SAE a view works on: the first attached one until the user picks another. */
export function useSae() {
  const { attached } = useServer();
  const [chosen, setChosen] = useState(null);
  const sae = attached.find((s) => s.id === chosen) ? chosen : attached[0]?.id ?? null;
  return [sae, setChosen];
}

/** A progress bar with its figures. */
export function Progress({ done, total, unit }) {
  const pct = total ? Math.round((100 * done) / total) : 0;
  return html`<span class="progress"><progress max=${total || 1} value=${done || 0} aria-label=${`${pct}%`}></progress>
    <span>${done ?? 0}/${total ?? "?"} ${unit || ""} (${pct}%)</span></span>`;
}

/** A started job, polled every second until it ends (then `onEnd(job)`), with its progress and a Cancel button. */
export function JobProgress({ job: started, onEnd, label = "Job" }) {
  const [job, setJob] = useState(started);
  const poll = useAction();
  const running = job.state === "running";
  useEffect(() => setJob(started), [started.id]);
  useEffect(() => {
    if (!running) { onEnd?.(job); return undefined; }
    const timer = setTimeout(() => poll.run(async () => setJob(await api.jobs.get(job.id))), 1000);
    return () => clearTimeout(timer);
  }, [job]);
  return html`<div class="job-progress" aria-label=${label}>
    <div class="row"><${Progress} done=${job.progress.done} total=${job.progress.total} unit=${job.progress.unit} />
      <span class=${`badge ${job.state === "succeeded" ? "good" : job.state === "failed" ? "bad" : ""}`} data-state=${job.state}>${job.state}</span>
      ${running ? html`<button class="danger" onClick=${() => poll.run(async () => setJob(await api.jobs.cancel(job.id)))}>Cancel</button>` : null}</div>
    ${job.error ? html`<p class="error" role="alert">${job.error.code}: ${job.error.message}</p>` : null}
    <${ErrorNote} error=${poll.error} />
  </div>`;
}

const labelCache = new Map();
/** An SAE's labels as `{index: label}` (one export request per SAE per page load; {} until it arrives or when it fails). */
export function useLabels(sae) {
  const [labels, setLabels] = useState(() => labelCache.get(sae) || {});
  useEffect(() => {
    if (!sae) return;
    if (!labelCache.has(sae)) labelCache.set(sae, api.saes.labels(sae).catch(() => ({})));
    Promise.resolve(labelCache.get(sae)).then((value) => setLabels(value || {}));
  }, [sae]);
  return labels;
}

/** A delete button that asks once more: the first press arms it (same button, so focus stays), the second acts. */
export function ConfirmButton({ label, confirm, onConfirm, disabled }) {
  const [armed, setArmed] = useState(false);
  const press = () => {
    if (!armed) return setArmed(true);
    setArmed(false);
    return onConfirm();
  };
  return html`<button class="danger" disabled=${disabled} onClick=${press}>${armed ? confirm : label}</button>${
    armed ? html`<button class="secondary" onClick=${() => setArmed(false)}>Keep</button>` : null}`;
}

/** A file name for an exported document: its name, kept to safe characters. */
export function fileName(name, kind) {
  return `${String(name).replace(/[^A-Za-z0-9._-]+/g, "_")}.${kind}.json`;
}

/** A panel's actions: each one reloads every panel (`changed`), and its confirmation is shown
 *  until another change, here or in another panel, makes it stale. */
export function usePanelActions(version, changed) {
  const act = useAction();
  const [notice, setNotice] = useState(null);
  const say = (text) => setNotice({ text, at: version + 1 }); // the version this action's change brings
  const run = (fn) => act.run(async () => {
    setNotice(null);
    const message = await fn();
    changed();
    if (message) say(message);
  });
  return { act, run, say, notice: notice && notice.at >= version ? notice.text : "" };
}
