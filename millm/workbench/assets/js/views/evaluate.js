// Evaluate: a steering evaluation (/api/evaluations, a job) for a concept: a feature at a sweep of
// strengths, profiles and variants, and the prompting baseline; the stored results, each as a
// chart of the sweep (harmonic mean, concept, instruction or fluency against strength) with the
// unsteered and prompting lines, a table of its points, and the answers behind each point.

import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import * as api from "../api.js";
import { ErrorNote, Panel, Progress, SaePicker, Table, html, num, plural, useAction, useLoad, useSae } from "../ui.js";

const COLOURS = ["#1f5fbf", "#d1495b", "#2e8540", "#e09f3e", "#7b2cbf", "#00798c", "#6c757d", "#9c6644"];
const METRICS = [
  ["harmonic_mean", "harmonic mean"],
  ["concept", "concept"],
  ["instruction_score", "instruction"],
  ["fluency", "fluency"],
];
const ENDED = new Set(["succeeded", "failed", "cancelled"]);

const numbers = (text) => text.split(/[\s,;]+/).filter(Boolean).map(Number);

/** The request the form describes; a plain Error for what the page can tell is wrong. */
function requestOf(form, sae) {
  const candidates = [];
  if (form.index !== "") {
    const strengths = numbers(form.strengths);
    if (!strengths.length || strengths.some(Number.isNaN)) throw new Error("strengths: list numbers, e.g. 10, 20, 40");
    candidates.push({ kind: "feature", sae_id: sae, index: Number(form.index), strengths });
  }
  if (form.profile) candidates.push({ kind: "profile", profile: form.profile });
  if (form.variant) candidates.push({ kind: "variant", variant: form.variant });
  if (form.prompt) candidates.push({ kind: "prompt" });
  if (!candidates.length) throw new Error("choose at least one candidate: a feature, a profile, a variant or the prompting baseline");
  const instructions = form.instructions.split("\n").map((t) => t.trim()).filter(Boolean);
  return {
    concept: form.concept,
    candidates,
    max_tokens: Number(form.maxTokens),
    judge: form.judge,
    ...(instructions.length ? { instructions } : {}),
    ...(form.name ? { name: form.name } : {}),
  };
}

function NewEvaluation({ onStarted }) {
  const [sae, setSae] = useSae();
  const profiles = useLoad(() => api.profiles.list());
  const variants = useLoad(() => api.variants.list());
  const act = useAction();
  const [form, setForm] = useState({ concept: "", name: "", index: "", strengths: "10, 20, 40, 60, 80", profile: "", variant: "",
    prompt: true, instructions: "", maxTokens: "48", judge: "likelihood" });
  const set = (key) => (e) => setForm((f) => ({ ...f, [key]: e.target.type === "checkbox" ? e.target.checked : e.target.value }));
  const start = (e) => {
    e.preventDefault();
    act.run(async () => onStarted(await api.evaluations.start(requestOf(form, sae))));
  };
  return html`<${Panel} title="New evaluation">
    <p class="note">Each candidate answers each instruction; the answers are rated for the concept, the instruction and
      fluency (0–2, AxBench's scales) and their perplexity measured under the unsteered model (a job).</p>
    <form onSubmit=${start} aria-label="New evaluation">
      <div class="row">
        <label class="grow">Concept <input value=${form.concept} onInput=${set("concept")} placeholder="pirates" name="concept" /></label>
        <label>Name (optional) <input value=${form.name} onInput=${set("name")} name="evaluation-name" /></label>
      </div>
      <fieldset><legend>Candidates</legend>
        <div class="row"><${SaePicker} value=${sae} onChange=${setSae} />
          <label>Feature <input class="short" type="number" min="0" value=${form.index} onInput=${set("index")} name="feature" /></label>
          <label class="grow">Strengths <input value=${form.strengths} onInput=${set("strengths")} name="strengths" /></label></div>
        <div class="row">
          <label>Profile <select value=${form.profile} onChange=${set("profile")} name="profile" aria-label="Profile">
            <option value="">none</option>${(profiles.value?.data || []).map((p) => html`<option value=${p.name}>${p.name}</option>`)}</select></label>
          <label>Variant <select value=${form.variant} onChange=${set("variant")} name="variant" aria-label="Variant">
            <option value="">none</option>${(variants.value?.data || []).map((v) => html`<option value=${v.name}>${v.name}</option>`)}</select></label>
          <label class="inline"><input type="checkbox" checked=${form.prompt} onChange=${set("prompt")} name="prompt" /> Prompting baseline</label>
        </div>
      </fieldset>
      <label>Instructions, one per line (leave empty for six everyday ones)
        <textarea value=${form.instructions} onInput=${set("instructions")} name="instructions"></textarea></label>
      <div class="row">
        <label>Max tokens <input class="short" type="number" min="1" max="256" value=${form.maxTokens} onInput=${set("maxTokens")} name="max_tokens" /></label>
        <label>Judge <select value=${form.judge} onChange=${set("judge")} name="judge" aria-label="Judge">
          <option value="likelihood">the model's likelihoods</option><option value="rating">the model's ratings</option>
          <option value="remote">the remote judge</option></select></label>
        <button type="submit" disabled=${act.busy || !form.concept.trim()}>Start the evaluation</button>
      </div>
    </form>
    <${ErrorNote} error=${profiles.error || variants.error || act.error} />
  <//>`;
}

/** A started evaluation's job, polled every second until it ends. */
function Running({ job, onEnded }) {
  const [view, setView] = useState(job);
  const act = useAction();
  useEffect(() => {
    if (ENDED.has(view.state)) {
      onEnded(view);
      return undefined;
    }
    const timer = setTimeout(async () => setView(await api.jobs.get(view.id)), 1000);
    return () => clearTimeout(timer);
  }, [view]);
  return html`<div class="row" role="status" aria-label="Evaluation job">
    <${Progress} done=${view.progress.done} total=${view.progress.total} unit=${view.progress.unit} />
    <span class="badge" data-state=${view.state}>${view.state}</span>
    ${ENDED.has(view.state) ? null : html`<button class="danger" disabled=${act.busy} onClick=${() => act.run(async () => setView(await api.jobs.cancel(view.id)))}>Cancel</button>`}
    ${view.error ? html`<span class="error">${view.error.code}: ${view.error.message}</span>` : null}
  </div>`;
}

/** The sweep as lines: one per swept candidate, the unsteered and prompting answers as flat lines. */
function SweepChart({ result, metric }) {
  const box = useRef(null);
  useEffect(() => {
    const element = box.current;
    if (!element) return undefined;
    const swept = result.candidates.filter((c) => c.points.some((p) => p.strength !== null));
    const flat = [["unsteered", result.baseline], ...result.candidates.filter((c) => c.points.every((p) => p.strength === null)).map((c) => [c.label, c.points[0]])]
      .filter(([, p]) => p);
    const xs = [...new Set(swept.flatMap((c) => c.points.map((p) => p.strength)))].sort((a, b) => a - b);
    const axis = xs.length ? xs : [0, 1];
    const data = [axis,
      ...swept.map((c) => axis.map((x) => c.points.find((p) => p.strength === x)?.[metric] ?? null)),
      ...flat.map(([, p]) => axis.map(() => p[metric]))];
    const series = [{ label: "strength" },
      ...swept.map((c, i) => ({ label: c.label, stroke: COLOURS[i % COLOURS.length], width: 2, points: { show: true, size: 6 }, spanGaps: true })),
      ...flat.map(([label], i) => ({ label, stroke: COLOURS[(swept.length + i) % COLOURS.length], width: 2, dash: [6, 4], points: { show: false } }))];
    const plot = new uPlot({ width: element.clientWidth || 640, height: 300, scales: { x: { time: false }, y: { range: [0, 2] } },
      axes: [{ label: "strength (or intensity)" }, { label: METRICS.find(([key]) => key === metric)[1] + " (0–2)" }], series }, data, element);
    const resize = new ResizeObserver(() => plot.setSize({ width: element.clientWidth, height: 300 }));
    resize.observe(element);
    return () => { resize.disconnect(); plot.destroy(); };
  }, [result, metric]);
  return html`<div class="chart" ref=${box} role="img" aria-label=${`Sweep chart of ${metric}`}></div>`;
}

function Result({ id }) {
  const loaded = useLoad(() => api.evaluations.get(id), [id]);
  const [metric, setMetric] = useState("harmonic_mean");
  const [shown, setShown] = useState(null);
  const result = loaded.value;
  if (!result) return html`<${ErrorNote} error=${loaded.error} />`;
  const rows = [["unsteered", result.baseline], ...result.candidates.flatMap((c) => c.points.map((p) => [c.label, p]))].filter(([, p]) => p);
  return html`<${Panel} title=${`Evaluation: ${result.name || result.concept}`} actions=${html`
      <a class="button secondary" href=${`/api/evaluations/${encodeURIComponent(id)}/export`} download>JSON</a>
      <a class="button secondary" href=${`/api/evaluations/${encodeURIComponent(id)}/export?format=csv`} download>CSV</a>`}>
    <p class="meta">${`Concept “${result.concept}” on ${result.model} · judge: ${result.judge.kind} · ${plural(result.instructions.length, "instruction")} · `
      + (result.complete ? "complete" : "cancelled: the points measured before")}</p>
    <label>Chart <select value=${metric} onChange=${(e) => setMetric(e.target.value)} aria-label="Metric">
      ${METRICS.map(([key, text]) => html`<option value=${key}>${text}</option>`)}</select></label>
    <${SweepChart} result=${result} metric=${metric} />
    <h3>Ranking: each candidate's best point</h3>
    <${Table} label="Ranking" rows=${result.ranking} rowKey=${(r) => r.label}
      columns=${[["Candidate", (r) => html`<strong>${r.label}</strong>`], ["Best at", (r) => num(r.strength)], ["Harmonic mean", (r) => num(r.harmonic_mean, 3)],
        ["Concept", (r) => num(r.concept, 3)], ["Instruction", (r) => num(r.instruction_score, 3)], ["Fluency", (r) => num(r.fluency, 3)]]} />
    <h3>Every point</h3>
    <${Table} label="Points" rows=${rows} rowKey=${([label, p]) => `${label}@${p.strength}`}
      columns=${[["Candidate", ([label]) => label], ["Strength", ([, p]) => num(p.strength)], ["Concept", ([, p]) => num(p.concept, 3)],
        ["Instruction", ([, p]) => num(p.instruction_score, 3)], ["Fluency", ([, p]) => num(p.fluency, 3)], ["Harmonic mean", ([, p]) => num(p.harmonic_mean, 3)],
        ["Perplexity", ([, p]) => num(p.perplexity, 3)],
        ["", ([label, p]) => html`<button class="secondary" onClick=${() => setShown([label, p])} aria-label=${`Answers of ${label} at ${num(p.strength)}`}>Answers</button>`]]} />
    ${shown ? html`<section aria-label="Answers" class="answers"><h3>${shown[0]} at ${num(shown[1].strength)}</h3>
      ${shown[1].samples.map((s) => html`<dl class="sample">
        <dt>Instruction</dt><dd>${result.instructions[s.instruction]}</dd>
        <dt>Answer</dt><dd class="reply">${s.text}</dd>
        <dd class="meta">concept ${num(s.concept, 3)} · instruction ${num(s.instruction_score, 3)} · fluency ${num(s.fluency, 3)} · perplexity ${num(s.perplexity, 3)}</dd></dl>`)}
    </section>` : null}
  <//>`;
}

export default function EvaluateView({ args }) {
  const list = useLoad(() => api.evaluations.list());
  const act = useAction();
  const [job, setJob] = useState(null);
  const chosen = args[0] || null;
  const ended = async (view) => {
    await list.reload();
    if (view.state === "succeeded") location.hash = `#/evaluate/${encodeURIComponent(view.result.id)}`;
  };
  const evaluations = list.value?.data || [];
  return html`<${NewEvaluation} onStarted=${setJob} />
    <${Panel} title="Evaluations" actions=${html`<button class="secondary" onClick=${list.reload}>Refresh</button>`}>
      ${job ? html`<${Running} key=${job.id} job=${job} onEnded=${ended} />` : null}
      <${ErrorNote} error=${list.error || act.error} />
      <${Table} label="Stored evaluations" rows=${evaluations} rowKey=${(e) => e.id} empty="No evaluation is stored."
        columns=${[["Evaluation", (e) => html`<a href=${`#/evaluate/${encodeURIComponent(e.id)}`}>${e.name || e.concept}</a><div class="meta">${e.model}${e.complete ? "" : " · cancelled"}</div>`],
          ["Best", (e) => e.ranking[0] ? `${e.ranking[0].label}${e.ranking[0].strength == null ? "" : ` at ${num(e.ranking[0].strength)}`} (${num(e.ranking[0].harmonic_mean, 3)})` : "—"],
          ["", (e) => html`<button class="danger" disabled=${act.busy} aria-label=${`Delete evaluation ${e.name || e.concept}`}
            onClick=${() => act.run(async () => { await api.evaluations.remove(e.id); await list.reload(); })}>Delete</button>`]]} />
    <//>
    ${chosen ? html`<div class="wide"><${Result} key=${chosen} id=${chosen} /></div>` : null}`;
}
