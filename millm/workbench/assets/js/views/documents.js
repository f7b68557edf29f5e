// Profiles, clusters and circuits: the documents that can be the steering base. Each panel lists
// its documents with what they steer and whether they are active, imports and exports files, and
// activates, deactivates and deletes; profiles are also created and edited in a form, clusters
// have their persistent intensity dial, circuits show their evidence rung in the spec's words and
// whether the active one steers now. Every change bumps one counter so all panels reload (making
// a cluster the base deactivates the profile that was, and so on).

import { useEffect, useState } from "preact/hooks";
import * as api from "../api.js";
import {
  ConfirmButton, ErrorNote, FeatureLink, FileImport, Note, Panel, Table, download, fileName, html, num, plural, useAction, useLabels, useLoad,
  usePanelActions, useServer,
} from "../ui.js";

// The dial's envelope when a document declares no range: [0, STEERING_INTENSITY_MAX], whose
// default (and largest allowed value) is 2. A server configured lower refuses past it with a 400,
// shown under the dial.
const DIAL_ENVELOPE = [0, 2];
const STRENGTH_LIMIT = 200; // applied strengths are clamped to ±200 (docs/clusters-circuits.md)

// What each rung means, in the words of the spec's evidence table; the rung's phrase itself is
// always the one the API answers (`language`), never composed here.
const RUNG_MEANING = {
  0: "Mined co-occurrence only — unvalidated",
  1: "Attribution evidence, not causal",
  2: "Each edge causally validated",
  3: "The whole circuit was faithfulness-tested",
};

const OPS = ["add", "clamp", "cap", "ablate"];

const signed = (x) => (x > 0 ? `+${num(x)}` : x < 0 ? `−${num(-x)}` : "0");

/** One feature operator as a short phrase: +40, clamp 3, cap 5, ablate. */
function opText(f) {
  const op = f.op || "add";
  if (op === "add") return signed(f.strength);
  if (op === "ablate") return "ablate";
  return `${op} ${num(f.value)}`;
}

/** One SAE's features in a profile, each with its label, and the entry's condition. */
function SteeringEntry({ entry: e }) {
  const labels = useLabels(e.sae_id);
  return html`<li>
    <span class="mono meta-inline">${e.sae_id}${e.layer != null ? ` @${e.layer}` : ""}</span>
    ${e.features.map((f) => html` <span class="chip"><${FeatureLink} sae=${e.sae_id} index=${f.index} /> ${opText(f)}</span>${
      labels[f.index] ? html` <span class="meta-inline">${labels[f.index]}</span>` : null}`)}
    ${e.features.length ? null : html` <span class="note">no features</span>`}
    ${e.when ? html`<div class="meta">when probe <strong>${e.when.probe}</strong> fires${e.when.tokens ? `, for ${plural(e.when.tokens, "token")}` : ""}</div>` : null}
  </li>`;
}

/** What a profile document steers: per SAE its features, conditions, vectors and abort probes. */
function Steers({ doc }) {
  const entries = doc.steering || [];
  const vectors = doc.vectors || [];
  const aborts = doc.abort || [];
  if (!entries.length && !vectors.length && !aborts.length) return html`<span class="note">nothing</span>`;
  return html`<ul class="steers">
    ${entries.map((e) => html`<${SteeringEntry} entry=${e} />`)}
    ${vectors.map((v) => html`<li><span class="chip">vector <span class="mono">${v.vector_id}</span> ${opText(v)}</span>
      ${v.when ? html`<div class="meta">when probe <strong>${v.when.probe}</strong> fires</div>` : null}</li>`)}
    ${aborts.map((a) => html`<li><span class="chip bad">ends the answer</span> when probe <strong>${a.probe}</strong> fires</li>`)}
  </ul>`;
}

const ActiveBadge = ({ active }) =>
  active ? html`<span class="badge good" data-active="true">active</span>` : html`<span class="badge" data-active="false">inactive</span>`;

/** A select of what to do with a name already taken, defaulting to the API's own default for the kind. */
function ConflictPicker({ value, onChange }) {
  return html`<label class="inline">On a name clash
    <select value=${value} onChange=${(e) => onChange(e.target.value)}>
      <option value="rename">rename the import (name-2)</option>
      <option value="fail">refuse the import</option>
    </select></label>`;
}

/** The steering base now (GET /api/steering): which document, whether it still fits. */
function Base({ version, changed }) {
  const state = useLoad(() => api.steering.get(), [version]);
  const act = useAction();
  const s = state.value;
  const base = s?.active_base;
  const back = () => act.run(async () => { await api[`${base.kind}s`].deactivate(); changed(); });
  return html`<${Panel} title="Steering base" actions=${html`<button class="secondary" onClick=${state.reload}>Refresh</button>`}>
    <${ErrorNote} error=${state.error || act.error} />
    ${s ? html`<div class="row base-line" aria-label="Steering base now">
      <span class=${`badge ${s.enabled ? "good" : ""}`}>${s.enabled ? "steering enabled" : "steering disabled"}</span>
      ${base
        ? html`<span>The base is ${base.kind} <strong>${base.name}</strong>${base.fits ? "" : " — it no longer fits"}</span>
            <button class="secondary" disabled=${act.busy} onClick=${back}>Back to the live values</button>`
        : html`<span>The base is the live values${s.saes?.length ? "" : " (no SAE is attached)"}.</span>`}
    </div>
    ${base && !base.fits ? html`<p class="error">${base.problem}</p>` : null}
    <p class="note">${s.live_reason}</p>` : html`<${Note}>Loading…<//>`}
  <//>`;
}

// profiles --------------------------------------------------------------------------------------

const emptyRow = () => ({ index: "", op: "add", amount: "" });
const rowOf = (f) => {
  const op = f.op || "add";
  return { index: String(f.index), op, amount: op === "ablate" ? "" : String(op === "add" ? f.strength : f.value) };
};
const filled = (r) => r.index !== "" || r.amount !== "";
const numberOrNull = (text) => (text === "" || text === null ? null : Number(text));

/** A form row's feature as the document writes it (an empty field is sent as null: the API names it). */
function featureOf(r) {
  const f = { index: numberOrNull(r.index), op: r.op };
  if (r.op === "add") f.strength = numberOrNull(r.amount);
  else if (r.op !== "ablate") f.value = numberOrNull(r.amount);
  return f;
}

/** Create or edit a profile: name, description, and per SAE its feature rows (index, operator,
 *  strength or value). Conditional entries, vectors and abort probes are kept as they are. */
function ProfileForm({ profile, onSaved, onCancel }) {
  const { attached } = useServer();
  const doc = profile?.document || { steering: [] };
  const plain = doc.steering.filter((e) => !e.when);
  const kept = doc.steering.filter((e) => e.when);
  const [name, setName] = useState(profile?.name || "");
  const [description, setDescription] = useState(doc.description || "");
  const [entries, setEntries] = useState(() => Object.fromEntries(plain.map((e) => [e.sae_id, e.features.map(rowOf)])));
  const layers = Object.fromEntries(plain.map((e) => [e.sae_id, e.layer]));
  const choices = [...new Set([...plain.map((e) => e.sae_id), ...attached.map((s) => s.id)])];
  // The attached SAEs may arrive after the form opens: until one is chosen, the first choice.
  const [chosen, setSae] = useState(null);
  const sae = choices.includes(chosen) ? chosen : choices[0] || "";
  const labels = useLabels(sae);
  const act = useAction();
  const rows = entries[sae] || [emptyRow()];
  const setRows = (next) => setEntries({ ...entries, [sae]: next });
  const edit = (i, change) => setRows(rows.map((r, j) => (j === i ? { ...r, ...change } : r)));

  const save = (event) => {
    event.preventDefault();
    act.run(async () => {
      const steering = Object.entries(entries)
        .filter(([, list]) => list.some(filled))
        .map(([id, list]) => {
          const layer = layers[id] ?? attached.find((s) => s.id === id)?.attached_layer;
          return { sae_id: id, ...(layer != null ? { layer } : {}), features: list.filter(filled).map(featureOf) };
        });
      const body = { name: name.trim(), description, steering: [...steering, ...kept] };
      const saved = profile ? await api.profiles.update(profile.id, body) : await api.profiles.create(body);
      onSaved(saved);
    });
  };
  const extra = [
    kept.length ? plural(kept.length, "conditional entry", "conditional entries") : "",
    doc.vectors?.length ? plural(doc.vectors.length, "vector") : "",
    doc.abort?.length ? plural(doc.abort.length, "abort probe") : "",
  ].filter(Boolean);
  const title = profile ? `Edit profile ${profile.name}` : "New profile";
  return html`<form class="profile-form" onSubmit=${save} aria-label=${title}>
    <h3>${title}</h3>
    <div class="row">
      <label class="grow">Name <input value=${name} onInput=${(e) => setName(e.target.value)} name="profile-name" required maxlength="120" /></label>
      <label class="grow">Description <input value=${description} onInput=${(e) => setDescription(e.target.value)} name="profile-description" /></label>
    </div>
    ${choices.length
      ? html`<label class="inline">Features of SAE
          <select value=${sae} onChange=${(e) => setSae(e.target.value)} name="profile-sae">
            ${choices.map((id) => {
              const a = attached.find((s) => s.id === id);
              return html`<option value=${id}>${id}${a ? ` · layer ${a.attached_layer}` : " · not attached"}</option>`;
            })}
          </select></label>`
      : html`<p class="note">No SAE is attached: attach one (Models, SAEs & jobs) to give this profile features.</p>`}
    ${sae ? html`<div class="feature-rows">
      ${rows.map((r, i) => html`<fieldset class="feature-row" key=${i}>
        <legend>Feature ${i + 1}</legend>
        <label>Feature index <input type="number" min="0" step="1" value=${r.index} onInput=${(e) => edit(i, { index: e.target.value })} /></label>
        <label>Operator <select value=${r.op} onChange=${(e) => edit(i, { op: e.target.value })}>
          ${OPS.map((op) => html`<option value=${op}>${op}</option>`)}</select></label>
        ${r.op === "ablate" ? html`<span class="note">held at 0 where it fires</span>`
          : html`<label>${r.op === "add" ? "Strength" : "Value"}
              <input type="number" step="any" min=${r.op === "add" ? -STRENGTH_LIMIT : 0} max=${r.op === "add" ? STRENGTH_LIMIT : undefined}
                value=${r.amount} onInput=${(e) => edit(i, { amount: e.target.value })} /></label>`}
        ${r.index !== "" ? html`<${FeatureLink} sae=${sae} index=${r.index}>${labels[r.index] || "card"}<//>` : null}
        <button type="button" class="secondary" onClick=${() => setRows(rows.filter((_, j) => j !== i))}
          aria-label=${`Remove feature ${i + 1}`}>Remove</button>
      </fieldset>`)}
      <button type="button" class="secondary" onClick=${() => setRows([...rows, emptyRow()])}>Add a feature</button>
    </div>` : null}
    <p class="note">add: a strength within ±${STRENGTH_LIMIT} · clamp: hold the activation at a value · cap: at most a value along the
      feature's direction · ablate: off where it fires.${extra.length ? ` Kept as they are: ${extra.join(", ")}.` : ""}</p>
    <div class="row">
      <button type="submit" disabled=${act.busy || !name.trim()}>${profile ? "Save changes" : "Create profile"}</button>
      <button type="button" class="secondary" onClick=${onCancel}>Cancel</button>
    </div>
    <${ErrorNote} error=${act.error} />
  </form>`;
}

/** Saves the live values (operators included) as a new profile. */
function SaveCurrent({ onSaved }) {
  const [name, setName] = useState("");
  const act = useAction();
  const save = (e) => {
    e.preventDefault();
    act.run(async () => { const row = await api.profiles.saveCurrent({ name: name.trim(), description: "" }); setName(""); onSaved(row); });
  };
  return html`<form class="row" onSubmit=${save} aria-label="Save the live values">
    <label class="grow">Save the live values as a profile named
      <input value=${name} onInput=${(e) => setName(e.target.value)} name="save-current-name" /></label>
    <button type="submit" class="secondary" disabled=${act.busy || !name.trim()}>Save live values</button>
    <${ErrorNote} error=${act.error} />
  </form>`;
}

function Profiles({ version, changed }) {
  const list = useLoad(() => api.profiles.list(), [version]);
  const { act, run, say, notice } = usePanelActions(version, changed);
  const [editing, setEditing] = useState(null); // null: no form; "new"; or the profile row being edited
  const [conflict, setConflict] = useState("fail");
  const profiles = list.value?.data || [];
  const importFile = (text, file) => run(async () => {
    const answer = await api.profiles.importText(text, { on_conflict: conflict });
    return `Imported ${answer.data.map((p) => p.name).join(", ")} from ${file}.`;
  });
  const saved = (row) => { setEditing(null); changed(); say(`Saved profile ${row.name}.`); };
  return html`<${Panel} title="Profiles" actions=${html`
      <${FileImport} label="Import a profile file" onText=${importFile} />
      <button class="secondary" disabled=${act.busy || !profiles.length}
        onClick=${() => run(async () => { download(await api.profiles.exportAllText(), "profiles.bundle.json"); })}>Export all</button>
      <button onClick=${() => setEditing("new")} disabled=${editing === "new"}>New profile</button>`}>
    <div class="row"><${ConflictPicker} value=${conflict} onChange=${setConflict} /></div>
    <${ErrorNote} error=${list.error || act.error} />
    ${notice ? html`<${Note}>${notice}<//>` : null}
    ${editing ? html`<${ProfileForm} key=${editing === "new" ? "new" : editing.id} profile=${editing === "new" ? null : editing}
      onSaved=${saved} onCancel=${() => setEditing(null)} />` : null}
    <${Table} label="Profiles" rows=${profiles} rowKey=${(p) => p.id} empty="No profile yet: create one, import a file, or save the live values."
      columns=${[
        ["Profile", (p) => html`<strong>${p.name}</strong><div class="meta">${p.document.description || ""}</div>`],
        ["Steers", (p) => html`<${Steers} doc=${p.document} />`],
        ["State", (p) => html`<${ActiveBadge} active=${p.active} />`],
        ["", (p) => html`<div class="actions">
          ${p.active
            ? html`<button class="secondary" disabled=${act.busy} onClick=${() => run(async () => { await api.profiles.deactivate(); return `${p.name} is no longer the base.`; })}>Deactivate</button>`
            : html`<button disabled=${act.busy} onClick=${() => run(async () => { await api.profiles.activate(p.id); return `${p.name} is the steering base.`; })}>Activate</button>`}
          <button class="secondary" onClick=${() => setEditing(p)}>Edit</button>
          <button class="secondary" disabled=${act.busy} onClick=${() => run(async () => { download(await api.profiles.exportText(p.id), fileName(p.name, "profile")); })}>Export</button>
          <${ConfirmButton} label="Delete" confirm=${`Delete ${p.name}?`} disabled=${act.busy}
            onConfirm=${() => run(async () => { await api.profiles.remove(p.id); if (editing?.id === p.id) setEditing(null); return `Deleted ${p.name}.`; })} />
        </div>`],
      ]} />
    <${SaveCurrent} onSaved=${(row) => { changed(); say(`Saved the live values as ${row.name}.`); }} />
  <//>`;
}

// clusters --------------------------------------------------------------------------------------

const applied = (m, lambda) => Math.max(-STRENGTH_LIMIT, Math.min(STRENGTH_LIMIT, (m.sign ?? 1) * m.strength * lambda));

/** A cluster's persistent dial: a range input over the range its document declares (else the
 *  envelope), stored on release (PUT /api/clusters/{id}/intensity). */
function Dial({ cluster, changed }) {
  const [lo, hi] = cluster.intensity_range || DIAL_ENVELOPE;
  const [moving, setMoving] = useState(null); // the value while dragging, before it is stored
  const act = useAction();
  const value = moving ?? cluster.intensity;
  // Shown until the reloaded list brings the stored value (no jump back to the old one meanwhile).
  useEffect(() => setMoving(null), [cluster.intensity]);
  const store = (v) => act.run(async () => {
    try {
      await api.clusters.intensity(cluster.id, v);
      changed();
    } catch (error) {
      setMoving(null);
      throw error;
    }
  });
  return html`<div class="dial">
    <label>Intensity of ${cluster.name}
      <input type="range" min=${lo} max=${hi} step="0.01" value=${value}
        onInput=${(e) => setMoving(Number(e.target.value))} onChange=${(e) => store(Number(e.target.value))} /></label>
    <output aria-label=${`Intensity of ${cluster.name} now`}>${num(value, 3)}</output>
    <div class="meta">${cluster.intensity_range ? `declared range ${num(lo)}–${num(hi)}` : `no declared range: ${num(lo)}–${num(hi)}`}${" "}
      · authored ${num(cluster.authored_intensity)}</div>
    <${ErrorNote} error=${act.error} />
  </div>`;
}

/** Import, export, activate, deactivate and delete buttons, shared by clusters and circuits. */
function useDocumentList(kind, version, changed) {
  const list = useLoad(() => api[kind].list(), [version]);
  const { act, run, notice } = usePanelActions(version, changed);
  const [conflict, setConflict] = useState("rename");
  const importFile = (text, file) => run(async () => {
    const answer = await api[kind].importText(text, { on_conflict: conflict });
    const names = answer.data ? answer.data.map((d) => d.name) : [answer.name];
    return `Imported ${names.join(", ")} from ${file}.`;
  });
  const exportOne = (d) => run(async () => { download(await api[kind].exportText(d.id), fileName(d.name, kind.slice(0, -1))); });
  const remove = (d) => run(async () => { await api[kind].remove(d.id); return `Deleted ${d.name}.`; });
  const deactivate = (d) => run(async () => { await api[kind].deactivate(); return `${d.name} is no longer the base.`; });
  return { list, act, run, conflict, setConflict, notice, importFile, exportOne, remove, deactivate, rows: list.value?.data || [] };
}

function Clusters({ version, changed }) {
  const c = useDocumentList("clusters", version, changed);
  return html`<${Panel} title="Clusters" actions=${html`<${FileImport} label="Import a cluster file" onText=${c.importFile} />`}>
    <p class="note">miStudio cluster definitions (or bundles): features of one SAE layer with authored strengths, scaled by the dial.</p>
    <div class="row"><${ConflictPicker} value=${c.conflict} onChange=${c.setConflict} /></div>
    <${ErrorNote} error=${c.list.error || c.act.error} />
    ${c.notice ? html`<${Note}>${c.notice}<//>` : null}
    <${Table} label="Clusters" rows=${c.rows} rowKey=${(d) => d.id} empty="No cluster imported yet."
      columns=${[
        ["Cluster", (d) => html`<strong>${d.name}</strong>
          <div class="meta">layer ${d.sae.layer ?? "?"}${d.sae.n_features ? ` · ${d.sae.n_features} features` : ""}${d.sae.mistudio_sae_id ? ` · ${d.sae.mistudio_sae_id}` : ""}</div>`],
        ["Members: authored → applied now", (d) => html`<ul class="steers">${d.members.map((m) => html`<li><span class="chip">#${m.feature_idx}
          ${" "}${signed((m.sign ?? 1) * m.strength)} → ${signed(applied(m, d.intensity))}</span>${m.label ? html` <span class="meta-inline">${m.label}</span>` : null}</li>`)}</ul>`],
        ["Dial", (d) => html`<${Dial} cluster=${d} changed=${changed} />`],
        ["State", (d) => html`<${ActiveBadge} active=${d.active} />`],
        ["", (d) => html`<div class="actions">
          ${d.active
            ? html`<button class="secondary" disabled=${c.act.busy} onClick=${() => c.deactivate(d)}>Deactivate</button>`
            : html`<button disabled=${c.act.busy} onClick=${() => c.run(async () => { await api.clusters.activate(d.id); return `${d.name} is the steering base.`; })}>Activate</button>`}
          <button class="secondary" disabled=${c.act.busy} onClick=${() => c.exportOne(d)}>Export</button>
          <${ConfirmButton} label="Delete" confirm=${`Delete ${d.name}?`} disabled=${c.act.busy} onConfirm=${() => c.remove(d)} />
        </div>`],
      ]} />
  <//>`;
}

// circuits --------------------------------------------------------------------------------------

/** A rung as the spec words it: the API's phrase, and what the rung means. */
function Rung({ rung, language }) {
  if (rung === null || rung === undefined) return html`<span class="note">unknown (the definition cannot be read)</span>`;
  return html`<span class=${`rung rung-${rung}`}>rung ${rung}</span> <strong class="rung-language">${language}</strong>
    <div class="meta">${RUNG_MEANING[rung] || ""}</div>`;
}

const Bindings = ({ bindings }) => html`<ul class="bindings">${(bindings || []).map((b) => html`<li>
  layer ${b.layer}: <span class=${`badge ${b.status === "bind" ? "good" : b.status === "warn" ? "" : "bad"}`}>${b.status}</span>${" "}
  <span class="meta-inline">${b.detail}</span></li>`)}</ul>`;

/** Activate (with the rung acknowledgement a circuit below rung 2 needs) or deactivate. */
function CircuitSwitch({ circuit, c }) {
  const [acknowledged, setAcknowledged] = useState(false);
  const [overlap, setOverlap] = useState(false);
  if (circuit.active) {
    const out = () => c.run(async () => { await api.circuits.deactivateOne(circuit.id); return `${circuit.name} no longer serves.`; });
    return html`<button class="secondary" disabled=${c.act.busy} onClick=${out}>Deactivate</button>`;
  }
  const below = circuit.rung !== null && circuit.rung < 2;
  const activate = () => c.run(async () => {
    const body = { ...(below && acknowledged ? { acknowledge_rung: true } : {}), ...(overlap ? { allow_layer_overlap: true } : {}) };
    await api.circuits.activate(circuit.id, body);
    return `${circuit.name} is the steering base.`;
  });
  return html`${below ? html`<label class="inline ack"><input type="checkbox" checked=${acknowledged} onChange=${(e) => setAcknowledged(e.target.checked)} />
      Acknowledge rung ${circuit.rung}: not causally validated</label>` : null}
    <label class="inline ack"><input type="checkbox" checked=${overlap} onChange=${(e) => setOverlap(e.target.checked)} />
      Compose onto layers other circuits hold</label>
    <button disabled=${c.act.busy} onClick=${activate}>Activate</button>`;
}

/** The layers the active circuits claim (GET /api/circuits/claims): who holds each, composed or not. */
function LayerClaims({ version }) {
  const claims = useLoad(() => api.circuits.claims(), [version]);
  if (claims.error) return html`<${ErrorNote} error=${claims.error} />`;
  return html`<h3>Layer claims</h3><${Table} label="Layer claims" rows=${claims.value?.data || []} empty="No layer is claimed."
    rowKey=${(r) => `${r.layer}-${r.circuit_id}`}
    columns=${[
      ["Layer", (r) => r.layer],
      ["Circuit", (r) => html`<strong>${r.circuit_name}</strong>`],
      ["", (r) => (r.composed ? html`<span class="badge bad">composed: a sum of circuits</span>` : html`<span class="badge good">exclusive</span>`)],
      ["Features it writes", (r) => r.steering_keys.map((f) => html`<span class="chip">#${f}</span>`)],
    ]} />`;
}

/** Whether the active circuit steers now (GET /api/circuits/active): mode, reason, bindings, and the rung header it earns. */
function ActiveCircuit({ version }) {
  const active = useLoad(() => api.circuits.active(), [version]);
  const a = active.value;
  if (active.error) return html`<${ErrorNote} error=${active.error} />`;
  if (!a) return null;
  if (!a.circuit) return html`<p class="note" aria-label="Active circuit">No circuit is active.</p>`;
  const s = a.steering;
  return html`<div class="active-circuit" aria-label="Active circuit">
    <h3>Active circuit: ${a.circuit.name}</h3>
    <p><span class=${`badge ${s.steering ? "good" : "bad"}`} data-steering=${String(s.steering)}>${s.steering ? "steers now" : "does not steer now"}</span>
      ${" "}mode <strong>${s.mode}</strong>: ${s.reason}</p>
    <p>Evidence: <${Rung} rung=${s.rung} language=${s.language} /></p>
    ${s.rung_header
      ? html`<p class="note">Responses carry <code>X-miLLM-Circuit-Rung: ${s.rung};language="${s.language}"</code>.</p>`
      : html`<p class="note">Responses carry no X-miLLM-Circuit-Rung header now (it is sent only while a circuit steers in full).</p>`}
    <${Bindings} bindings=${s.bindings} />
  </div>`;
}

function Circuits({ version, changed }) {
  const c = useDocumentList("circuits", version, changed);
  return html`<${Panel} title="Circuits" actions=${html`<${FileImport} label="Import a circuit file" onText=${c.importFile} />`}>
    <p class="note">miStudio circuit definitions: members on several layers, each steered through its own layer's SAE; one dial scales them all (per request, <code>steering_intensity</code>).</p>
    <div class="row"><${ConflictPicker} value=${c.conflict} onChange=${c.setConflict} /></div>
    <${ErrorNote} error=${c.list.error || c.act.error} />
    ${c.notice ? html`<${Note}>${c.notice}<//>` : null}
    <${Table} label="Circuits" rows=${c.rows} rowKey=${(d) => d.id} empty="No circuit imported yet."
      columns=${[
        ["Circuit", (d) => html`<strong>${d.name}</strong>
          <div class="meta">layers ${d.layers.join(", ")} · ${plural(d.members, "member")} · ${plural(d.edges, "edge")}${d.intensity_range
            ? ` · declared range ${num(d.intensity_range[0])}–${num(d.intensity_range[1])}` : " · no declared range"}</div>`],
        ["Evidence", (d) => html`<${Rung} rung=${d.rung} language=${d.language} />`],
        ["Binding now", (d) => html`<div class="meta-inline">${d.steering.mode === "full" ? "every layer binds" : d.steering.mode === "slice_fallback"
          ? "some layers bind (slice_fallback)" : "no layer binds"}</div><${Bindings} bindings=${d.steering.bindings} />`],
        ["State", (d) => html`<${ActiveBadge} active=${d.active} />`],
        ["", (d) => html`<div class="actions">
          <${CircuitSwitch} circuit=${d} c=${c} />
          <button class="secondary" disabled=${c.act.busy} onClick=${() => c.exportOne(d)}>Export</button>
          <${ConfirmButton} label="Delete" confirm=${`Delete ${d.name}?`} disabled=${c.act.busy} onConfirm=${() => c.remove(d)} />
        </div>`],
      ]} />
    <${ActiveCircuit} version=${version} />
    <${LayerClaims} version=${version} />
  <//>`;
}

/** The Profiles, clusters, circuits view. */
export default function DocumentsView() {
  const [version, setVersion] = useState(0);
  const changed = () => setVersion((v) => v + 1);
  return html`<div class="wide docs"><${Base} version=${version} changed=${changed} /></div>
    <div class="wide docs"><${Profiles} version=${version} changed=${changed} /></div>
    <div class="wide docs"><${Clusters} version=${version} changed=${changed} /></div>
    <div class="wide docs"><${Circuits} version=${version} changed=${changed} /></div>`;
}
