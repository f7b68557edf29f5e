// Explanations a model wrote for features (docs/labels.md): a card's list with its scores, "explain
// it" and the running jobs explaining it, and the Features view's batch panel. A job that wrote
// nothing ends failed (nothing_explained); its result still says why, feature by feature.
import { useEffect, useRef, useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, JobProgress, Panel, Table, html, num, plural, useAction, useLoad } from "../ui.js";

const score = (s) => (s ? html`<span class="num">${num(s.balanced_accuracy, 2)}</span> <span class="meta">(${plural(s.texts, "text")})</span>` : "—");

const POLL_MS = 2000;

/** Why a finished explaining job stored nothing for some features. */
const Skipped = ({ job }) => (job?.result?.skipped?.length
  ? html`<ul class="meta">${job.result.skipped.map((s) => html`<li>#${s.feature}: ${s.reason}</li>`)}</ul>` : null);

/** Running explaining jobs that cover a feature (a running job's result names its features), but
 *  `own`; `onEnd()` once one of them ends, so the card shows what it wrote. */
function useExplainingJobs(sae, index, own, onEnd) {
  const [jobs, setJobs] = useState([]);
  const [error, setError] = useState(null);
  const seen = useRef([]);
  const ended = useRef(onEnd);
  ended.current = onEnd; // the poll outlives a render: it calls the latest
  useEffect(() => {
    let stopped = false;
    const look = async () => {
      try {
        const all = (await api.jobs.list()).data || [];
        if (stopped) return;
        const covering = all.filter((j) => j.kind === "explain" && j.state === "running" && j.id !== own
          && j.result?.sae_id === sae && j.result.features?.includes(index));
        if (seen.current.some((id) => !covering.some((j) => j.id === id))) ended.current();
        seen.current = covering.map((j) => j.id);
        setJobs(covering);
        setError(null);
      } catch (err) {
        if (!stopped) setError(err);
      }
    };
    look();
    const timer = setInterval(look, POLL_MS);
    return () => { stopped = true; clearInterval(timer); };
  }, [sae, index, own]);
  return { jobs, error };
}

/** A feature's explanations with their detection and fuzzing scores, and a button to explain it with the served model. */
export function Explanations({ sae, index, explanations, onEnd }) {
  const act = useAction();
  const [job, setJob] = useState(null);
  const [ended, setEnded] = useState(null);
  const start = () => act.run(async () => { setEnded(null); setJob(await api.saes.explain(sae, { features: [index] })); });
  const others = useExplainingJobs(sae, index, job?.id, onEnd);
  return html`<div class="explanations">
    ${explanations.length ? html`<${Table} label="Explanations" rows=${explanations} rowKey=${(e) => e.explainer}
      columns=${[
        ["Explanation", (e) => html`${e.explanation}${e.flagged ? html` <span class="badge bad" title="scored under the server's threshold">flagged</span>` : null}`],
        ["Detection", (e) => score(e.detection)],
        ["Fuzzing", (e) => score(e.fuzzing)],
        ["Explainer", (e) => html`<span class="meta">${e.explainer}</span>`],
      ]} />` : html`<p class="empty">No model has explained this feature yet.</p>`}
    ${others.jobs.map((j) => html`<p class="note" role="status" key=${j.id}>Being explained by job <span class="mono">${j.id}</span> (${
      j.description}: ${j.progress.done}/${plural(j.progress.total, "feature")} done); its explanation shows here once written.</p>`)}
    <div class="row"><button onClick=${start} disabled=${act.busy || job?.state === "running" || others.jobs.length > 0}>Explain it with the served model</button></div>
    <${ErrorNote} error=${act.error || others.error} />
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
    ${ended?.state === "succeeded" ? html`<p role="status">${ended.result.explained} explained, ${ended.result.flagged} flagged${
      ended.result.skipped.length ? `, ${ended.result.skipped.length} skipped (below)` : ""}.</p>` : null}
    <${Skipped} job=${ended} />
  <//>`;
}
