// Probes: the saved detectors (what each reads, its threshold, what firing does, whether it watches
// every request), a form that makes a feature threshold probe in a few clicks, and training a
// linear probe from example texts (a job, followed until it ends). A probe itself only reports;
// what firing does (steer from there on, end the answer) is a condition of a profile
// (docs/probes.md, Conditions), so the form writes that profile too and the list shows it.
// `#/probes/<sae>/<index>` opens the form on that feature (a feature card links here).

import { useEffect, useState } from "preact/hooks";
import * as api from "../api.js";
import {
  ConfirmButton, ErrorNote, FeatureLink, FileImport, Note, Panel, Progress, SaePicker, Table,
  download, fileName, html, num, plural, useAction, useLabels, useLoad, usePanelActions, useSae, useServer,
} from "../ui.js";

const ENDED = new Set(["succeeded", "failed", "cancelled"]);
const lines = (text) => text.split("\n").map((t) => t.trim()).filter(Boolean);
const numberOrNull = (text) => (text === "" ? null : Number(text));

/** What a probe's detector reads and where it fires. */
function Detector({ d }) {
  const labels = useLabels(d.sae_id);
  if (d.type === "feature") {
    return html`<div><span class="badge">feature</span> <${FeatureLink} sae=${d.sae_id} index=${d.index} /> of <span class="mono meta-inline">${d.sae_id}</span>
        ${labels[d.index] ? html` <span class="meta-inline">(${labels[d.index]})</span>` : null}</div>
      <div class="meta">fires at ${d.percentile != null ? `its ${d.percentile}th calibrated percentile` : `activation ≥ ${num(d.threshold)}`}</div>`;
  }
  if (d.type === "weighted") {
    return html`<div><span class="badge">weighted</span> sum of ${plural(d.features.length, "feature")} of <span class="mono meta-inline">${d.sae_id}</span></div>
      <div>${d.features.map((f) => html`<span class="chip"><${FeatureLink} sae=${d.sae_id} index=${f.index} /> ×${num(f.weight)}</span> `)}</div>
      <div class="meta">fires at score ≥ ${num(d.threshold)}</div>`;
  }
  const t = d.training;
  return html`<div><span class="badge">linear</span> at layer ${d.layer} (${d.hook_point || "resid_post"}), ${plural(d.weights.length, "weight")}</div>
    <div class="meta">fires at probability ≥ ${num(d.threshold)}</div>
    ${t ? html`<dl class="meta metrics" aria-label="Training metrics">
      <dt>held-out accuracy</dt><dd>${num(t.accuracy, 3)}</dd>
      <dt>AUC</dt><dd>${num(t.auc, 3)}</dd>
      <dt>per position</dt><dd>${num(t.position_accuracy, 3)} (AUC ${num(t.position_auc, 3)})</dd>
      <dt>texts</dt><dd>${t.positives} + ${t.negatives}, ${t.held_out} held out</dd>
      <dt>model</dt><dd>${t.model}</dd></dl>` : null}`;
}

/** The profiles whose conditions name each probe: what its firing does there. */
function actionsByProbe(profiles) {
  const found = {};
  const add = (probe, item) => (found[probe] ||= []).push(item);
  for (const p of profiles) {
    for (const e of p.document.steering || []) {
      if (e.when) add(e.when.probe, { kind: "steer", profile: p, what: e.features.map((f) => `#${f.index}`).join(", "), tokens: e.when.tokens });
    }
    for (const v of p.document.vectors || []) if (v.when) add(v.when.probe, { kind: "steer", profile: p, what: v.vector_id, tokens: v.when.tokens });
    for (const a of p.document.abort || []) add(a.probe, { kind: "abort", profile: p });
  }
  return found;
}

function Action({ items }) {
  return html`<div><span class="badge">report</span></div>
    ${(items || []).map((a) => html`<div class="meta">
      ${a.kind === "steer" ? html`<span class="badge">steer</span> ${a.what}${a.tokens ? ` for ${plural(a.tokens, "token")}` : ""}` : html`<span class="badge bad">abort</span>`}${" "}
      via profile <strong>${a.profile.name}</strong>${a.profile.active ? " (the active base)" : ""}</div>`)}`;
}

function ProbeList({ version, changed }) {
  const list = useLoad(() => api.probes.list(), [version]);
  const profiles = useLoad(() => api.profiles.list(), [version]);
  const { act, run, notice } = usePanelActions(version, changed);
  const [conflict, setConflict] = useState("fail");
  const probes = list.value?.data || [];
  const actions = actionsByProbe(profiles.value?.data || []);
  const importFile = (text, file) => run(async () => {
    const answer = await api.probes.importText(text, { on_conflict: conflict });
    return `Imported ${answer.data.map((p) => p.name).join(", ")} from ${file} (inactive).`;
  });
  return html`<${Panel} title="Probes" actions=${html`
      <${FileImport} label="Import a probe file" onText=${importFile} />
      <button class="secondary" disabled=${act.busy || !probes.length}
        onClick=${() => run(async () => { download(await api.probes.exportAllText(), "probes.bundle.json"); })}>Export all</button>
      <button class="secondary" onClick=${() => { list.reload(); profiles.reload(); }}>Refresh</button>`}>
    <div class="row"><label class="inline">On a name clash
      <select value=${conflict} onChange=${(e) => setConflict(e.target.value)}>
        <option value="fail">refuse the import</option><option value="rename">rename the import (name-2)</option>
      </select></label></div>
    <${ErrorNote} error=${list.error || profiles.error || act.error} />
    ${notice ? html`<${Note}>${notice}<//>` : null}
    <${Table} label="Probes" rows=${probes} rowKey=${(p) => p.id} empty="No probe yet: create one below, train one, or import a file."
      columns=${[
        ["Probe", (p) => html`<strong>${p.name}</strong><div class="meta">${p.document.description || ""}</div>`],
        ["Detector", (p) => html`<${Detector} d=${p.document.detector} />`],
        ["When it fires", (p) => html`<${Action} items=${actions[p.name]} />`],
        ["Watches", (p) => p.active ? html`<span class="badge good" data-active="true">every request</span>`
          : html`<span class="badge" data-active="false">when named</span>`],
        ["", (p) => html`<div class="actions">
          ${p.active
            ? html`<button class="secondary" disabled=${act.busy} onClick=${() => run(async () => { await api.probes.deactivate(p.id); return `${p.name} watches only the requests that name it.`; })}>Deactivate</button>`
            : html`<button disabled=${act.busy} onClick=${() => run(async () => { const r = await api.probes.activate(p.id); return `${p.name}: ${r.reason}.`; })}>Activate</button>`}
          <button class="secondary" disabled=${act.busy} onClick=${() => run(async () => { download(await api.probes.exportText(p.id), fileName(p.name, "probe")); })}>Export</button>
          <${ConfirmButton} label="Delete" confirm=${`Delete ${p.name}?`} disabled=${act.busy}
            onConfirm=${() => run(async () => { await api.probes.remove(p.id); return `Deleted ${p.name}.`; })} />
        </div>`],
      ]} />
  <//>`;
}

/** Says which step failed when a later one of several calls is refused (the earlier ones stand). */
function after(step, error) {
  if (error && typeof error === "object") error.message = `${step}, but: ${error.message}`;
  return error;
}

/** A feature threshold probe in a few clicks, and optionally what its firing does (a profile's condition). */
function NewProbe({ args, changed }) {
  const [sae, setSae] = useSae();
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [index, setIndex] = useState(args[1] ?? "");
  const [by, setBy] = useState("threshold");
  const [level, setLevel] = useState("");
  const [action, setAction] = useState("report");
  const [steerIndex, setSteerIndex] = useState("");
  const [strength, setStrength] = useState("");
  const [tokens, setTokens] = useState("");
  const [profileName, setProfileName] = useState("");
  const [useProfile, setUseProfile] = useState(false);
  const [watch, setWatch] = useState(false);
  const [notice, setNotice] = useState("");
  const act = useAction();
  const { attached } = useServer();
  const labels = useLabels(sae);
  useEffect(() => { if (args[0]) setSae(args[0]); }, [args[0]]);
  const profile = profileName.trim() || (name.trim() ? `${name.trim()}-${action}` : "");
  const layer = attached.find((s) => s.id === sae)?.attached_layer;

  const create = (event) => {
    event.preventDefault();
    setNotice("");
    act.run(async () => {
      const probe = name.trim();
      const detector = { type: "feature", sae_id: sae, index: numberOrNull(index), [by]: numberOrNull(level) };
      await api.probes.create({ name: probe, description, detector });
      const done = [`Created probe ${probe}`];
      try {
        if (action !== "report") {
          const body = action === "steer"
            ? { name: profile, description: `steers #${steerIndex} by ${strength} once probe ${probe} fires`,
                steering: [{ sae_id: sae, ...(layer != null ? { layer } : {}), features: [{ index: numberOrNull(steerIndex), op: "add", strength: numberOrNull(strength) }],
                  when: { probe, tokens: numberOrNull(tokens) } }] }
            : { name: profile, description: `ends the answer when probe ${probe} fires`, abort: [{ probe }] };
          await api.profiles.create(body);
          done.push(`profile ${profile}`);
          if (useProfile) {
            await api.profiles.activate(profile);
            done.push(`made ${profile} the steering base`);
          }
        }
        if (watch) {
          await api.probes.activate(probe);
          done.push("it watches every request");
        }
      } catch (error) {
        throw after(done.join(", "), error);
      } finally {
        changed();
      }
      setNotice(`${done.join(", ")}.`);
      setName("");
      setProfileName("");
    });
  };
  return html`<${Panel} title="New feature probe">
    <form onSubmit=${create} aria-label="New feature probe">
      <div class="row">
        <label class="grow">Probe name <input value=${name} onInput=${(e) => setName(e.target.value)} name="probe-name" required maxlength="120" /></label>
        <label class="grow">Description (optional) <input value=${description} onInput=${(e) => setDescription(e.target.value)} name="probe-description" /></label>
      </div>
      <div class="row">
        <${SaePicker} value=${sae} onChange=${setSae} />
        <label class="inline">Feature index <input type="number" min="0" step="1" value=${index} onInput=${(e) => setIndex(e.target.value)} name="probe-index" required /></label>
        ${index !== "" && sae ? html`<${FeatureLink} sae=${sae} index=${index}>${labels[index] || "card"}<//>` : null}
      </div>
      <fieldset class="choice">
        <legend>Fires at</legend>
        <label class="inline"><input type="radio" name="probe-by" checked=${by === "threshold"} onChange=${() => setBy("threshold")} /> a raw activation</label>
        <label class="inline"><input type="radio" name="probe-by" checked=${by === "percentile"} onChange=${() => setBy("percentile")} /> a calibrated percentile</label>
        ${by === "threshold"
          ? html`<label class="inline">Activation threshold <input type="number" min="0" step="any" value=${level} onInput=${(e) => setLevel(e.target.value)} required /></label>`
          : html`<label class="inline">Percentile (1–99) <input type="number" min="1" max="99" step="1" value=${level} onInput=${(e) => setLevel(e.target.value)} required /></label>`}
      </fieldset>
      <fieldset class="choice">
        <legend>When it fires</legend>
        <label class="inline">Action
          <select value=${action} onChange=${(e) => setAction(e.target.value)} name="probe-action">
            <option value="report">report (its verdict in the answer)</option>
            <option value="steer">steer a feature from there on</option>
            <option value="abort">end the answer (content_filter)</option>
          </select></label>
        ${action === "steer" ? html`<div class="row">
          <label class="inline">Steer feature index <input type="number" min="0" step="1" value=${steerIndex} onInput=${(e) => setSteerIndex(e.target.value)} required /></label>
          <label class="inline">Strength <input type="number" min="-200" max="200" step="any" value=${strength} onInput=${(e) => setStrength(e.target.value)} required /></label>
          <label class="inline">For tokens (empty: the rest of the answer) <input type="number" min="1" step="1" value=${tokens} onInput=${(e) => setTokens(e.target.value)} /></label>
        </div>` : null}
        ${action !== "report" ? html`<div class="row">
          <label class="grow">Profile holding the condition <input value=${profileName} onInput=${(e) => setProfileName(e.target.value)} placeholder=${profile} name="condition-profile" /></label>
          <label class="inline"><input type="checkbox" checked=${useProfile} onChange=${(e) => setUseProfile(e.target.checked)} /> make it the steering base now</label>
        </div>
        <p class="note">A probe only reports; ${action === "steer" ? "steering once it fires" : "ending the answer"} is a condition of a profile, written as ${profile ? html`<strong>${profile}</strong>` : "one"} (a request may also name it with <code>profile</code>).</p>` : null}
      </fieldset>
      <label class="inline"><input type="checkbox" checked=${watch} onChange=${(e) => setWatch(e.target.checked)} /> Watch every request (activate the probe)</label>
      <div class="row"><button type="submit" disabled=${act.busy || !sae || !name.trim()}>Create probe</button></div>
      <${ErrorNote} error=${act.error} />
      ${notice ? html`<${Note}>${notice}<//>` : null}
    </form>
  <//>`;
}

/** The training job's figures once it has succeeded. */
function TrainingResult({ job }) {
  const m = job.result?.metrics;
  if (!m) return null;
  return html`<dl class="metrics" aria-label="Held-out metrics">
    <dt>held-out accuracy</dt><dd>${num(m.accuracy, 3)}</dd>
    <dt>AUC</dt><dd>${num(m.auc, 3)}</dd>
    <dt>per-position accuracy</dt><dd>${num(m.position_accuracy, 3)} (AUC ${num(m.position_auc, 3)})</dd>
    <dt>training accuracy</dt><dd>${num(m.train_accuracy, 3)}</dd>
    <dt>texts</dt><dd>${m.train} to fit, ${m.held_out} held out (${plural(m.train_positions, "position")} fitted)</dd>
  </dl>`;
}

/** Trains a linear probe from positive and negative texts (POST /api/probes/train), following the job. */
function Train({ changed }) {
  const [sae, setSae] = useSae();
  const [name, setName] = useState("");
  const [positive, setPositive] = useState("");
  const [negative, setNegative] = useState("");
  const [threshold, setThreshold] = useState("0.5");
  const [heldOut, setHeldOut] = useState("0.25");
  const [job, setJob] = useState(null);
  const act = useAction();
  const poll = useAction();
  useEffect(() => {
    if (!job) return undefined;
    if (ENDED.has(job.state)) {
      changed(); // the probe list shows the new probe
      return undefined;
    }
    const timer = setTimeout(() => poll.run(async () => setJob(await api.jobs.get(job.id))), 1000);
    return () => clearTimeout(timer);
  }, [job]);
  const start = (event) => {
    event.preventDefault();
    act.run(async () => {
      setJob(null);
      setJob(await api.probes.train({
        name: name.trim(), positive: { texts: lines(positive) }, negative: { texts: lines(negative) }, sae_id: sae,
        threshold: numberOrNull(threshold), held_out: numberOrNull(heldOut),
      }));
    });
  };
  const running = job && !ENDED.has(job.state);
  return html`<${Panel} title="Train a linear probe">
    <p class="note">A logistic probe on the residual where the SAE reads, fitted on every position of the example texts; some texts are held out to measure it.</p>
    <form onSubmit=${start} aria-label="Train a linear probe">
      <div class="row">
        <label class="grow">Name of the trained probe <input value=${name} onInput=${(e) => setName(e.target.value)} name="train-name" required maxlength="120" /></label>
        <${SaePicker} value=${sae} onChange=${setSae} label="Read where this SAE reads" />
      </div>
      <div class="examples">
        <label>Positive examples (one per line: it should fire on these)
          <textarea value=${positive} onInput=${(e) => setPositive(e.target.value)} name="train-positive"></textarea></label>
        <label>Negative examples (one per line: it should not fire)
          <textarea value=${negative} onInput=${(e) => setNegative(e.target.value)} name="train-negative"></textarea></label>
      </div>
      <div class="row">
        <label class="inline">Firing probability <input type="number" min="0.01" max="0.99" step="0.01" value=${threshold} onInput=${(e) => setThreshold(e.target.value)} /></label>
        <label class="inline">Held-out fraction <input type="number" min="0.1" max="0.5" step="0.05" value=${heldOut} onInput=${(e) => setHeldOut(e.target.value)} /></label>
        <button type="submit" disabled=${act.busy || running || !sae || !name.trim()}>
          Train on ${lines(positive).length} + ${plural(lines(negative).length, "text")}</button>
      </div>
    </form>
    <${ErrorNote} error=${act.error || poll.error} />
    ${job ? html`<div class="training-job" aria-label="Training job">
      <div class="row"><strong>${job.description}</strong> <span class="mono meta-inline">${job.id}</span></div>
      <div class="row"><${Progress} done=${job.progress.done} total=${job.progress.total} unit=${job.progress.unit} />
        <span class=${`badge ${job.state === "succeeded" ? "good" : job.state === "failed" ? "bad" : ""}`} data-state=${job.state}>${job.state}</span>
        ${running ? html`<button class="danger" onClick=${() => poll.run(async () => setJob(await api.jobs.cancel(job.id)))}>Cancel</button>` : null}</div>
      ${job.error ? html`<p class="error">${job.error.code}: ${job.error.message}</p>` : null}
      ${job.state === "succeeded" ? html`<p>Stored as probe <strong>${job.result.probe.name}</strong> (inactive).</p><${TrainingResult} job=${job} />` : null}
    </div>` : null}
  <//>`;
}

/** The Probes view; `args` may name an SAE and a feature to prefill the new probe's form. */
export default function ProbesView({ args = [] }) {
  const [version, setVersion] = useState(0);
  const changed = () => setVersion((v) => v + 1);
  return html`<div class="wide docs"><${ProbeList} version=${version} changed=${changed} /></div>
    <div class="docs"><${NewProbe} args=${args} changed=${changed} /></div>
    <div class="docs"><${Train} changed=${changed} /></div>`;
}
