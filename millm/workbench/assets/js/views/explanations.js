// Explanations a model wrote for features (docs/labels.md): a card's list with its scores and
// "explain it", and the Features view's batch panel.
import { useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, JobProgress, Panel, Table, html, num, useAction, useLoad } from "../ui.js";

const score = (s) => (s ? html`<span class="num">${num(s.balanced_accuracy, 2)}</span> <span class="meta">(${s.texts} texts)</span>` : "—");

/** Why a finished explaining job stored nothing for some features. */
const Skipped = ({ job }) => (job?.result?.skipped?.length
  ? html`<ul class="meta">${job.result.skipped.map((s) => html`<li>#${s.feature}: ${s.reason}</li>`)}</ul>` : null);

/** A feature's explanations with their detection and fuzzing scores, and a button to explain it with the served model. */
export function Explanations({ sae, index, explanations, onEnd }) {
  const act = useAction();
  const [job, setJob] = useState(null);
  const [ended, setEnded] = useState(null);
  const start = () => act.run(async () => { setEnded(null); setJob(await api.saes.explain(sae, { features: [index] })); });
  return html`<div class="explanations">
    ${explanations.length ? html`<${Table} label="Explanations" rows=${explanations} rowKey=${(e) => e.explainer}
      columns=${[
        ["Explanation", (e) => html`${e.explanation}${e.flagged ? html` <span class="badge bad" title="scored under the server's threshold">flagged</span>` : null}`],
        ["Detection", (e) => score(e.detection)],
        ["Fuzzing", (e) => score(e.fuzzing)],
        ["Explainer", (e) => html`<span class="meta">${e.explainer}</span>`],
      ]} />` : html`<p class="empty">No model has explained this feature yet.</p>`}
    <div class="row"><button onClick=${start} disabled=${act.busy || job?.state === "running"}>Explain it with the served model</button></div>
    <${ErrorNote} error=${act.error} />
    ${job ? html`<${JobProgress} key=${job.id} job=${job} label="Explaining job" onEnd=${(done) => { setEnded(done); onEnd(); }} />` : null}
    <${Skipped} job=${ended} />
  </div>`;
}

/** Explain a batch of features (the first N without a label or explanation, or the N densest) as one job. */
export function ExplainBatch({ sae }) {
  const act = useAction();
  const [count, setCount] = useState("8");
  const [which, setWhich] = useState("unlabelled");
  const [explainer, setExplainer] = useState("served");
  const models = useLoad(() => api.models.list(), []);
  const others = (models.value?.data ?? []).filter((m) => m.state !== "loaded");
  const [job, setJob] = useState(null);
  const [ended, setEnded] = useState(null);
  // "model:NAME": a registered model the job loads beside the served one.
  const who = explainer.startsWith("model:") ? { explainer: "model", explainer_model: explainer.slice(6) } : { explainer };
  const start = (e) => {
    e.preventDefault();
    act.run(async () => { setEnded(null); setJob(await api.saes.explain(sae, { [which]: Number(count), ...who })); });
  };
  return html`<${Panel} title="Explain features">
    <p class="note">A model writes each feature's explanation from its top activating windows (EleutherAI delphi's prompts) and another pass scores it by detection and fuzzing; explanations are stored beside the labels and found by the search.</p>
    <form class="row" onSubmit=${start} aria-label="Explain features">
      <label class="inline">Explain the <input type="number" min="1" max="256" value=${count} onInput=${(e) => setCount(e.target.value)} name="explain-count" /></label>
      <select name="explain-which" value=${which} onChange=${(e) => setWhich(e.target.value)}>
        <option value="unlabelled">first unlabelled</option><option value="densest">densest</option></select>
      <label class="inline">with <select name="explainer" value=${explainer} onChange=${(e) => setExplainer(e.target.value)}>
        <option value="served">the served model</option><option value="endpoint">the configured endpoint</option>
        ${others.map((m) => html`<option value=${`model:${m.id}`}>${m.id} (loaded beside for the job)</option>`)}</select></label>
      <button type="submit" disabled=${!sae || act.busy || job?.state === "running"}>Start</button>
    </form>
    <${ErrorNote} error=${act.error} />
    ${job ? html`<div><strong>${job.description}</strong> <span class="mono meta">${job.id}</span>
      <${JobProgress} key=${job.id} job=${job} label="Explaining job" onEnd=${setEnded} /></div>` : null}
    ${ended?.state === "succeeded" ? html`<p role="status">${ended.result.explained} explained, ${ended.result.flagged} flagged.</p>` : null}
    <${Skipped} job=${ended} />
  <//>`;
}
