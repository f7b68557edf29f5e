// Monitoring: its settings (on/off, SAE, watched features, top_k, positions, percentiles), a live
// chart of the watched features over requests fed by /api/monitoring/stream, the statistics
// table and the latest records.

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
    <${Panel} title="Latest records">
      <${Table} label="Latest records" rows=${latest} rowKey=${(r) => r.id} empty="No record yet."
        columns=${[
          ["Record", (r) => html`${r.id} <span class="meta mono">${r.request_id}</span>`],
          ["Positions", (r) => r.positions.length],
          ["Strongest", (r) => {
            const top = [...peaks(r).entries()].filter(([, value]) => value > 0).sort((a, b) => b[1] - a[1]).slice(0, 3);
            return top.map(([index, value]) => html`<span class="chip"><${FeatureLink} sae=${r.sae_id} index=${index} /> ${num(value, 3)}</span> `);
          }],
          ["Probes", (r) => (r.probes || []).map((p) => html`<span class=${`badge ${p.fired ? "bad" : ""}`}>${p.name}${p.fired ? ` fired @${p.first_position}` : ""}</span> `)],
        ]} />
    <//>`;
}
