// Dictionaries (docs/dictionaries.md): train an SAE on the served model (the form, then its
// progress bar, loss / variance-explained / L0 / dead curves and Cancel), every training so far,
// and the grade cards of two SAEs side by side, with a Grade button for an attached one.

import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import * as api from "../api.js";
import { ErrorNote, Panel, Progress, Table, html, num, useAction, useLoad, useServer } from "../ui.js";

const ARCHITECTURES = [["topk", "TopK"], ["batchtopk", "BatchTopK"], ["jumprelu", "JumpReLU"], ["matryoshka_batchtopk", "Matryoshka BatchTopK"]];
const WITH_K = new Set(["topk", "batchtopk", "matryoshka_batchtopk"]);
const TRANSCODER_ARCHITECTURES = new Set(["batchtopk", "jumprelu"]);  // JumpReLUs at inference, what transcoder sets hold
const FIGURES = [
  ["fraction_variance_explained", "Variance explained", 3], ["l0", "L0", 3], ["dead_fraction", "Dead latents", 3],
  ["dense_fraction", "Dense latents", 3], ["ce_loss_recovered", "CE loss recovered", 3], ["ce_loss_clean", "CE clean (nats)", 3],
  ["ce_loss_spliced", "CE spliced", 3], ["ce_loss_zero_ablated", "CE zeroed", 3], ["kl_spliced", "KL spliced (nats)", 4], ["kl_score", "KL score", 3],
];
const COLOURS = ["#2563eb", "#dc2626"];

/** The corpus part of a form: an SAE's shipped corpus, pasted texts (one per blank-line-separated block), or local files. */
function corpusOf(form, saes) {
  if (form.source === "texts") return { texts: splitTexts(form.texts) };
  if (form.source === "files") return { files: form.files.split("\n").map((f) => f.trim()).filter(Boolean) };
  return { shipped_by: form.shipped || saes[0]?.id || "" };
}

/** What an SAE's training does once saved: attach (and grade) it; with the calibration asked,
 * calibrate it on the texts given (else the corpus's pasted texts, 20 examples a feature) and
 * label each feature by its top tokens. */
function thenOf(form) {
  if (!form.attach || !form.calibrate) return { attach: form.attach };
  const given = splitTexts(form.calibration);
  const texts = given.length || form.source !== "texts" ? given : splitTexts(form.texts);
  return { attach: true, calibrate: { texts, top_examples: 20 }, label: true };
}

/** Texts pasted one per blank-line-separated block. */
function splitTexts(text) {
  return text.split(/\n\s*\n/).map((t) => t.trim()).filter(Boolean);
}

/** Where a form's text comes from (the fields corpusOf reads). */
function CorpusFields({ form, set, label }) {
  const { saes } = useServer();
  return html`<div class="row">
    <label>${label} <select value=${form.source} onChange=${set("source")} aria-label=${`${label} source`}>
      <option value="shipped">An SAE's shipped corpus</option><option value="texts">Texts</option><option value="files">Local files</option></select></label>
    ${form.source === "shipped" ? html`<select value=${form.shipped || saes[0]?.id || ""} onChange=${set("shipped")} aria-label=${`${label}: SAE whose corpus`}>
        ${saes.map((s) => html`<option value=${s.id}>${s.id}</option>`)}</select>`
      : form.source === "texts" ? html`<textarea rows="4" value=${form.texts} onInput=${set("texts")} aria-label=${`${label}: texts`} placeholder="Texts, separated by blank lines"></textarea>`
      : html`<textarea rows="2" value=${form.files} onInput=${set("files")} aria-label=${`${label}: files`} placeholder="One path per line (.txt, .md, .jsonl)"></textarea>`}
  </div>`;
}

function TrainForm({ onStarted }) {
  const { saes } = useServer();
  const [form, setForm] = useState({ kind: "sae", layer: 0, architecture: "topk", d_sae: 1024, k: 32, training_tokens: 65536,
    batch_tokens: 1024, epochs: 1, lr: 0.001, skip: false, source: "shipped", shipped: "", texts: "", files: "", attach: true,
    calibrate: false, calibration: "" });
  const act = useAction();
  const set = (key) => (e) => setForm({ ...form, [key]: e.target.type === "checkbox" ? e.target.checked
    : e.target.type === "number" ? Number(e.target.value) : e.target.value });
  // A transcoder set: one per block at its MLP, BatchTopK or JumpReLU, registered for attribution graphs.
  const sets = form.kind === "transcoder_set";
  const architectures = sets ? ARCHITECTURES.filter(([key]) => TRANSCODER_ARCHITECTURES.has(key)) : ARCHITECTURES;
  const setKind = (e) => setForm({ ...form, kind: e.target.value,
    architecture: e.target.value === "transcoder_set" && !TRANSCODER_ARCHITECTURES.has(form.architecture) ? "batchtopk" : form.architecture });
  const start = () => act.run(async () => {
    const body = { kind: form.kind, architecture: form.architecture, d_sae: form.d_sae, training_tokens: form.training_tokens,
      batch_tokens: form.batch_tokens, epochs: form.epochs, lr: form.lr, corpus: corpusOf(form, saes) };
    if (sets) body.skip = form.skip;
    else Object.assign(body, { layer: form.layer, then: thenOf(form) });
    if (WITH_K.has(form.architecture)) body.k = form.k;
    if (form.architecture === "matryoshka_batchtopk") body.matryoshka_widths = [form.d_sae / 4, form.d_sae];
    onStarted(await api.dictionaries.train(body));
  });
  return html`<div class="form" aria-label="Train a dictionary">
    <div class="row">
      <label>Dictionary <select value=${form.kind} onChange=${setKind}>
        <option value="sae">An SAE at a layer</option><option value="transcoder_set">A transcoder per block</option></select></label>
      ${sets ? html`<label class="inline"><input type="checkbox" checked=${form.skip} onChange=${set("skip")} /> Skip connection</label>`
        : html`<label>Layer <input type="number" min="0" value=${form.layer} onInput=${set("layer")} /></label>`}
      <label>Architecture <select value=${form.architecture} onChange=${set("architecture")}>
        ${architectures.map(([key, text]) => html`<option value=${key}>${text}</option>`)}</select></label>
      <label>Latents <input type="number" min="16" value=${form.d_sae} onInput=${set("d_sae")} /></label>
      ${WITH_K.has(form.architecture) ? html`<label>k <input type="number" min="1" value=${form.k} onInput=${set("k")} /></label>` : null}
    </div>
    <div class="row">
      <label>Tokens <input type="number" min="1024" step="1024" value=${form.training_tokens} onInput=${set("training_tokens")} /></label>
      <label>Batch <input type="number" min="64" value=${form.batch_tokens} onInput=${set("batch_tokens")} /></label>
      <label>Epochs <input type="number" min="1" value=${form.epochs} onInput=${set("epochs")} /></label>
      <label>Learning rate <input type="number" min="0" step="0.0001" value=${form.lr} onInput=${set("lr")} /></label>
      ${sets ? null : html`<label class="inline"><input type="checkbox" checked=${form.attach} onChange=${set("attach")} /> Attach and grade it</label>`}
      ${sets || !form.attach ? null : html`<label class="inline"><input type="checkbox" checked=${form.calibrate} onChange=${set("calibrate")} /> Calibrate and label it</label>`}
    </div>
    ${!sets && form.attach && form.calibrate ? html`<textarea rows="2" value=${form.calibration} onInput=${set("calibration")} aria-label="Calibration texts"
      placeholder="Texts to calibrate on, separated by blank lines (empty: the corpus's pasted texts)"></textarea>` : null}
    <${CorpusFields} form=${form} set=${set} label="Corpus" />
    <button disabled=${act.busy} onClick=${start}>Train</button>
    <${ErrorNote} error=${act.error} />
  </div>`;
}

/** Two charts of a training's curve: loss; variance explained, L0 (right axis) and dead latents. */
function Curves({ curve }) {
  const box = useRef(null);
  useEffect(() => {
    const element = box.current;
    if (!element || curve.length < 2) return undefined;
    const x = curve.map((p) => p.step);
    const width = element.clientWidth || 640;
    const loss = new uPlot({ width, height: 200, scales: { x: { time: false } }, axes: [{ label: "step" }, { label: "loss" }],
      series: [{ label: "step" }, { label: "loss", stroke: COLOURS[0], width: 2 }] }, [x, curve.map((p) => p.loss)], element);
    const shape = new uPlot({ width, height: 200, scales: { x: { time: false }, y: { range: [0, 1] }, l0: { auto: true } },
      axes: [{ label: "step" }, { label: "fraction (0–1)" }, { scale: "l0", side: 1, label: "L0", grid: { show: false } }],
      series: [{ label: "step" }, { label: "variance explained", stroke: COLOURS[0], width: 2 },
        { label: "dead latents", stroke: COLOURS[1], width: 2 }, { label: "L0", stroke: "#16a34a", width: 2, scale: "l0" }] },
      [x, curve.map((p) => p.fve), curve.map((p) => p.dead), curve.map((p) => p.l0)], element);
    return () => { loss.destroy(); shape.destroy(); };
  }, [curve]);
  if (curve.length < 2) return html`<p class="meta">The curves appear after the first steps.</p>`;
  return html`<div class="chart" ref=${box} role="img" aria-label="Training curves"></div>`;
}

function Training({ id, onEnd }) {
  const [view, setView] = useState(null);
  const act = useAction();
  useEffect(() => {
    let timer;
    const poll = async () => {
      try {
        const next = await api.dictionaries.get(id);
        setView(next);
        if (next.state === "running") timer = setTimeout(poll, 1000);
        else onEnd?.(next);
      } catch (error) { act.run(() => Promise.reject(error)); }
    };
    poll();
    return () => clearTimeout(timer);
  }, [id]);
  if (!view) return html`<${ErrorNote} error=${act.error} />`;
  const p = view.progress;
  const last = p.curve?.[p.curve.length - 1];
  return html`<div aria-label="Training" class="job-progress">
    <div class="row"><${Progress} done=${p.tokens} total=${p.total_tokens} unit="tokens" />
      <span class=${`badge ${view.state === "succeeded" ? "good" : view.state === "failed" ? "bad" : ""}`} data-state=${view.state}>${view.state}</span>
      <span class="meta">${p.stage}</span>
      ${view.state === "running" ? html`<button class="danger" disabled=${act.busy}
        onClick=${() => act.run(async () => setView(await api.dictionaries.cancel(id)))}>Cancel</button>` : null}</div>
    ${last ? html`<p class="meta">Step ${last.step} of ${p.total_steps}: loss ${num(last.loss, 4)}, variance explained ${num(last.fve, 3)}, L0 ${num(last.l0, 3)}, dead ${num(last.dead, 3)}</p>` : null}
    <${Curves} curve=${p.curve || []} />
    ${view.result ? html`<p class="note" role="status">Saved as <strong>${view.result.sae_id || view.result.transcoder_set_id}</strong> in <code>${view.result.path}</code>${view.result.transcoder_set_id ? " and registered for attribution graphs" : ""}.</p>` : null}
    ${followUps(view.result)}
    ${view.error ? html`<p class="error" role="alert">${view.error.code}: ${view.error.message}</p>` : null}
    <${ErrorNote} error=${act.error} />
  </div>`;
}

/** How the follow-up jobs a training chained ended: "Then: grade succeeded, calibration ...". */
function followUps(result) {
  const done = FOLLOW_UPS.filter(([key]) => result?.[key]).map(([key, name]) => `${name} ${result[key].state}`);
  if (result?.attach_error) done.unshift(`attach failed (${result.attach_error.code})`);
  return done.length ? html`<p class="meta" aria-label="Follow-ups">Then: ${done.join(", ")}.</p>` : null;
}
const FOLLOW_UPS = [["grade", "grade"], ["calibration", "calibration"], ["labels", "labels"], ["explain", "explanations"]];

function Trainings({ version, onPick }) {
  const list = useLoad(() => api.dictionaries.list(), [version]);
  return html`<${Table} label="Trainings" rows=${list.value?.data || []} rowKey=${(t) => t.id} empty="No training yet."
    columns=${[["Training", (t) => html`<button class="secondary" onClick=${() => onPick(t.id)}>${t.request.name}</button><div class="meta">${t.id}</div>`],
      ["Architecture", (t) => `${t.request.architecture} · ${t.request.d_sae ?? "8×"} latents · ${t.request.kind === "transcoder_set" ? "a transcoder per block" : `layer ${t.request.layer}`}`],
      ["State", (t) => html`<span class="badge" data-state=${t.state}>${t.state}</span>`],
      ["Tokens", (t) => `${t.progress.tokens ?? 0} / ${t.progress.total_tokens ?? "?"}`],
      ["Saved as", (t) => t.result?.sae_id || t.result?.transcoder_set_id || ""]]} />
    <${ErrorNote} error=${list.error} />`;
}

/** A grade card's figure: a transcoder set's card has each reconstruction figure as its blocks' mean. */
function figure(card, key) {
  return card.transcoder_set_id && !(key in card.figures) ? card.figures[`mean_${key}`] : card.figures[key];
}

/** The newest grade card of each chosen dictionary (an SAE, or a registered transcoder set), side by side, and
 * a Grade button for an attached SAE or a set. */
function Grades({ version }) {
  const { saes, attached } = useServer();
  const sets = useLoad(() => api.transcoders.list(), [version]).value?.data || [];
  const choices = [...saes.map((s) => ({ id: s.id, text: `${s.id} · layer ${s.layer}`, set: false })),
    ...sets.map((s) => ({ id: s.id, text: `${s.id} · transcoder set (${s.layers.length} blocks)`, set: true }))];
  const isSet = (id) => choices.some((c) => c.id === id && c.set);
  const [chosen, setChosen] = useState([]);
  const picks = [0, 1].map((i) => chosen[i] ?? saes[i]?.id ?? "");
  const [cards, setCards] = useState({});
  const [job, setJob] = useState(null);
  const [form, setForm] = useState({ source: "texts", shipped: "", texts: "", files: "" });
  const set = (key) => (e) => setForm({ ...form, [key]: e.target.value });
  const act = useAction();
  useEffect(() => {
    picks.filter(Boolean).forEach((id) => (isSet(id) ? api.dictionaries.setGrades(id) : api.dictionaries.grades(id))
      .then((r) => setCards((c) => ({ ...c, [id]: r.data[0] || null })), () => {}));
  }, [picks.join(), version, job?.state, sets.length]);
  const grade = (id) => act.run(async () => {
    const body = { corpus: corpusOf(form, saes), max_tokens: 4096 };
    const started = await (isSet(id) ? api.dictionaries.gradeSet(id, body) : api.dictionaries.grade(id, body));
    setJob(started);
    let current = started;
    while (current.state === "running") {
      await new Promise((r) => setTimeout(r, 1000));
      current = await api.jobs.get(started.id);
      setJob(current);
    }
  });
  const shown = picks.filter(Boolean);
  const rows = FIGURES.map(([key, text, digits]) => ({ key, text, digits }));
  const gradable = shown.filter((id) => isSet(id) || attached.some((a) => a.id === id));
  return html`<div class="row">${[0, 1].map((i) => html`<label>Dictionary ${i + 1} <select value=${picks[i]} aria-label=${`Graded dictionary ${i + 1}`}
      onChange=${(e) => { const next = [...picks]; next[i] = e.target.value; setChosen(next); }}>
      ${choices.map((c) => html`<option value=${c.id}>${c.text}</option>`)}</select></label>`)}</div>
    <${Table} label="Grade cards" rows=${rows} rowKey=${(r) => r.key}
      columns=${[["Figure", (r) => r.text], ...shown.map((id) => [id, (r) => (cards[id] ? num(figure(cards[id], r.key), r.digits) : "—")])]} />
    <p class="meta">${shown.map((id) => (cards[id] ? `${id}: ${cards[id].tokens} tokens of ${cards[id].corpus.name} (${cards[id].corpus.part})` : `${id}: not graded yet`)).join(" · ")}${shown.some(isSet) ? " · a transcoder set's reconstruction figures are its blocks' means, its CE and KL the replacement model's (every MLP replaced)" : ""}</p>
    <${CorpusFields} form=${form} set=${set} label="Grade on" />
    <div class="row">${gradable.map((id) => html`<button class="secondary" disabled=${act.busy}
      onClick=${() => grade(id)}>Grade ${id}</button>`)}
      ${job ? html`<${Progress} done=${job.progress.done} total=${job.progress.total} unit=${job.progress.unit} /> <span class="badge" data-state=${job.state}>${job.state}</span>` : null}</div>
    <${ErrorNote} error=${act.error} />`;
}

export default function DictionariesView() {
  const [current, setCurrent] = useState(null);
  const [version, setVersion] = useState(0);
  const { refresh } = useServer();
  const ended = () => { setVersion((v) => v + 1); refresh(); };
  return html`
    <${Panel} title="Train a dictionary">
      <p class="meta">An SAE at a layer, or a transcoder per block, trained by SAELens on the served model's activations; saved in SAELens's format with its provenance and registered (docs/dictionaries.md).</p>
      <${TrainForm} onStarted=${(view) => { setCurrent(view.id); setVersion((v) => v + 1); }} />
      ${current ? html`<${Training} id=${current} onEnd=${ended} />` : null}
    </${Panel}>
    <${Panel} title="Trainings"><${Trainings} version=${version} onPick=${setCurrent} /></${Panel}>
    <${Panel} title="Grades: two dictionaries side by side"><${Grades} version=${version} /></${Panel}>`;
}
