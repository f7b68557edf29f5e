// Inspect: which features of an attached SAE fire on a text (or the chat's conversation), a per-token
// heat map of one feature, the contrast of two sets of texts (POST /api/saes/{id}/inspect, /contrast),
// the logit lens (lens.js) and attribution graphs (graph.js).

import { useEffect, useRef, useState } from "preact/hooks";
import * as api from "../api.js";
import AttributionPanel from "./graph.js";
import LensPanel from "./lens.js";
import { ErrorNote, FeatureLink, Note, Panel, SaePicker, Table, html, num, plural, useAction, useLoad, useSae } from "../ui.js";

const CONVERSATION_STORE = "millm.conversation"; // written by the chat view: [{role, content}, ...]

/** The chat view's current conversation, or null when it has none (or it is not a list of messages). */
function chatConversation() {
  try {
    const value = JSON.parse(sessionStorage.getItem(CONVERSATION_STORE) || "null");
    const ok = Array.isArray(value) && value.length && value.every((m) => m && typeof m.role === "string" && typeof m.content === "string");
    return ok ? value.map(({ role, content }) => ({ role, content })) : null;
  } catch {
    return null;
  }
}

const lines = (text) => text.split("\n").map((t) => t.trim()).filter(Boolean);

/** A token as it shows in the heat map: white space made visible (· for a space, ↵ before a line break, → for a tab). */
function visible(token) {
  if (token === "") return "∅";
  if (/^\s+$/.test(token)) return token.replace(/ /g, "·").replace(/\t/g, "→").replace(/\r?\n/g, "↵\n");
  return token.replace(/\t/g, "→").replace(/\r?\n/g, "↵\n");
}

/** Each read token as a span whose background grows with the feature's activation there. */
function HeatMap({ activations, prompt }) {
  const values = activations.values;
  const peak = values.reduce((m, v) => Math.max(m, v.value), 0);
  const firing = values.filter((v) => v.value > 0).length;
  const top = values.reduce((best, v) => (v.value > (best?.value ?? -Infinity) ? v : best), null);
  return html`<div>
    <p class="meta">#${activations.index} ${activations.label ? `“${activations.label}”` : "(no label)"}: fires at ${firing} of ${values.length} read tokens
      ${peak > 0 ? html`, peak <span class="num">${num(peak, 4)}</span> on “${visible(top.token)}” (position ${top.position})` : null}.
      ${prompt != null ? ` The first of the ${prompt} prompt tokens is not read (an attention sink).` : ""}</p>
    <div class="legend" aria-hidden="true"><span>0</span><span class="ramp"></span><span>${num(peak, 4)}</span></div>
    <div class="tokens heat" role="group" aria-label=${`Heat map of feature #${activations.index}`}>
      ${values.map((v) => {
        const alpha = peak > 0 ? Math.max(0, v.value) / peak : 0;
        const shown = visible(v.token);
        const ws = /^\s*$/.test(v.token);
        return html`<span key=${v.position} class=${`tok${ws ? " ws" : ""}${v.value > 0 ? " fires" : ""}`}
          style=${{ backgroundColor: `rgba(255, 140, 0, ${(0.9 * alpha).toFixed(3)})` }}
          data-position=${v.position} title=${`${JSON.stringify(v.token)} at position ${v.position} = ${v.value}`}
          aria-label=${`${shown.trim() || shown}: ${num(v.value, 4)}`}>${shown}</span>`;
      })}
    </div>
  </div>`;
}

/** The inspect body's `steering` for the select's value: none, "live", or "profile:<name>". */
function steeringOf(choice) {
  if (choice === "live") return { steering: "live" };
  if (choice.startsWith("profile:")) return { steering: { profile: choice.slice("profile:".length) } };
  return {};
}

/** Paste a text or take the chat's conversation; the features that fire on it, and one feature's heat map. */
function Inspect() {
  const profiles = useLoad(() => api.profiles.list());
  const [sae, setSae] = useSae();
  const [text, setText] = useState("");
  const [messages, setMessages] = useState(null);
  const [noChat, setNoChat] = useState(false);
  const [topK, setTopK] = useState("20");
  const [sort, setSort] = useState("max");
  const [feature, setFeature] = useState("");
  const [steered, setSteered] = useState("none");
  const [result, setResult] = useState(null);
  const [input, setInput] = useState(null); // what the shown result read, so table clicks re-read the same text
  const act = useAction();

  const read = (source, overrides = {}) => act.run(async () => {
    const f = overrides.feature ?? feature;
    const body = {
      ...source,
      top_k: Number(overrides.topK ?? topK) || 20,
      sort: overrides.sort ?? sort,
      ...(String(f).trim() !== "" ? { feature: Number(f) } : {}),
      ...steeringOf(overrides.steered ?? steered),
    };
    const answer = await api.saes.inspect(overrides.sae ?? sae, body);
    setResult({ ...answer, sae: overrides.sae ?? sae });
    setInput(source);
  });
  const submit = (e) => {
    e.preventDefault();
    read(messages ? { messages } : { text });
  };
  const useChat = () => {
    const conversation = chatConversation();
    setNoChat(!conversation);
    if (conversation) setMessages(conversation);
  };
  const showFeature = (index) => {
    setFeature(String(index));
    if (input) read(input, { feature: index, sae: result.sae });
  };
  const resort = (value) => {
    setSort(value);
    if (input) read(input, { sort: value, sae: result.sae });
  };
  const chosen = result?.activations?.index;
  const heat = useRef(null);
  useEffect(() => {
    // On a narrow window the heat map sits below the table: bring a newly chosen feature's map into view.
    const box = heat.current?.getBoundingClientRect();
    if (chosen != null && box && box.top > innerHeight) heat.current.scrollIntoView({ block: "nearest" });
  }, [chosen, result]);

  return html`<${Panel} title="Inspect a text">
    <form class="inspect-form" onSubmit=${submit} aria-label="Inspect">
      <div class="row"><${SaePicker} value=${sae} onChange=${setSae} /></div>
      ${messages
        ? html`<p class="note">The chat's conversation (${plural(messages.length, "message")}, read through the model's chat template):</p>
          <ol class="conversation" aria-label="Conversation to inspect">${messages.map((m) => html`<li><span class="role">${m.role}</span>${m.content}</li>`)}</ol>
          <div class="row"><button type="button" class="secondary" onClick=${() => setMessages(null)}>Paste a text instead</button>
            <button type="button" class="secondary" onClick=${useChat}>Reload the chat's conversation</button></div>`
        : html`<label>Text to inspect
            <textarea value=${text} onInput=${(e) => setText(e.target.value)} name="inspect-text" placeholder="Arr, the pirate ship sailed the seven seas"></textarea></label>
          <div class="row"><button type="button" class="secondary" onClick=${useChat}>Use the chat's conversation</button>
            ${noChat ? html`<span class="note" role="status">The chat has no conversation yet (start one in <a href="#/chat">Chat & compare</a>).</span>` : null}</div>`}
      <div class="row">
        <label class="inline">Features to list <input type="number" min="1" max="256" step="1" value=${topK} onInput=${(e) => setTopK(e.target.value)} name="top-k" /></label>
        <label class="inline">Sort by
          <select value=${sort} onChange=${(e) => resort(e.target.value)} name="sort">
            <option value="max">max</option><option value="mean">mean</option><option value="count">count</option>
          </select></label>
        <label class="inline">Heat map of feature <input type="number" min="0" step="1" value=${feature} onInput=${(e) => setFeature(e.target.value)} name="feature" placeholder="index" /></label>
        <label class="inline">Steering
          <select value=${steered} onChange=${(e) => setSteered(e.target.value)} name="steering">
            <option value="none">unsteered</option><option value="live">live (as a /v1 request now)</option>
            ${(profiles.value?.data || []).map((p) => html`<option value=${`profile:${p.name}`}>profile ${p.name}</option>`)}
          </select></label>
        <button type="submit" disabled=${act.busy || !sae || (!messages && !text.trim())}>Inspect</button>
      </div>
    </form>
    <${ErrorNote} error=${act.error || profiles.error} />
    ${act.busy ? html`<${Note}>Reading…<//>` : null}
    ${result ? html`
      <p class="meta" role="status">${plural(result.tokens.length, "token")} read of ${result.prompt_tokens} · layer ${result.layer} · ${result.steered ? `steered (${result.steering.kind}${result.steering.params?.name ? ` ${result.steering.params.name}` : ""})` : "unsteered"} · sorted by ${result.sort}</p>
      <div class="contrast-sides">
        <section aria-label="Top features of the text">
          <h3>Top features</h3>
          <${Table} label="Top features" rows=${result.features} rowKey=${(f) => f.index} empty="No feature fired."
            columns=${[
              ["", (f) => html`<button class=${`heat-button${chosen === f.index ? "" : " secondary"}`} aria-pressed=${chosen === f.index ? "true" : "false"}
                disabled=${act.busy} onClick=${() => showFeature(f.index)} aria-label=${`Heat map of #${f.index}`} title="Show its heat map">Map</button>`],
              ["Feature", (f) => html`<${FeatureLink} sae=${result.sae} index=${f.index} />`],
              ["Label", (f) => f.label ?? html`<span class="empty">no label</span>`],
              ["Max", (f) => html`<span class="num">${num(f.max, 4)}</span>`],
              ["Mean", (f) => html`<span class="num">${num(f.mean, 4)}</span>`],
              ["Count", (f) => html`<span class="num">${f.count}</span>`],
            ]} />
        </section>
        <section aria-label="Heat map" ref=${heat}>
          <h3>Heat map</h3>
          ${result.activations
            ? html`<${HeatMap} activations=${result.activations} prompt=${result.prompt_tokens} />`
            : html`<p class="note">Choose a feature (its “Map” button, or type its index above) to see its activation at every token.</p>`}
        </section>
      </div>` : null}
  <//>`;
}

/** An effect size; null is the API's infinite d (one set always above the other): ∞ with the side's sign. */
const effect = (d, sign) => (d == null ? html`<span class="infinite" title="infinite: the feature separates every text of one set from every text of the other">${sign < 0 ? "−∞" : "∞"}</span>` : num(d, 4));

/** Two sets of texts, one per line: the features that separate them, ranked on both sides. */
function Contrast() {
  const [sae, setSae] = useSae();
  const [a, setA] = useState("");
  const [b, setB] = useState("");
  const [aggregate, setAggregate] = useState("max");
  const [topK, setTopK] = useState("20");
  const [result, setResult] = useState(null);
  const act = useAction();
  const submit = (e) => {
    e.preventDefault();
    act.run(async () => {
      const answer = await api.saes.contrast(sae, { a: { texts: lines(a) }, b: { texts: lines(b) }, aggregate, top_k: Number(topK) || 20 });
      setResult({ ...answer, sae });
    });
  };
  const side = (rows, sign, label) => html`<${Table} label=${label} rows=${rows} rowKey=${(f) => f.index} empty="No feature favours this set."
    columns=${[
      ["Feature", (f) => html`<${FeatureLink} sae=${result.sae} index=${f.index} />`],
      ["Label", (f) => f.label ?? html`<span class="empty">no label</span>`],
      ["Effect size (d)", (f) => html`<span class="num">${effect(f.effect_size, sign)}</span>`],
      ["Difference", (f) => html`<span class="num">${num(f.difference, 4)}</span>`],
      ["Mean A / B", (f) => html`<span class="num">${num(f.mean_a, 4)} / ${num(f.mean_b, 4)}</span>`],
      ["Fired in A / B", (f) => html`<span class="num">${f.fired_a} / ${f.fired_b}</span>`],
    ]} />`;
  return html`<${Panel} title="Contrast two sets of texts">
    <form onSubmit=${submit} aria-label="Contrast">
      <div class="row"><${SaePicker} value=${sae} onChange=${setSae} /></div>
      <div class="contrast-sets">
        <label>Set A, one text per line (${lines(a).length})
          <textarea value=${a} onInput=${(e) => setA(e.target.value)} name="set-a" placeholder="Arr, the pirate ship sailed the seven seas."></textarea></label>
        <label>Set B, one text per line (${lines(b).length})
          <textarea value=${b} onInput=${(e) => setB(e.target.value)} name="set-b" placeholder="The train leaves the station at nine."></textarea></label>
      </div>
      <div class="row">
        <label class="inline">A text's value
          <select value=${aggregate} onChange=${(e) => setAggregate(e.target.value)} name="aggregate">
            <option value="max">max over its tokens</option><option value="mean">mean over its tokens</option>
          </select></label>
        <label class="inline">Features per side <input type="number" min="1" max="256" step="1" value=${topK} onInput=${(e) => setTopK(e.target.value)} name="contrast-top-k" /></label>
        <button type="submit" disabled=${act.busy || !sae || !lines(a).length || !lines(b).length}>Contrast</button>
      </div>
    </form>
    <${ErrorNote} error=${act.error} />
    ${act.busy ? html`<${Note}>Reading ${plural(lines(a).length + lines(b).length, "text")}…<//>` : null}
    ${result ? html`
      <p class="meta" role="status">A: ${plural(result.a.texts, "text")}, ${plural(result.a.tokens, "token")} · B: ${plural(result.b.texts, "text")}, ${plural(result.b.tokens, "token")} ·
        by each text's ${result.aggregate} · effect size is Cohen's d (∞: the feature tells every text of one set from every text of the other)</p>
      <div class="contrast-sides">
        <section aria-label="Favouring A"><h3>Favouring A</h3>${side(result.favouring_a, 1, "Favouring A")}</section>
        <section aria-label="Favouring B"><h3>Favouring B</h3>${side(result.favouring_b, -1, "Favouring B")}</section>
      </div>` : null}
  <//>`;
}

/** The Inspect tab: inspect above, contrast below, each the full width. */
export default function InspectView() {
  return html`<div class="wide"><${Inspect} /></div><div class="wide"><${Contrast} /></div><div class="wide"><${LensPanel} /></div><div class="wide"><${AttributionPanel} /></div>`;
}
