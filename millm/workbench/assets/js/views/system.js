// Models, SAEs and jobs: registered models with their state (load, unload, lock), SAEs (register,
// attach, detach), and the jobs list (calibration, AutoSteer, training) with progress and cancel.

import { useEffect, useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, FeatureLink, Note, Panel, Progress, Table, html, num, plural, useAction, useLoad, useSae, SaePicker, useServer } from "../ui.js";

function Models() {
  const server = useServer();
  const list = useLoad(() => api.models.list());
  const act = useAction();
  const [source, setSource] = useState("");
  const run = (fn) => act.run(async () => { await fn(); await list.reload(); server.refresh(); });
  const models = list.value?.data || [];
  return html`<${Panel} title="Models" actions=${html`<button class="secondary" onClick=${list.reload}>Refresh</button>`}>
    <${ErrorNote} error=${list.error || act.error} />
    <${Table} label="Registered models" rows=${models} rowKey=${(m) => m.id} empty="No model is registered."
      columns=${[
        ["Model", (m) => html`<strong>${m.id}</strong><div class="meta">${m.source}</div>`],
        ["State", (m) => html`<span class=${`badge ${m.state === "loaded" ? "good" : m.state === "failed" ? "bad" : ""}`}>${m.state}</span>
          ${m.locked ? html` <span class="badge">locked</span>` : null}${m.error ? html`<div class="error">${m.error}</div>` : null}`],
        ["Size", (m) => html`${m.parameters ? `${num(m.parameters / 1e6, 3)}M` : "—"} ${m.quantization || ""}
          ${m.loaded ? html`<div class="meta">${m.loaded.device} · ${m.loaded.dtype} · ${m.loaded.max_model_len} tokens</div>` : null}`],
        ["", (m) => html`<div class="actions">
          ${m.state === "loaded"
            ? html`<button class="secondary" disabled=${act.busy} onClick=${() => run(() => api.models.unload(m.id))}>Unload</button>`
            : html`<button disabled=${act.busy || m.state === "loading"} onClick=${() => run(() => api.models.load(m.id))}>Load</button>`}
          ${m.locked
            ? html`<button class="secondary" disabled=${act.busy} onClick=${() => run(() => api.models.unlock(m.id))}>Unlock</button>`
            : html`<button class="secondary" disabled=${act.busy} onClick=${() => run(() => api.models.lock(m.id))}>Lock</button>`}
        </div>`],
      ]} />
    <form class="row" onSubmit=${(e) => { e.preventDefault(); run(() => api.models.register({ source })).then(() => setSource("")); }}>
      <label class="grow">Register a model (checkpoint folder, .gguf file or hub id)
        <input value=${source} onInput=${(e) => setSource(e.target.value)} placeholder="/models/my-checkpoint" name="model-source" /></label>
      <button type="submit" disabled=${act.busy || !source}>Register</button>
    </form>
  <//>`;
}

/** What steers a variant, in a few words. */
function variantSteering(v) {
  const dial = v.steering_intensity == null ? "" : ` @ ${v.steering_intensity}`;
  if (v.profile) return `profile ${v.profile}${dial}`;
  const s = v.steering || {};
  const features = (s.steering || []).reduce((n, entry) => n + entry.features.length, 0);
  const parts = [features ? plural(features, "feature") : null, s.vectors?.length ? plural(s.vectors.length, "vector") : null];
  return `${parts.filter(Boolean).join(" + ") || "nothing"}${dial}`;
}

/** Steered variants: a base model under a saved profile, listed in /v1/models for every client. */
function Variants() {
  const server = useServer();
  const list = useLoad(() => api.variants.list());
  const profiles = useLoad(() => api.profiles.list());
  const act = useAction();
  const [form, setForm] = useState({ name: "", profile: "", intensity: "", scoring: "unsteered" });
  const set = (key) => (e) => setForm((f) => ({ ...f, [key]: e.target.value }));
  const run = (fn) => act.run(async () => { await fn(); await list.reload(); });
  const create = (e) => {
    e.preventDefault();
    const text = form.intensity.trim();
    const dial = text === "" ? {} : { steering_intensity: /^[-+]?(\d+\.?\d*|\.\d+)$/.test(text) ? Number(text) : text };
    run(() => api.variants.create({ name: form.name, base: server.model, profile: form.profile, scoring: form.scoring, ...dial }))
      .then(() => setForm((f) => ({ ...f, name: "" })));
  };
  const variants = list.value?.data || [];
  const names = (profiles.value?.data || []).map((p) => p.name);
  return html`<${Panel} title="Steered variants" actions=${html`<button class="secondary" onClick=${() => { list.reload(); profiles.reload(); }}>Refresh</button>`}>
    <p class="note">A variant is a model name for a base model under a steering: every OpenAI client lists it at /v1/models and can pick it.</p>
    <${ErrorNote} error=${list.error || profiles.error || act.error} />
    <${Table} label="Steered variants" rows=${variants} rowKey=${(v) => v.id} empty="No steered variant exists."
      columns=${[
        ["Variant", (v) => html`<strong>${v.name}</strong><div class="meta">of ${v.base}${v.description ? ` · ${v.description}` : ""}</div>`],
        ["Steering", (v) => html`${variantSteering(v)}<div class="meta">scoring ${v.scoring}</div>`],
        ["Fits", (v) => v.fits == null ? html`<span class="badge">base not loaded</span>`
          : v.fits ? html`<span class="badge good">fits</span>` : html`<span class="badge bad">does not fit</span><div class="error">${v.problem}</div>`],
        ["", (v) => html`<button class="danger" disabled=${act.busy} onClick=${() => run(() => api.variants.remove(v.name))}
          aria-label=${`Delete variant ${v.name}`}>Delete</button>`],
      ]} />
    <form class="row" onSubmit=${create} aria-label="New steered variant">
      <label>Name <input value=${form.name} onInput=${set("name")} placeholder="pirate" name="variant-name" /></label>
      <label>Profile <select value=${form.profile} onChange=${set("profile")} name="variant-profile" aria-label="Variant profile">
        <option value="">choose…</option>${names.map((name) => html`<option value=${name}>${name}</option>`)}</select></label>
      <label>Intensity <input class="short" value=${form.intensity} onInput=${set("intensity")} placeholder="0–2, off, min, max" name="variant-intensity" /></label>
      <label>Scoring <select value=${form.scoring} onChange=${set("scoring")} name="variant-scoring" aria-label="Variant scoring">
        <option value="unsteered">unsteered</option><option value="steered">steered</option></select></label>
      <button type="submit" disabled=${act.busy || !form.name || !form.profile || !server.model}>Create on ${server.model || "…"}</button>
    </form>
  <//>`;
}

/** An SAE's newest grade card in a line (docs/dictionaries.md), or that it has none. */
function GradeCell({ sae }) {
  const loaded = useLoad(() => api.dictionaries.grades(sae), [sae]);
  const card = loaded.value?.data?.[0];
  if (!card) return html`<span class="meta">${loaded.value ? "not graded" : ""}</span>`;
  const f = card.figures;
  return html`<a href="#/dictionaries" aria-label=${`Grade of ${sae}`}>variance explained ${num(f.fraction_variance_explained, 3)}
    · CE recovered ${num(f.ce_loss_recovered, 3)} · dead ${num(f.dead_fraction, 2)}</a>
    <div class="meta">${card.tokens} tokens of ${card.corpus.name}</div>`;
}

function Saes() {
  const server = useServer();
  const act = useAction();
  const [path, setPath] = useState("");
  const run = (fn) => act.run(async () => { await fn(); await server.refresh(); });
  return html`<${Panel} title="SAEs" actions=${html`<button class="secondary" onClick=${server.refresh}>Refresh</button>`}>
    <${ErrorNote} error=${act.error} />
    <${Table} label="Registered SAEs" rows=${server.saes} rowKey=${(s) => s.id} empty="No SAE is registered."
      columns=${[
        ["SAE", (s) => html`<strong class="mono">${s.id}</strong><div class="meta">${s.path}</div>`],
        ["Kind", (s) => html`${s.architecture} · ${s.d_sae} features · layer ${s.layer}${s.k ? ` · k ${s.k}` : ""}
          <div class="meta">${s.model_name || ""}${s.has_labels ? " · labelled" : " · no labels"}</div>`],
        ["Grade", (s) => html`<${GradeCell} sae=${s.id} />`],
        ["Attached", (s) => s.attached ? html`<span class="badge good">layer ${s.attached_layer}</span>`
          : html`<span class="badge">no</span>${s.attach_error ? html`<div class="error">${s.attach_error}</div>` : null}`],
        ["", (s) => html`<div class="actions">${s.attached
          ? html`<button class="secondary" disabled=${act.busy} onClick=${() => run(() => api.saes.detach(s.id))}>Detach</button>`
          : html`<button disabled=${act.busy} onClick=${() => run(() => api.saes.attach(s.id))}>Attach</button>`}</div>`],
      ]} />
    <form class="row" onSubmit=${(e) => { e.preventDefault(); run(() => api.saes.register({ sae: path })).then(() => setPath("")); }}>
      <label class="grow">Register an SAE (a local folder, a SAELens release:id, or a hub owner/name:folder)
        <input value=${path} onInput=${(e) => setPath(e.target.value)} placeholder="gemma-scope-2b-pt-res-canonical:layer_12/width_16k/canonical" name="sae-path" /></label>
      <button type="submit" disabled=${act.busy || !path}>Register</button>
    </form>
  <//>`;
}

const ENDED = new Set(["succeeded", "failed", "cancelled"]);

/** The jobs list, polled every second while one runs. */
function Jobs({ reloadSignal }) {
  const list = useLoad(() => api.jobs.list(), [reloadSignal]);
  const act = useAction();
  const jobs = list.value?.data || [];
  const running = jobs.some((j) => !ENDED.has(j.state));
  useEffect(() => {
    if (!running) return undefined;
    const timer = setInterval(list.reload, 1000);
    return () => clearInterval(timer);
  }, [running, list.reload]);
  return html`<${Panel} title="Jobs" actions=${html`<button class="secondary" onClick=${list.reload}>Refresh</button>`}>
    <${ErrorNote} error=${list.error || act.error} />
    <${Table} label="Jobs" rows=${jobs} rowKey=${(j) => j.id} empty="No job has run since the server started."
      columns=${[
        ["Job", (j) => html`<strong>${j.kind}</strong> <span class="mono meta">${j.id}</span><div class="meta">${j.description}</div>`],
        ["Progress", (j) => html`<${Progress} done=${j.progress.done} total=${j.progress.total} unit=${j.progress.unit} />
          ${j.eta_s != null && !ENDED.has(j.state) ? html`<div class="meta">about ${Math.ceil(j.eta_s)} s left</div>` : null}`],
        ["State", (j) => html`<span class=${`badge ${j.state === "succeeded" ? "good" : j.state === "failed" ? "bad" : ""}`} data-state=${j.state}>${j.state}</span>
          ${j.error ? html`<div class="error">${j.error.code}: ${j.error.message}</div>` : null}
          ${j.result ? html`<${JobResult} job=${j} />` : null}`],
        ["", (j) => ENDED.has(j.state) ? null
          : html`<button class="danger" disabled=${act.busy} onClick=${() => act.run(async () => { await api.jobs.cancel(j.id); await list.reload(); })}>Cancel</button>`],
      ]} />
  <//>`;
}

function JobResult({ job }) {
  const r = job.result;
  if (job.kind === "autosteer") {
    return html`<div class="meta">${r.best
      ? html`best: <${FeatureLink} sae=${r.sae_id} index=${r.best.index} /> at ${num(r.best.strength)} (affinity lift ${num(r.best.affinity_lift, 3)})`
      : `no setting beat the unsteered answers${r.note ? `: ${r.note}` : ""}`}${r.saved_profile ? html` · saved as profile <strong>${r.saved_profile.name || r.saved_profile}</strong>` : null}</div>`;
  }
  if (job.kind === "explain") {
    const covers = r.features.length > 12 ? `${r.features.slice(0, 12).join(", ")}, …` : r.features.join(", ");
    return html`<div class="meta">features ${covers} · ${r.explained} explained, ${r.flagged} flagged, ${r.skipped.length} skipped${
      r.skipped.length ? html`<ul>${r.skipped.slice(0, 5).map((k) => html`<li>#${k.feature}: ${k.reason}</li>`)}</ul>` : null}</div>`;
  }
  if (job.kind === "calibration") return html`<div class="meta">${plural(r.texts, "text")}, ${plural(r.positions, "position")}, ${plural(r.features_fired, "feature")} fired</div>`;
  return html`<details class="meta"><summary>result</summary><pre>${JSON.stringify(r, null, 1).slice(0, 2000)}</pre></details>`;
}

/** Starts a calibration job on the shipped corpus or on texts typed here (one per line). */
function Calibrate({ onStarted }) {
  const [sae, setSae] = useSae();
  const [texts, setTexts] = useState("");
  const act = useAction();
  const start = (body) => act.run(async () => { await api.saes.calibrate(sae, body); onStarted(); });
  const lines = texts.split("\n").map((t) => t.trim()).filter(Boolean);
  return html`<${Panel} title="Calibrate an SAE">
    <p class="note">Reads a corpus through the SAE and keeps each feature's density, quantiles and top examples (a job).</p>
    <div class="row"><${SaePicker} value=${sae} onChange=${setSae} /></div>
    <label>Texts, one per line (leave empty to use the corpus the SAE ships)
      <textarea value=${texts} onInput=${(e) => setTexts(e.target.value)} name="calibration-texts"></textarea></label>
    <div class="row">
      <button disabled=${!sae || act.busy} onClick=${() => start(lines.length ? { texts: lines } : { corpus: "demo" })}>
        ${lines.length ? `Calibrate on ${plural(lines.length, "text")}` : "Calibrate on the shipped corpus"}</button>
    </div>
    <${ErrorNote} error=${act.error} />
  <//>`;
}

/** Starts AutoSteer for a goal; the job's result names the best feature and strength. */
function AutoSteer({ onStarted }) {
  const [sae, setSae] = useSae();
  const [goal, setGoal] = useState("");
  const [saveAs, setSaveAs] = useState("");
  const act = useAction();
  const start = (e) => {
    e.preventDefault();
    act.run(async () => {
      await api.autosteer({ goal, sae_id: sae, ...(saveAs ? { save_as: saveAs } : {}) });
      onStarted();
    });
  };
  return html`<${Panel} title="AutoSteer">
    <p class="note">Searches for a feature and strength that reach a goal, judged by the unsteered model (a job).</p>
    <form onSubmit=${start}>
      <div class="row"><${SaePicker} value=${sae} onChange=${setSae} /></div>
      <label>Goal <input value=${goal} onInput=${(e) => setGoal(e.target.value)} placeholder="talk like a pirate" name="goal" /></label>
      <label>Save the best setting as a profile named (optional) <input value=${saveAs} onInput=${(e) => setSaveAs(e.target.value)} name="save-as" /></label>
      <button type="submit" disabled=${!sae || !goal || act.busy}>Start AutoSteer</button>
    </form>
    <${ErrorNote} error=${act.error} />
  <//>`;
}

export default function SystemView() {
  const [started, setStarted] = useState(0);
  const onStarted = () => setStarted((n) => n + 1);
  return html`<${Models} /><${Saes} /><div class="wide"><${Variants} /></div><div class="wide"><${Jobs} reloadSignal=${started} /></div>
    <${Calibrate} onStarted=${onStarted} /><${AutoSteer} onStarted=${onStarted} />`;
}
