// Features: the ranked label search, a feature's card (#/features/<sae>/<index>: label, calibration
// figures, top snippets, neighbours, a steer slider, "make a probe", explanations a model wrote and
// "explain it"), explaining a batch of features as a job, and the live steering table (every live
// feature with its control, enable/disable, clear, save the live values as a profile).

import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import * as api from "../api.js";
import { ExplainBatch, Explanations } from "./explanations.js";
import { TopTokenLabels } from "./top_token_labels.js";
import { liveRows, useLive } from "../live.js";
import { ErrorNote, FeatureLink, JobProgress, Note, Panel, SaePicker, Table, html, num, plural, useAction, useLoad, useSae, useServer } from "../ui.js";

const LIMIT = 200; // the spec's clamp on an add strength (docs/steering.md)
const SEARCH_LIMIT = 50;
const SEND_DELAY_MS = 250; // a slider's value is sent this long after the last change, not per step

/** One feature's live entry ({index, op, strength|value}) in a steering state, or null. */
function liveEntry(state, sae, index) {
  const entry = state?.saes?.find((s) => s.sae_id === sae);
  return entry?.features.find((f) => f.index === index) ?? null;
}

/** Calls `fn(value)` once changes stop for `delay` ms; the last value wins. */
function useDebounced(fn, delay) {
  const timer = useRef(null);
  const latest = useRef(fn);
  latest.current = fn;
  useEffect(() => () => clearTimeout(timer.current), []);
  return useCallback((value) => {
    clearTimeout(timer.current);
    timer.current = setTimeout(() => latest.current(value), delay);
  }, [delay]);
}

/** A slider (-200..200) with a number beside it; a value is sent on release or Enter, 0 clears. */
function StrengthControl({ index, strength, onSet, busy }) {
  const [value, setValue] = useState(String(strength ?? 0));
  useEffect(() => setValue(String(strength ?? 0)), [strength]);
  const send = useDebounced((v) => onSet(v), SEND_DELAY_MS);
  const commit = (raw) => {
    const v = Number(raw);
    if (raw === "" || !Number.isFinite(v)) return setValue(String(strength ?? 0));
    const clamped = Math.max(-LIMIT, Math.min(LIMIT, v));
    setValue(String(clamped));
    if (clamped !== (strength ?? 0)) send(clamped);
    return undefined;
  };
  const numeric = Number(value);
  return html`<div class="slider steer" aria-busy=${busy ? "true" : "false"}>
    <span class="steer-scale">−${LIMIT} <span class=${`steer-now ${numeric > 0 ? "up" : numeric < 0 ? "down" : ""}`}>${num(numeric)}</span> +${LIMIT}</span>
    <label class="bare"><span class="sr-only">Steer #${index}</span>
      <input type="range" min=${-LIMIT} max=${LIMIT} step="1" value=${value}
        onInput=${(e) => setValue(e.target.value)} onChange=${(e) => commit(e.target.value)} /></label>
    <label class="bare"><span class="sr-only">Strength of #${index}</span>
      <input type="number" min=${-LIMIT} max=${LIMIT} step="any" value=${value}
        onInput=${(e) => setValue(e.target.value)} onChange=${(e) => commit(e.target.value)} /></label>
  </div>`;
}

/** Ranked label search over the chosen SAE (an empty query lists every labelled feature by index). */
function Search({ sae, onSae }) {
  const { attached } = useServer();
  const [text, setText] = useState("");
  const [query, setQuery] = useState("");
  const [by, setBy] = useState("text");
  const [embedding, setEmbedding] = useState(null);
  const embed = useAction();
  useEffect(() => {
    const timer = setTimeout(() => setQuery(text.trim()), 300);
    return () => clearTimeout(timer);
  }, [text]);
  const found = useLoad(() => (sae ? api.saes.search(sae, query, SEARCH_LIMIT, by) : Promise.resolve(null)), [sae, query, by]);
  const result = found.value;
  const calibrated = result?.calibrated_on != null;
  return html`<${Panel} title="Search features">
    <form class="row" role="search" onSubmit=${(e) => { e.preventDefault(); setQuery(text.trim()); if (text.trim() === query) found.reload(); }}>
      ${attached.length > 1 || (sae && !attached.some((s) => s.id === sae)) ? html`<${SaePicker} value=${sae} onChange=${onSae} />` : null}
      <label class="grow">Search labels
        <input type="search" value=${text} onInput=${(e) => setText(e.target.value)} placeholder="pirate, Paris, code…" name="q" /></label>
      <label class="inline">By <select name="by" value=${by} onChange=${(e) => setBy(e.target.value)}>
        <option value="text">words</option><option value="meaning">meaning</option><option value="both">both</option></select></label>
      <button type="submit">Search</button>
      ${by !== "text" && sae ? html`<button type="button" class="secondary" disabled=${embed.busy || embedding?.state === "running"}
        title="The first search by meaning embeds every label; do it now, as a job"
        onClick=${() => embed.run(async () => setEmbedding(await api.saes.embedLabels(sae)))}>Embed the labels now</button>` : null}
    </form>
    <${ErrorNote} error=${embed.error} />
    ${embedding ? html`<${JobProgress} key=${embedding.id} job=${embedding} label="Embedding job" onEnd=${setEmbedding} />` : null}
    ${!sae ? html`<p class="note">No SAE is attached: attach one in <a href="#/system">Models, SAEs & jobs</a>.</p>` : null}
    <${ErrorNote} error=${found.error} />
    ${result ? html`<p class="note" role="status">${result.query
      ? `${result.data.length} best of ${plural(result.labels, "labelled feature")} for “${result.query}” (larger score = better match)`
      : `${result.data.length} of ${plural(result.labels, "labelled feature")}, by index`}${result.has_labels ? "" : " — this SAE has no labels"}</p>
    <div class="search-results"><${Table} label="Search results" rows=${result.data} rowKey=${(f) => f.index} empty="No label matches."
      columns=${[
        ["Feature", (f) => html`<${FeatureLink} sae=${sae} index=${f.index} />`],
        ["Label", (f) => f.label],
        ["Score", (f) => html`<span class="num">${f.score == null ? "—" : num(f.score, 4)}</span>`],
        ["Detection", (f) => (f.balanced_accuracy == null ? "" : html`<span class="num" title="the explanation's detection balanced accuracy">${num(f.balanced_accuracy, 2)}</span>`)],
        ...(calibrated ? [["Density", (f) => (f.frequency == null ? "—" : percent(f.frequency))]] : []),
        ["Source", (f) => html`<span class="meta">${f.source}</span>`],
      ]} /></div>` : found.loading && sae ? html`<${Note}>Searching…<//>` : null}
  <//>`;
}

const percent = (fraction) => `${num(100 * fraction, 3)}%`;

/** A snippet whose feature token is wrapped in <mark>. */
const Snippet = ({ before, token, after }) => html`<span class="snippet">${before}<mark>${token}</mark>${after}</span>`;

/** A label detail's `example` marks its token as [[token]]: shown with the token marked. */
function ExampleText({ text }) {
  const match = /^(.*?)\[\[(.*?)\]\](.*)$/s.exec(text);
  return match ? html`<${Snippet} before=${match[1]} token=${match[2]} after=${match[3]} />` : html`<span class="snippet">${text}</span>`;
}

/** The calibration figures of one feature, or why there are none. */
function Figures({ calib, decoderNorm }) {
  const missing = calib.error?.code === "calibration_not_found";
  const figure = calib.value?.features?.[0];
  const summary = calib.value?.summary;
  const rows = figure ? [
    ["Density (frequency)", `${num(figure.frequency, 6)}`, `${percent(figure.frequency)} of positions read`],
    ["Fired at", `${figure.count}`, "positions"],
    ["Max", num(figure.max, 6), ""],
    ["Mean (when firing)", num(figure.mean, 6), ""],
    ["p50", num(figure.p50, 6), "when firing"],
    ["p90", num(figure.p90, 6), "when firing"],
    ["p99", num(figure.p99, 6), "when firing"],
  ] : [];
  return html`<h3>Figures</h3>
    <dl class="figures" aria-label="Feature figures">
      ${rows.map(([name, value, unit]) => html`<div><dt>${name}</dt><dd><span class="num">${value}</span>${unit ? html` <span class="meta">${unit}</span>` : null}</dd></div>`)}
      <div><dt>Decoder norm</dt><dd><span class="num">${decoderNorm == null ? "—" : num(decoderNorm, 6)}</span> <span class="meta">per unit of strength</span></dd></div>
    </dl>
    ${summary ? html`<p class="meta">From a calibration of ${summary.model} on ${plural(summary.texts, "text")} (${plural(summary.positions, "position")}, corpus ${summary.corpus || "given texts"}).</p>` : null}
    ${missing ? html`<p class="note calibration-missing" role="note">This SAE has no calibration on the loaded model yet, so density, max and quantiles are unknown.
      Start a calibration job in <a href="#/system">Models, SAEs & jobs</a>.</p>` : html`<${ErrorNote} error=${calib.error} />`}
    ${figure ? html`<h3>Top activating snippets</h3>
      ${figure.top_examples?.length ? html`<ol class="snippets">${figure.top_examples.map((e) => html`<li>
        <span class="num act">${num(e.activation, 4)}</span> <${Snippet} before=${e.before} token=${e.token} after=${e.after} />
      </li>`)}</ol>` : html`<p class="empty">The calibration kept no snippet for this feature (it never fired).</p>`}` : null}`;
}

/** "Make a probe" from a feature: a feature detector with a raw or percentile threshold, action report. */
function MakeProbe({ sae, index, calibrated, p90 }) {
  const [open, setOpen] = useState(false);
  const [name, setName] = useState(`feature-${index}`);
  const [kind, setKind] = useState(calibrated ? "percentile" : "threshold");
  const [percentile, setPercentile] = useState("90");
  const [threshold, setThreshold] = useState(p90 ? String(p90) : "");
  const [watch, setWatch] = useState(false);
  const [made, setMade] = useState(null);
  const act = useAction();
  useEffect(() => { setName(`feature-${index}`); setMade(null); }, [sae, index]);
  useEffect(() => { setKind(calibrated ? "percentile" : "threshold"); if (p90) setThreshold(String(p90)); }, [calibrated, p90]);
  const submit = (e) => {
    e.preventDefault();
    act.run(async () => {
      const detector = { type: "feature", sae_id: sae, index, ...(kind === "percentile" ? { percentile: Number(percentile) } : { threshold: Number(threshold) }) };
      const probe = await api.probes.create({ name: name.trim(), description: `feature #${index} of ${sae}`, detector });
      if (watch) await api.probes.activate(probe.id);
      setMade({ ...probe, active: watch });
    });
  };
  if (!open) return html`<div class="row"><button class="secondary" onClick=${() => setOpen(true)} aria-expanded="false">Make a probe…</button>
    ${made ? html`<span class="ok-text" role="status">Probe “${made.name}” saved${made.active ? " and watching every request" : ""}. <a href="#/probes">Open Probes</a></span>` : null}</div>`;
  return html`<form class="probe-form" aria-label="Make a probe" onSubmit=${submit}>
    <h3>Make a probe of #${index}</h3>
    <label>Probe name <input value=${name} onInput=${(e) => setName(e.target.value)} name="probe-name" required maxlength="120" /></label>
    <fieldset>
      <legend>Fires when the activation reaches</legend>
      <label class="inline"><input type="radio" name="threshold-kind" checked=${kind === "percentile"} disabled=${!calibrated}
        onChange=${() => setKind("percentile")} /> a calibrated percentile</label>
      <label class="inline"><input type="radio" name="threshold-kind" checked=${kind === "threshold"}
        onChange=${() => setKind("threshold")} /> a raw activation</label>
      ${kind === "percentile"
        ? html`<label>Percentile (1–99) <input type="number" min="1" max="99" step="1" value=${percentile} onInput=${(e) => setPercentile(e.target.value)} required /></label>`
        : html`<label>Threshold (activation, above 0) <input type="number" min="0" step="any" value=${threshold} onInput=${(e) => setThreshold(e.target.value)} required /></label>`}
      ${calibrated ? null : html`<p class="meta">A percentile needs a calibration of this SAE on the loaded model.</p>`}
    </fieldset>
    <p class="meta">Action: <strong>report</strong> — requests that name the probe (or every request, while it is active) say whether and where it fired; steering or ending an answer on it is a profile's condition.</p>
    <label class="inline"><input type="checkbox" checked=${watch} onChange=${(e) => setWatch(e.target.checked)} /> Watch every request (activate it)</label>
    <div class="row">
      <button type="submit" disabled=${act.busy || !name.trim()}>Create probe</button>
      <button type="button" class="secondary" onClick=${() => setOpen(false)}>Close</button>
    </div>
    ${made ? html`<p class="ok-text" role="status">Probe “${made.name}” saved${made.active ? " and watching every request" : ""}. <a href="#/probes">Open Probes</a></p>` : null}
    <${ErrorNote} error=${act.error} />
  </form>`;
}

/** The card of one feature: what it means, how it fires, its neighbours, and a steer slider. */
function FeatureCard({ sae, index, steering }) {
  const valid = /^\d+$/.test(index);
  const i = valid ? Number(index) : null;
  const [k, setK] = useState(10);
  const detail = useLoad(() => (valid ? api.saes.feature(sae, i, k) : Promise.resolve(null)), [sae, index, k]);
  const calib = useLoad(() => (valid ? api.saes.calibration(sae, [i]) : Promise.resolve(null)), [sae, index]);
  const steer = useAction();
  const live = liveEntry(steering.state, sae, i);
  const f = detail.value;
  const figure = calib.value?.features?.[0];
  const set = (strength) => steer.run(() => steering.apply(() => api.steering.set(sae, i, { op: "add", strength })));
  useEffect(() => {
    // On a narrow window the card sits below the search results: bring a newly opened card into view.
    const card = document.getElementById("feature-card");
    if (card && card.getBoundingClientRect().top > innerHeight / 2) card.scrollIntoView({ block: "start" });
  }, [sae, index]);
  return html`<${Panel} title=${`Feature #${index}`} id="feature-card"
    actions=${html`<span class="mono meta">${sae}</span>`}>
    ${!valid ? html`<p class="error" role="alert">“${index}” is not a feature index (a whole number from 0).</p>` : null}
    <${ErrorNote} error=${detail.error} />
    ${f ? html`
      <p class="feature-label">${f.label ?? html`<span class="empty">No label</span>`}
        ${f.source ? html` <span class="badge">${f.source}</span>` : null}</p>
      ${f.detail?.top_tokens?.length ? html`<p class="meta">Top tokens: ${f.detail.top_tokens.map((t) => html`<code class="chip">${t}</code> `)}</p>` : null}
      ${f.detail?.example ? html`<p class="meta">Example: <${ExampleText} text=${f.detail.example} /></p>` : null}

      <h3>Steer</h3>
      <${StrengthControl} key=${`${sae}:${i}`} index=${i} strength=${live?.op === "add" ? live.strength : 0} onSet=${set} busy=${steer.busy} />
      <p class="meta" role="status">${live
        ? live.op === "add" ? `Live: add ${num(live.strength)}` : `Live: ${live.op}${live.value != null ? ` at ${num(live.value)}` : ""} (moving the slider replaces it with add)`
        : "Not steered (0 clears)."}${steering.state && !steering.state.live ? ` — ${steering.state.live_reason}` : ""}</p>
      <${ErrorNote} error=${steer.error} />

      <${Figures} calib=${calib} decoderNorm=${f.decoder_norm} />

      <h3>Nearest neighbours <span class="meta">(decoder cosine)</span></h3>
      <div class="row"><label class="inline">Show
        <select value=${k} onChange=${(e) => setK(Number(e.target.value))}>${[5, 10, 20, 50].map((n) => html`<option value=${n}>${n}</option>`)}</select></label></div>
      <${Table} label="Nearest neighbours" rows=${f.neighbours} rowKey=${(n) => n.index}
        columns=${[
          ["Feature", (n) => html`<${FeatureLink} sae=${sae} index=${n.index} />`],
          ["Label", (n) => n.label ?? html`<span class="empty">no label</span>`],
          ["Cosine", (n) => html`<span class="num">${num(n.cosine, 3)}</span>`],
        ]} />

      <h3>Explanations <span class="meta">(written and scored by a model)</span></h3>
      <${Explanations} sae=${sae} index=${i} explanations=${f.explanations || []} onEnd=${() => detail.reload()} />

      <h3>Probe</h3>
      <${MakeProbe} sae=${sae} index=${i} calibrated=${!!figure?.p90} p90=${figure?.p90} />
    ` : detail.loading && valid ? html`<${Note}>Loading #${index}…<//>` : null}
  <//>`;
}

/** The label of each live feature, fetched once per feature (the steering state carries none). */
function useLabels(keys) {
  const [labels, setLabels] = useState({});
  const asked = useRef(new Set());
  useEffect(() => {
    for (const [sae, index] of keys) {
      const id = `${sae}:${index}`;
      if (asked.current.has(id)) continue;
      asked.current.add(id);
      api.saes.feature(sae, index, 1).then(
        (f) => setLabels((l) => ({ ...l, [id]: f.label ?? "" })),
        () => asked.current.delete(id), // a label is decoration here: the table still works without it
      );
    }
  }, [keys.map(([s, i]) => `${s}:${i}`).join(",")]);
  return labels;
}

/** A clamp or cap target: a number sent on Enter or leaving the field. */
function ValueControl({ index, op, value, onSet }) {
  const [text, setText] = useState(String(value));
  useEffect(() => setText(String(value)), [value]);
  const commit = () => {
    const v = Number(text);
    if (text === "" || !Number.isFinite(v)) return setText(String(value));
    if (v !== value) onSet(v);
    return undefined;
  };
  return html`<label class="bare"><span class="sr-only">${op} value of #${index}</span>
    <input type="number" min="0" step="any" class="value-input" value=${text} onInput=${(e) => setText(e.target.value)} onChange=${commit} /></label>`;
}

/** Every live feature with its control, global enable/disable, clear all, and save-as-profile. */
function LiveSteering({ steering }) {
  const act = useAction();
  const [name, setName] = useState("");
  const [saved, setSaved] = useState(null);
  const state = steering.state;
  const rows = liveRows(state);
  const labels = useLabels(rows.map((r) => [r.sae, r.index]));
  const change = (call) => act.run(() => steering.apply(call));
  const save = (e) => {
    e.preventDefault();
    act.run(async () => {
      const profile = await api.profiles.saveCurrent({ name: name.trim() });
      setSaved(profile);
      setName("");
    });
  };
  const enabled = state?.enabled;
  return html`<${Panel} title="Live steering"
    actions=${html`
      ${state ? html`<span class=${`badge ${enabled ? "good" : "bad"}`} role="status" aria-label="Global steering">${enabled ? "steering on" : "steering off"}</span>` : null}
      ${state ? html`<button class="secondary" disabled=${act.busy} onClick=${() => change(enabled ? api.steering.disable : api.steering.enable)}>
        ${enabled ? "Disable steering" : "Enable steering"}</button>` : null}
      <button class="danger" disabled=${act.busy || !rows.length} onClick=${() => change(() => api.steering.clear())}>Clear all</button>
      <button class="secondary" onClick=${steering.load}>Refresh</button>`}>
    <${ErrorNote} error=${steering.error || act.error} />
    ${state ? html`<p class="meta">Version ${state.version} · base: ${state.source}${state.active_base ? ` (${state.active_base.kind} “${state.active_base.name}”)` : ""}
      · ${state.live ? "live values apply to requests admitted from now on" : state.live_reason}</p>` : null}
    <${Table} label="Live steering" rows=${rows} rowKey=${(r) => `${r.sae}:${r.index}`}
      empty="No feature is steered live. Use a feature card's slider to add one."
      columns=${[
        ["Feature", (r) => html`<${FeatureLink} sae=${r.sae} index=${r.index} /> <span>${labels[`${r.sae}:${r.index}`] || ""}</span>
          <div class="meta mono">${r.sae}${r.attached ? "" : " (not attached)"}</div>`],
        ["Op", (r) => html`<span class="badge">${r.op}</span>`],
        ["Value", (r) => r.op === "add"
          ? html`<${StrengthControl} index=${r.index} strength=${r.strength}
              onSet=${(strength) => change(() => api.steering.set(r.sae, r.index, { op: "add", strength }))} busy=${act.busy} />`
          : r.op === "ablate" ? html`<span class="meta">held at 0 where it fires</span>`
          : html`<${ValueControl} index=${r.index} op=${r.op} value=${r.value}
              onSet=${(value) => change(() => api.steering.set(r.sae, r.index, { op: r.op, value }))} />`],
        ["", (r) => html`<button class="danger" aria-label=${`Remove #${r.index}`} disabled=${act.busy}
          onClick=${() => change(() => api.steering.clearOne(r.sae, r.index))}>Remove</button>`],
      ]} />
    <form class="row" onSubmit=${save} aria-label="Save the live values as a profile">
      <label class="grow">Save the live values as a profile named
        <input value=${name} onInput=${(e) => setName(e.target.value)} name="profile-name" maxlength="120" placeholder="my-profile" /></label>
      <button type="submit" disabled=${act.busy || !name.trim() || !rows.length}>Save as profile</button>
    </form>
    ${saved ? html`<p class="ok-text" role="status">Saved profile “${saved.name}” (${saved.id}). See <a href="#/documents">Profiles, clusters, circuits</a>.</p>` : null}
  <//>`;
}

/** The Features tab; `args` is [sae, index] from #/features/<sae>/<index>. */
export default function FeaturesView({ args }) {
  const [picked, setPicked] = useSae();
  const sae = args[0] || picked;
  const index = args[1];
  const steering = useLive(); // the shell's copy: the bar on every tab shows the same state
  const onSae = (id) => {
    setPicked(id);
    location.hash = `#/features/${encodeURIComponent(id)}`;
  };
  return html`<${Search} sae=${sae} onSae=${onSae} />
    ${sae && index !== undefined
      ? html`<${FeatureCard} sae=${sae} index=${index} steering=${steering} />`
      : html`<${Panel} title="Feature card"><p class="note">Open a feature from the search results to see its card and steer it.</p><//>`}
    <div class="wide"><${LiveSteering} steering=${steering} /></div>
    ${sae ? html`<div class="wide"><${TopTokenLabels} sae=${sae} /></div>` : null}
    ${sae ? html`<div class="wide"><${ExplainBatch} sae=${sae} /></div>` : null}`;
}
