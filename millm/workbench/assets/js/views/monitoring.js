// Monitoring: its settings (on/off, SAE, watched features, top_k, positions, percentiles, token
// text, labels), a live chart of the watched features over requests fed by /api/monitoring/stream,
// the statistics table, and the latest records, each opening its request's prompt
// (/api/monitoring/requests/{id}) with a position of the record marked.

import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import * as api from "../api.js";
import { ErrorNote, FeatureLink, Note, Panel, SaePicker, Table, html, num, plural, useAction, useLabels, useLoad, useServer } from "../ui.js";

const POSITIONS = ["completion", "prompt", "all", "last"];
const MAX_POINTS = 200; // requests kept on the chart
const COLOURS = ["#1f5fbf", "#d1495b", "#2e8540", "#e09f3e", "#7b2cbf", "#00798c", "#6c757d", "#9c6644"];
const MAX_SERIES = COLOURS.length;

/** "1, 5,9" to [1, 5, 9]; empty to null (every feature); a bad entry throws a readable error. */
function parseFeatures(text) {
  const parts = text.split(/[\s,]+/).filter(Boolean);
  if (!parts.length) return null;
  return parts.map((part) => {
    if (!/^\d+$/.test(part)) throw new Error(`"${part}" is not a feature index`);
    return Number(part);
  });
}

function Settings({ settings, onChanged }) {
  const act = useAction();
  const [form, setForm] = useState(null);
  useEffect(() => {
    if (settings) setForm({
      sae_id: settings.sae_id ?? settings.reading?.sae_id ?? "",
      features: settings.features ? settings.features.join(", ") : "",
      top_k: settings.top_k,
      positions: settings.positions,
      percentiles: settings.percentiles,
      tokens: settings.tokens,
      labels: settings.labels,
    });
  }, [settings]);
  if (!form) return null;
  const set = (field) => (e) => setForm({ ...form, [field]: e.target.type === "checkbox" ? e.target.checked : e.target.value });
  const save = (e) => {
    e.preventDefault();
    act.run(async () => {
      await api.monitoring.configure({
        ...(form.sae_id ? { sae_id: form.sae_id } : {}),
        features: parseFeatures(form.features),
        top_k: Number(form.top_k),
        positions: form.positions,
        percentiles: form.percentiles,
        tokens: form.tokens,
        labels: form.labels,
      });
      onChanged();
    });
  };
  const toggle = () => act.run(async () => {
    await (settings.enabled ? api.monitoring.disable() : api.monitoring.enable());
    onChanged();
  });
  const reset = () => act.run(async () => { await api.monitoring.reset(); onChanged(true); });
  return html`<${Panel} title="Monitoring settings" actions=${html`
      <span class=${`badge ${settings.enabled ? "good" : ""}`} data-testid="monitoring-state">${settings.enabled ? "on" : "off"}</span>
      <button onClick=${toggle} disabled=${act.busy}>${settings.enabled ? "Turn off" : "Turn on"}</button>`}>
    <form onSubmit=${save} noValidate>
      <div class="row"><${SaePicker} value=${form.sae_id} onChange=${(v) => setForm({ ...form, sae_id: v })} label="Read through" /></div>
      <label>Watched features (indices, comma-separated; empty watches every feature)
        <input value=${form.features} onInput=${set("features")} name="features" placeholder="1403, 619, 1496" /></label>
      <div class="row">
        <label class="inline">Top features per position <input type="number" min="1" max="64" value=${form.top_k} onInput=${set("top_k")} name="top_k" /></label>
        <label class="inline">Positions <select value=${form.positions} onChange=${set("positions")} name="positions">
          ${POSITIONS.map((p) => html`<option value=${p}>${p}</option>`)}</select></label>
        <label class="inline"><input type="checkbox" checked=${form.percentiles} onChange=${set("percentiles")} name="percentiles" /> Percentiles</label>
        <label class="inline"><input type="checkbox" checked=${form.tokens} onChange=${set("tokens")} name="tokens" /> Token text</label>
        <label class="inline"><input type="checkbox" checked=${form.labels} onChange=${set("labels")} name="labels" /> Feature labels</label>
      </div>
      <div class="row"><button type="submit" disabled=${act.busy}>Save settings</button>
        <button type="button" class="danger" onClick=${reset} disabled=${act.busy}>Reset records and statistics</button></div>
    </form>
    <${ErrorNote} error=${act.error} />
    <p class="meta">Reads ${settings.reading ? `${settings.reading.sae_id} at layer ${settings.reading.layer}` : "nothing (no SAE attached)"}, ${settings.read_point}; ${plural(settings.requests, "request")} and ${plural(settings.positions_read, "position")} recorded;
      history ${settings.history.records}/${settings.history.max}; queue ${settings.queue.pending}/${settings.queue.max}, ${settings.queue.dropped} dropped.</p>
  <//>`;
}

/** A record's value of each feature: its largest activation over the record's positions. */
function peaks(record) {
  const best = new Map();
  for (const position of record.positions) {
    for (const f of position.features) best.set(f.index, Math.max(best.get(f.index) ?? 0, f.value));
  }
  return best;
}

/** Which features the chart draws: the watched ones, else the most frequent in what arrived. */
function chartedFeatures(watched, records) {
  if (watched?.length) return watched.slice(0, MAX_SERIES);
  const seen = new Map();
  for (const record of records) for (const [index] of peaks(record)) seen.set(index, (seen.get(index) || 0) + 1);
  return [...seen.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]).slice(0, MAX_SERIES).map(([index]) => index).sort((a, b) => a - b);
}

function Chart({ records, features, labels }) {
  const box = useRef(null);
  const plot = useRef(null);
  const key = `${features.join(",")}|${Object.keys(labels).length}`;
  const data = () => [records.map((r) => r.id), ...features.map((index) => records.map((r) => peaks(r).get(index) ?? 0))];
  useEffect(() => {
    const element = box.current;
    if (!element) return undefined;
    const options = {
      width: element.clientWidth || 600,
      height: 260,
      scales: { x: { time: false } },
      axes: [{ label: "record (request)", incrs: [1, 2, 5, 10, 20, 50, 100] }, { label: "peak activation" }],
      series: [{ label: "record" }, ...features.map((index, i) => ({ label: labels[index] ? `#${index} ${labels[index]}` : `#${index}`, stroke: COLOURS[i], width: 2, points: { show: true, size: 5 } }))],
    };
    plot.current = new uPlot(options, data(), element);
    const resize = new ResizeObserver(() => plot.current?.setSize({ width: element.clientWidth, height: 260 }));
    resize.observe(element);
    return () => { resize.disconnect(); plot.current?.destroy(); plot.current = null; };
  }, [key]);
  useEffect(() => { plot.current?.setData(data()); }, [records, key]);
  return html`<div class="chart" ref=${box} role="img" aria-label=${`Peak activation per request of features ${features.join(", ") || "(none yet)"}`}></div>`;
}

/** Subscribes to the live feed while the view is open; records arrive newest last. */
function useLiveRecords(onRecord) {
  const [records, setRecords] = useState([]);
  const [error, setError] = useState(null);
  const [connected, setConnected] = useState(false);
  useEffect(() => {
    const stop = new AbortController();
    let retry;
    const add = (list) => setRecords((old) => {
      const ids = new Set(old.map((r) => r.id));
      return [...old, ...list.filter((r) => !ids.has(r.id))].slice(-MAX_POINTS);
    });
    const connect = async () => {
      try {
        const recent = await api.monitoring.records({ limit: 50 });
        add(recent.data);
        setConnected(true);
        setError(null);
        await api.monitoring.watch((record) => { add([record]); onRecord(); }, stop.signal);
      } catch (err) {
        if (err.name === "AbortError") return;
        setError(err);
      }
      setConnected(false);
      retry = setTimeout(connect, 3000); // the server restarted or the stream ended: reconnect
    };
    connect();
    return () => { stop.abort(); clearTimeout(retry); };
  }, []);
  return { records, setRecords, error, connected };
}

function Stats({ stats, labels }) {
  return html`<${Table} label="Feature statistics" rows=${stats?.features || []} rowKey=${(f) => f.index}
    empty="No statistics yet: monitoring records generation requests while it is on."
    columns=${[
      ["Feature", (f) => html`<${FeatureLink} sae=${stats.sae_id || ""} index=${f.index} /> <span class="meta">${labels[f.index] || ""}</span>`],
      ["Fired at", (f) => html`<span class="num">${f.count}</span>`],
      ["Mean when fired", (f) => num(f.mean)],
      ["Max", (f) => num(f.max)],
      ["Active", (f) => `${num(100 * f.fraction_active, 3)}%`],
    ]} />`;
}

/** A token as it shows on its own: white space made visible (· for a space, ↵ for a line break), ∅ for nothing. */
const shown = (token) => (/^\s*$/.test(token) ? token.replace(/ /g, "·").replace(/\n/g, "↵") || "∅" : token.replace(/\n/g, "↵"));

/** A record's features by their peak: index, value, the position and token where it peaked, and
 *  the label the record carries (absent when the record was made without labels). */
function strongest(record) {
  const best = new Map();
  for (const position of record.positions) {
    for (const f of position.features) {
      if (f.value > (best.get(f.index)?.value ?? 0)) best.set(f.index, { ...f, position: position.position, token: position.token });
    }
  }
  return [...best.values()].sort((a, b) => b.value - a.value);
}

/** A feature entry as a chip: its link, its label when the record carries one, its value, and
 *  where (the token's text when the record carries it, else the position). */
const FeatureChip = ({ sae, entry, where = true }) => html`<span class="chip"><${FeatureLink} sae=${sae} index=${entry.index} />${
  entry.label ? html` <span class="meta">${entry.label}</span>` : ""} ${num(entry.value, 3)}${
  where ? html`<span class="meta"> at ${entry.token != null ? `“${shown(entry.token)}”` : `@${entry.position}`}</span>` : ""}</span> `;

/** Where a record's positions sit in the prompt's text (position → [start, end)): those whose token
 *  text the record carries and that line up with the text, from its start and (when the text is
 *  whole) from its end. The prompt route gives text, not token offsets, so nothing else is placed. */
function place(prompt, positions) {
  const text = prompt.text;
  const texts = new Map(positions.filter((p) => p.token != null && p.position < prompt.tokens).map((p) => [p.position, p.token]));
  const at = new Map();
  let start = 0;
  for (let p = 0; texts.has(p) && text.startsWith(texts.get(p), start); p += 1) {
    at.set(p, [start, start + texts.get(p).length]);
    start += texts.get(p).length;
  }
  if (prompt.truncated) return at;
  let end = text.length;
  for (let p = prompt.tokens - 1; texts.has(p) && !at.has(p); p -= 1) {
    const token = texts.get(p);
    if (end - token.length < start || text.slice(end - token.length, end) !== token) break;
    at.set(p, [end - token.length, end]);
    end -= token.length;
  }
  return at;
}

/** The prompt's text, the marked position in it (when it can be placed), then the answer's
 *  recorded tokens (when the record carries their text), the marked one among them. */
function PromptText({ prompt, record, marked }) {
  const at = place(prompt, record.positions).get(marked);
  const text = prompt.text;
  const answer = record.positions.filter((p) => p.position >= prompt.tokens && p.token != null);
  const markedToken = (token) => html`<mark data-position=${marked}>${/^\s*$/.test(token) ? shown(token) : token}</mark>`;
  return html`<div class="tokens prompt-text" role="group" aria-label="Prompt text">${
    at ? html`${text.slice(0, at[0])}${markedToken(text.slice(at[0], at[1]))}${text.slice(at[1])}` : text}${
    prompt.truncated ? html`<span class="cut">… (${prompt.chars - text.length} more characters not kept: MONITORING_PROMPT_MAX_CHARS)</span>` : ""}${
    answer.length ? html`<span class="answer-tokens" title="The answer's tokens the record read">${answer.map((p, i) => html`${
      (i ? answer[i - 1].position : prompt.tokens - 1) < p.position - 1 ? html`<span class="cut">…</span>` : ""}${
      p.position === marked ? markedToken(p.token) : p.token}`)}</span>` : ""}</div>`;
}

/** A sentence on the marked position: where it is, whether the text shows it, what fired there. */
function MarkedPosition({ prompt, record, marked }) {
  const position = record.positions.find((p) => p.position === marked);
  if (!position) return null;
  const inPrompt = marked < prompt.tokens;
  const placed = inPrompt ? place(prompt, record.positions).has(marked) : position.token != null;
  const where = inPrompt ? `in the prompt (positions 0–${prompt.tokens - 1})` : `in the answer (from position ${prompt.tokens})`;
  const why = placed ? "" : inPrompt
    ? " Not marked in the text: the record does not carry the token texts that place it (turn on Token text and record the prompt's positions)."
    : " The answer's tokens are not shown: the record carries no token text (turn on Token text).";
  const fired = position.features.filter((f) => f.value > 0);
  return html`<p class="meta" data-testid="marked-position">Position ${marked}${position.token != null ? ` “${shown(position.token)}”` : ""}, ${where}.${why}
    ${fired.length ? html` Fired there: ${fired.map((f) => html`<${FeatureChip} sae=${record.sae_id} entry=${f} where=${false} />`)}` : " No recorded feature fired there."}</p>`;
}

/** The prompt a record's request sent, as the model read it, with one of the record's positions marked. */
function RequestPrompt({ record, onClose }) {
  const loaded = useLoad(() => api.monitoring.request(record.request_id), [record.request_id]);
  const [marked, setMarked] = useState(() => (strongest(record)[0] ?? record.positions[0])?.position ?? null);
  const data = loaded.value;
  const prompt = data && (data.prompts.find((p) => p.index === record.prompt_index) ?? data.prompts[0]);
  const forgotten = loaded.error?.code === "monitored_request_not_found";
  return html`<section class="request-prompt" aria-label=${`Prompt of ${record.request_id}`}>
    <div class="row"><h3 class="grow">Prompt of <span class="mono">${record.request_id}</span> (record ${record.id})</h3>
      <button class="secondary" onClick=${onClose}>Close</button></div>
    ${forgotten ? html`<${Note}>The server no longer keeps this request's prompt; the record stays.<//>` : null}
    <${ErrorNote} error=${loaded.error} />
    ${!data && !loaded.error ? html`<${Note}>Loading…<//>` : null}
    ${prompt ? html`
      <p class="meta">${data.model} · admitted ${new Date(data.time * 1000).toLocaleTimeString()} · prompt ${prompt.index + 1} of ${data.prompts.length} · ${
        plural(prompt.tokens, "token")}, ${plural(prompt.chars, "character")}${prompt.truncated ? `, the first ${prompt.text.length} kept` : ""}</p>
      ${record.positions.length ? html`<label class="inline">Mark position <select value=${marked ?? ""} onChange=${(e) => setMarked(Number(e.target.value))}>
        ${record.positions.map((p) => html`<option value=${p.position}>${p.position}${p.token != null ? ` “${shown(p.token)}”` : ""} (${p.position < prompt.tokens ? "prompt" : "answer"})</option>`)}
      </select></label>` : null}
      <${PromptText} prompt=${prompt} record=${record} marked=${marked} />
      <${MarkedPosition} prompt=${prompt} record=${record} marked=${marked} />` : null}
  </section>`;
}

/** The latest records: each one's request (a button opening its prompt), its token text, its
 *  strongest features with their labels, and its probes' verdicts. */
function LatestRecords({ records }) {
  const [open, setOpen] = useState(null);
  const section = useRef(null);
  useEffect(() => { section.current?.querySelector(".request-prompt")?.scrollIntoView({ block: "nearest" }); }, [open?.id]);
  return html`<${Panel} title="Latest records">
    <${Table} label="Latest records" rows=${records} rowKey=${(r) => r.id} empty="No record yet."
      columns=${[
        ["Record", (r) => html`${r.id} <button class="secondary mono request-id" aria-expanded=${open?.id === r.id}
          title="Open the prompt of this request" onClick=${() => setOpen(open?.id === r.id ? null : r)}>${r.request_id}</button>${
          r.prompt_index ? html` <span class="meta">prompt ${r.prompt_index + 1}</span>` : ""}`],
        ["Positions", (r) => {
          const tokens = r.positions.filter((p) => p.token != null);
          const first = r.positions[0]?.position;
          const last = r.positions.at(-1)?.position;
          return html`${r.positions.length}${r.positions.length ? html` <span class="meta">(${first === last ? first : `${first}–${last}`})</span>` : ""}${
            tokens.length ? html`<div class="record-text" title=${tokens.map((p) => p.token).join("")}>${tokens.map((p) => p.token).join("")}</div>` : ""}`;
        }],
        ["Strongest", (r) => strongest(r).filter((f) => f.value > 0).slice(0, 3).map((f) => html`<${FeatureChip} sae=${r.sae_id} entry=${f} />`)],
        ["Probes", (r) => (r.probes || []).map((p) => html`<span class=${`badge ${p.fired ? "bad" : ""}`}>${p.name}${p.fired ? ` fired @${p.first_position}` : ""}</span> `)],
      ]} />
    <div ref=${section}>${open ? html`<${RequestPrompt} key=${open.id} record=${open} onClose=${() => setOpen(null)} />` : null}</div>
  <//>`;
}

export default function MonitoringView() {
  const server = useServer();
  const settings = useLoad(() => api.monitoring.get());
  const stats = useLoad(() => api.monitoring.stats());
  const pending = useRef(null);
  // Statistics refresh after records arrive, at most twice a second.
  const onRecord = () => {
    if (pending.current) return;
    pending.current = setTimeout(() => { pending.current = null; stats.reload(); settings.reload(); }, 500);
  };
  const live = useLiveRecords(onRecord);
  const changed = (wasReset) => {
    settings.reload();
    stats.reload();
    if (wasReset === true) live.setRecords([]);
  };
  const watched = settings.value?.features;
  const features = chartedFeatures(watched, live.records);
  const sae = settings.value?.reading?.sae_id || server.attached[0]?.id || "";
  const latest = live.records.slice(-8).reverse();
  const labels = useLabels(sae);
  return html`
    <${ErrorNote} error=${settings.error} />
    ${settings.value ? html`<${Settings} settings=${settings.value} onChanged=${changed} />` : html`<${Note}>Loading…<//>`}
    <${Panel} title="Live chart" actions=${html`<span class=${`badge ${live.connected ? "good" : ""}`} data-testid="feed">${live.connected ? "live" : "connecting…"}</span>
        <span class="meta" data-testid="points">${plural(live.records.length, "request")}</span>`}>
      <${ErrorNote} error=${live.error} />
      <${Chart} records=${live.records} features=${features} labels=${labels} />
      <p class="meta">Each point is one request: the feature's largest activation over its recorded positions (0 where it was not among them).
        ${watched?.length ? "" : ` No features are watched, so the chart shows the ${MAX_SERIES} seen most often.`}</p>
    <//>
    <${Panel} title="Statistics since the last reset" actions=${html`<button class="secondary" onClick=${stats.reload}>Refresh</button>`}>
      <${ErrorNote} error=${stats.error} />
      <${Stats} stats=${stats.value && { ...stats.value, sae_id: sae }} labels=${labels} />
    <//>
    <div class="wide"><${LatestRecords} records=${latest} /></div>`;
}
