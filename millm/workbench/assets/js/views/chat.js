// Chat & compare: a conversation with the loaded model (/v1/chat/completions, streamed), or the same
// turn under up to four steering variants side by side (/api/compare, streamed). Every answer shows
// the X-miLLM-* headers millm sent; chat answers also show their probe verdicts and where they fired.

import { useEffect, useRef, useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, Note, Panel, html, useLoad, useServer } from "../ui.js";
import { ChatAnswer, CompareTurn, HEADERS } from "./answers.js";
import { liveRows } from "../live.js";

// The conversation as a list of {role, content}, shared with Inspect ("Use the chat's conversation").
const CONVERSATION = "millm.conversation";
// What each answer came with (headers, verdicts, variants), kept beside the plain conversation so
// that the shared list stays exactly what a chat request's `messages` takes.
const ANSWERS = "millm.chat.answers";
const MAX_VARIANTS = 4;
const KINDS = [
  ["unsteered", "unsteered"],
  ["live", "live (what /v1 gets now)"],
  ["profile", "a profile"],
  ["features", "features"],
];
// A chat may also name a steered variant (/api/variants) as its model: the variant's steering, the
// dial still the chat's. Compare takes steerings, not model names, so it does not offer this kind.
const CHAT_KINDS = [...KINDS, ["model", "a steered variant (a model name)"]];
const WITH_INTENSITY = new Set(["live", "profile", "model"]);

const newVariant = (kind) => ({ kind, profile: "", features: "", intensity: "", sae: "", model: "" });

function loadLog() {
  try {
    const conversation = JSON.parse(sessionStorage.getItem(CONVERSATION) || "[]");
    const answers = JSON.parse(sessionStorage.getItem(ANSWERS) || "{}");
    if (!Array.isArray(conversation)) return [];
    return conversation
      .filter((m) => m && typeof m.role === "string" && typeof m.content === "string")
      .map((m, i) => (m.role === "assistant" && answers[i] ? { ...m, meta: answers[i] } : { role: m.role, content: m.content }));
  } catch {
    return []; // a damaged entry: start a new conversation rather than fail the view
  }
}

function saveLog(log) {
  const answers = {};
  log.forEach((entry, i) => {
    if (entry.meta) answers[i] = { ...entry.meta, pending: false };
  });
  sessionStorage.setItem(CONVERSATION, JSON.stringify(log.map(({ role, content }) => ({ role, content }))));
  sessionStorage.setItem(ANSWERS, JSON.stringify(answers));
}

/** The X-miLLM-* headers of a response, by their documented spelling. */
function millmHeaders(headers) {
  const known = new Map([...HEADERS, "X-miLLM-Constrained"].map((name) => [name.toLowerCase(), name]));
  const out = {};
  headers.forEach((value, name) => {
    if (name.toLowerCase().startsWith("x-millm-")) out[known.get(name.toLowerCase()) || name] = value;
  });
  return out;
}

function parseFeatures(text) {
  const items = text.split(/[\s,;]+/).filter(Boolean);
  if (!items.length) throw new Error("list at least one feature as index:strength (e.g. 12:40)");
  return items.map((item) => {
    const match = /^#?(\d+):([-+]?(?:\d+\.?\d*|\.\d+))$/.exec(item);
    if (!match) throw new Error(`"${item}" is not index:strength (e.g. 12:40 or 7:-20)`);
    return { index: Number(match[1]), strength: Number(match[2]) };
  });
}

// The dial takes a number from 0 to 2 or a word (off, min, max); the API judges either.
const intensityOf = (v) => {
  const text = v.intensity.trim();
  if (!text || !WITH_INTENSITY.has(v.kind)) return undefined;
  return /^[-+]?(\d+\.?\d*|\.\d+)$/.test(text) ? Number(text) : text;
};

function featureEntries(v, attached) {
  const features = parseFeatures(v.features);
  const sae = v.sae || attached[0]?.id;
  return { sae, features };
}

/** A variant as /api/compare takes it (docs/compare.md). */
function compareVariant(v, attached) {
  const intensity = intensityOf(v);
  const dial = intensity === undefined ? {} : { intensity };
  if (v.kind === "unsteered") return "unsteered";
  if (v.kind === "live") return intensity === undefined ? "live" : { live: true, ...dial };
  if (v.kind === "profile") {
    if (!v.profile) throw new Error("choose a profile");
    return { profile: v.profile, ...dial };
  }
  const { sae, features } = featureEntries(v, attached);
  return { features: features.map((f) => (sae ? { sae_id: sae, ...f } : f)) };
}

/** The same steering as fields of a /v1/chat/completions request (the table in docs/compare.md). */
function chatSteering(v, attached) {
  const intensity = intensityOf(v);
  const dial = intensity === undefined ? {} : { steering_intensity: intensity };
  if (v.kind === "unsteered") return { steering_intensity: 0 };
  if (v.kind === "live") return dial;
  if (v.kind === "profile") {
    if (!v.profile) throw new Error("choose a profile");
    return { profile: v.profile, ...dial };
  }
  if (v.kind === "model") {
    if (!v.model) throw new Error("choose a steered variant");
    return { model: v.model, ...dial };
  }
  const { sae, features } = featureEntries(v, attached);
  // A request's own steering needs its SAE named; with none attached the API says so.
  return { steering: { steering: [{ sae_id: sae ?? "", features }] } };
}

function describe(v) {
  const dial = intensityOf(v) === undefined ? "" : ` @ ${v.intensity.trim()}`;
  if (v.kind === "profile") return `profile ${v.profile}${dial}`;
  if (v.kind === "features") return `features ${v.features.trim()}`;
  if (v.kind === "model") return `variant ${v.model}${dial}`;
  return `${v.kind}${dial}`;
}

function sampling({ maxTokens, temperature, seed }) {
  const body = {};
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  if (temperature !== "") body.temperature = Number(temperature);
  if (seed !== "") body.seed = Number(seed);
  return body;
}

/** `build()`, its error's message prefixed by `where` (the page's own check, before any request). */
function local(where, build) {
  try {
    return build();
  } catch (err) {
    throw new Error(`${where}: ${err.message}`);
  }
}

const plainError = (err) => ({ status: err.status, code: err.code, message: err.message || String(err) });

/** The Chat & compare view. */
export default function ChatView() {
  const server = useServer();
  const profiles = useLoad(() => api.profiles.list());
  const probes = useLoad(() => api.probes.list());
  const steered = useLoad(() => api.variants.list());
  const [log, setLog] = useState(loadLog);
  const [draft, setDraft] = useState("");
  const [settings, setSettings] = useState({ maxTokens: "128", temperature: "0.7", seed: "" });
  const [compare, setCompare] = useState(false);
  const [steer, setSteer] = useState(newVariant("live"));
  const [variants, setVariants] = useState([newVariant("unsteered"), newVariant("live")]);
  const [watch, setWatch] = useState([]);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const abort = useRef(null);
  const generation = useRef(0);
  const input = useRef(null);

  useEffect(() => saveLog(log), [log]);
  useEffect(() => () => abort.current?.abort(), []); // leaving the view ends its stream

  const set = (key) => (e) => setSettings((s) => ({ ...s, [key]: e.target.value }));

  async function send() {
    const text = draft.trim();
    if (!text || busy) return;
    const messages = [...log.map(({ role, content }) => ({ role, content })), { role: "user", content: text }];
    let body;
    try {
      body = compare
        ? { messages, ...sampling(settings), variants: variants.map((v, i) => local(`variant ${i + 1}`, () => compareVariant(v, server.attached))) }
        : { model: server.model ?? undefined, messages, ...sampling(settings), ...local("steering", () => chatSteering(steer, server.attached)),
            ...(watch.length ? { probes: watch } : {}) };
    } catch (err) {
      setError(err); // a variant the page cannot put into a request (no profile chosen, "12:x")
      return;
    }
    const mine = ++generation.current;
    const meta = compare
      ? { kind: "compare", headers: null, variants: [], pending: true }
      : { kind: "chat", headers: null, steeredBy: describe(steer), pending: true };
    const current = { role: "assistant", content: "", meta };
    const before = log;
    // A turn cleared by "New conversation" while it streams stays cleared.
    const show = () => mine === generation.current && setLog([...before, { role: "user", content: text }, { ...current, meta: { ...current.meta } }]);
    show();
    setDraft("");
    setError(null);
    setBusy(true);
    const controller = new AbortController();
    abort.current = controller;
    const onHeaders = (headers) => {
      meta.headers = millmHeaders(headers);
      show();
    };
    const onEvent = compare ? compareEvent(current, show) : chatEvent(current, show);
    try {
      await (compare ? api.compare : api.chat)(body, { onEvent, onHeaders, signal: controller.signal });
    } catch (err) {
      if (!meta.headers && mine === generation.current) {
        // Refused before the stream started: nothing was answered, so the turn goes back to the box.
        setLog(before);
        setDraft(text);
        if (err.name !== "AbortError") setError(err);
        return;
      }
      if (err.name === "AbortError") meta.stopped = true;
      else meta.error = plainError(err);
    } finally {
      meta.pending = false;
      if (meta.headers) show();
      abort.current = null;
      setBusy(false);
      input.current?.focus();
    }
  }

  const onKey = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  };
  const clear = () => {
    generation.current += 1;
    abort.current?.abort();
    setLog([]);
    setError(null);
  };

  const profileNames = (profiles.value?.data || []).map((p) => p.name);
  const probeList = probes.value?.data || [];
  let turn = 0;
  return html`<div class="wide chat-view">
    <${Panel} title="Conversation" actions=${html`
      <label class="switch"><input type="checkbox" role="switch" checked=${compare} disabled=${busy}
        onChange=${(e) => setCompare(e.target.checked)} /> Compare</label>
      <button class="secondary" onClick=${clear} disabled=${!log.length && !busy}>New conversation</button>`}>
      ${server.loaded && !server.ready ? html`<${Note}>No model is ready (${server.status || "unknown"}): load one in Models & SAEs.<//>` : null}
      <div class="messages" aria-live="polite">
        ${log.length ? null : html`<p class="empty">${compare
          ? "Write a message: each variant answers it side by side."
          : "Write a message to start a conversation with the loaded model."}</p>`}
        ${log.map((entry, i) => {
          if (entry.role !== "assistant") {
            if (entry.role === "user") turn += 1;
            return html`<div class="msg ${entry.role}" key=${i}><span class="who">${entry.role === "user" ? "You" : entry.role}</span>${entry.content}</div>`;
          }
          if (entry.meta?.kind === "compare") return html`<${CompareTurn} key=${i} n=${turn} meta=${entry.meta} />`;
          return html`<${ChatAnswer} key=${i} n=${turn} entry=${entry} />`;
        })}
      </div>
      <form class="composer" onSubmit=${(e) => { e.preventDefault(); send(); }}>
        <label>Message <span class="hint">(Enter sends, Shift+Enter starts a new line)</span>
          <textarea ref=${input} rows="3" value=${draft} onInput=${(e) => setDraft(e.target.value)} onKeyDown=${onKey} name="message"></textarea></label>
        <div class="row">
          <button type="submit" disabled=${busy || !draft.trim()}>${compare ? `Compare ${variants.length}` : "Send"}</button>
          <button type="button" class="danger" disabled=${!busy} onClick=${() => abort.current?.abort()}>Stop</button>
          ${busy ? html`<span class="note" role="status">${compare ? "Generating the variants…" : "Generating…"}</span>` : null}
        </div>
        <${ErrorNote} error=${error} />
      </form>
    <//>
    <${Panel} title="Settings" actions=${html`<button class="secondary" onClick=${() => { profiles.reload(); probes.reload(); steered.reload(); }}>Reload profiles, variants & probes</button>`}>
      <${ErrorNote} error=${profiles.error || probes.error} />
      <fieldset class="sampling"><legend>Sampling</legend>
        <label>Max tokens <input type="number" min="1" step="1" value=${settings.maxTokens} onInput=${set("maxTokens")} name="max_tokens" /></label>
        <label>Temperature <input type="number" min="0" max="2" step="0.1" value=${settings.temperature} onInput=${set("temperature")} name="temperature" /></label>
        <label>Seed <input type="number" min="0" step="1" value=${settings.seed} onInput=${set("seed")} placeholder="none" name="seed" /></label>
      </fieldset>
      ${compare
        ? html`<${Variants} variants=${variants} setVariants=${setVariants} profiles=${profileNames} disabled=${busy} />`
        : html`<${VariantEditor} legend="Steering of this chat" value=${steer} onChange=${setSteer} profiles=${profileNames} disabled=${busy}
            kinds=${CHAT_KINDS} models=${(steered.value?.data || []).map((v) => v.name)} />
          <${ProbeChoice} probes=${probeList} chosen=${watch} setChosen=${setWatch} disabled=${busy} />`}
    <//>
  </div>`;
}

/** Applies /v1/chat/completions stream chunks to the answer being written (choice 0). */
function chatEvent(current, show) {
  const meta = current.meta;
  return (chunk) => {
    for (const choice of chunk.choices || []) {
      if (choice.index !== 0) continue;
      if (choice.delta?.content) current.content += choice.delta.content;
      if (choice.finish_reason) meta.finish_reason = choice.finish_reason;
    }
    if (chunk.usage) meta.usage = chunk.usage;
    if (chunk.millm?.probes) meta.probes = chunk.millm.probes.filter((v) => v.index === 0);
    if (chunk.millm?.probes_skipped) meta.skipped = chunk.millm.probes_skipped;
    // A stream says what steered it in its last chunk rather than a header: shown with the headers.
    if (chunk.millm_steering) meta.headers = { ...meta.headers, "X-miLLM-Steering": chunk.millm_steering };
    show();
  };
}

/** The live features behind the variants steered `live` (the answer names only the steering's
 *  version): read now, and kept when the version is still the one they ran at. */
async function nameLive(meta, show) {
  if (!meta.variants.some((v) => v.steering?.kind === "live")) return;
  let state;
  try {
    state = await api.steering.get();
  } catch {
    return; // the answer still names the version
  }
  for (const v of meta.variants) {
    if (v.steering?.kind !== "live") continue;
    v.live = v.steering.params?.version === state.version
      ? { version: state.version, rows: liveRows(state).map(({ sae, index, op, strength, value }) => ({ sae, index, op, strength, value })) }
      : { version: state.version, changed: true };
  }
  meta.variants = [...meta.variants];
  show();
}

/** Applies /api/compare events; the first variant's text is the conversation's answer. */
function compareEvent(current, show) {
  const meta = current.meta;
  const variant = (index) => meta.variants.find((v) => v.index === index);
  return (event) => {
    if (event.object === "compare.start") {
      meta.seed = event.seed;
      meta.variants = event.variants.map((v) => ({ ...v, text: "", finish_reason: null }));
      nameLive(meta, show);
    } else if (event.object === "compare.delta") {
      const v = variant(event.variant);
      if (v) v.text += event.delta;
    } else if (event.object === "compare.finish") {
      const v = variant(event.variant);
      if (v) Object.assign(v, { finish_reason: event.finish_reason, usage: event.usage });
    } else if (event.object === "compare.usage") {
      meta.usage = event.usage;
    }
    current.content = meta.variants[0]?.text ?? "";
    meta.variants = [...meta.variants];
    show();
  };
}

/** One variant: what steers it, and its dial where the API allows one. */
function VariantEditor({ legend, value, onChange, profiles, disabled, onRemove, kinds = KINDS, models = [] }) {
  const { attached } = useServer();
  const set = (key) => (e) => onChange({ ...value, [key]: e.target.value });
  return html`<fieldset class="variant" disabled=${disabled}><legend>${legend}</legend>
    <div class="row">
      <label>Steered by <select value=${value.kind} onChange=${set("kind")} name="kind" aria-label="Steered by">
        ${kinds.map(([kind, text]) => html`<option value=${kind}>${text}</option>`)}</select></label>
      ${value.kind === "model" ? html`<label>Variant <select value=${value.model} onChange=${set("model")} name="model" aria-label="Steered variant">
        <option value="">choose…</option>${models.map((name) => html`<option value=${name}>${name}</option>`)}</select></label>` : null}
      ${value.kind === "profile" ? html`<label>Profile <select value=${value.profile} onChange=${set("profile")} name="profile" aria-label="Profile">
        <option value="">choose…</option>${profiles.map((name) => html`<option value=${name}>${name}</option>`)}</select></label>` : null}
      ${WITH_INTENSITY.has(value.kind) ? html`<label>Intensity <input class="short" value=${value.intensity} onInput=${set("intensity")}
        placeholder="0–2, off, min, max" name="intensity" /></label>` : null}
      ${onRemove ? html`<button type="button" class="secondary" onClick=${onRemove} aria-label=${`Remove ${legend}`}>Remove</button>` : null}
    </div>
    ${value.kind === "profile" && !profiles.length ? html`<p class="note">No profile is saved (Profiles, clusters, circuits).</p>` : null}
    ${value.kind === "model" && !models.length ? html`<p class="note">No steered variant exists (Models, SAEs & jobs).</p>` : null}
    ${value.kind === "features" ? html`
      <label>Features (index:strength, ±200) <input value=${value.features} onInput=${set("features")} placeholder="12:40, 7:-20" name="features" /></label>
      ${attached.length > 1 ? html`<label>SAE <select value=${value.sae || attached[0].id} onChange=${set("sae")} name="sae" aria-label="SAE">
        ${attached.map((s) => html`<option value=${s.id}>${s.id} · layer ${s.attached_layer}</option>`)}</select></label>`
        : attached.length ? html`<p class="meta">On ${attached[0].id} (layer ${attached[0].attached_layer}).</p>`
        : html`<p class="note">No SAE is attached (Models & SAEs).</p>`}` : null}
  </fieldset>`;
}

function Variants({ variants, setVariants, profiles, disabled }) {
  const update = (i) => (v) => setVariants(variants.map((old, j) => (j === i ? v : old)));
  return html`<div class="variants">
    ${variants.map((v, i) => html`<${VariantEditor} key=${i} legend=${`Variant ${i + 1}`} value=${v} onChange=${update(i)} profiles=${profiles}
      disabled=${disabled} onRemove=${variants.length > 1 ? () => setVariants(variants.filter((_, j) => j !== i)) : null} />`)}
    <div class="row">
      <button type="button" class="secondary" disabled=${disabled || variants.length >= MAX_VARIANTS}
        onClick=${() => setVariants([...variants, newVariant("features")])}>Add a variant</button>
      <span class="note">${variants.length} of at most ${MAX_VARIANTS}; every variant gets the same seed.</span>
    </div>
    <p class="note">Compare answers carry no probe verdicts: /api/compare does not run probes.</p>
  </div>`;
}

/** Saved probes this chat's requests name; active ones watch every request anyway. */
function ProbeChoice({ probes, chosen, setChosen, disabled }) {
  const active = probes.filter((p) => p.active);
  const others = probes.filter((p) => !p.active);
  const toggle = (name) => (e) => setChosen(e.target.checked ? [...chosen, name] : chosen.filter((n) => n !== name));
  return html`<fieldset class="probes" disabled=${disabled}><legend>Probes on this chat</legend>
    ${active.length ? html`<p class="meta">Active (watch every request): ${active.map((p) => p.name).join(", ")}</p>` : null}
    ${others.map((p) => html`<label class="inline"><input type="checkbox" checked=${chosen.includes(p.name)} onChange=${toggle(p.name)} /> Watch with ${p.name}</label>`)}
    ${probes.length ? null : html`<p class="note">No probe is saved (Probes). Active probes' verdicts show on every answer.</p>`}
  </fieldset>`;
}
