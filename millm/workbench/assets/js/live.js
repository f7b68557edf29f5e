// What steers every /v1 request now (GET /api/steering), shared by the shell and the views: the bar
// under the header on every tab, the Features view's card slider and live table, the chat's compare
// column. A slider changes what every client gets, so the page must not let it go unnoticed: the
// state is refreshed after each change the page makes and polled (another client may change it).

import { createContext } from "preact";
import { useCallback, useContext, useEffect, useRef, useState } from "preact/hooks";
import * as api from "./api.js";
import { ErrorNote, FeatureLink, html, num, useAction, useLabels } from "./ui.js";

const POLL_MS = 5000;
const AFTER_CHANGE_MS = 150; // the calls of one action (deactivate, then clear) make one refresh
const PLURAL = { profile: "profiles", cluster: "clusters", circuit: "circuits" };

/** The live steering state, `load()` to refresh it, `apply(call)` to make a change and keep the state it answers. */
export const LiveContext = createContext({ state: null, error: null, load: async () => {}, apply: async (call) => call() });
export const useLive = () => useContext(LiveContext);

/** The shell's copy of GET /api/steering, refreshed after the page's changes and every few seconds. */
export function useLiveSteering() {
  const [state, setState] = useState(null);
  const [error, setError] = useState(null);
  const last = useRef("");
  const keep = useCallback((value) => {
    const text = JSON.stringify(value);
    if (text !== last.current) { last.current = text; setState(value); } // an unchanged poll re-renders nothing
  }, []);
  const load = useCallback(async () => {
    try {
      keep(await api.steering.get());
      setError(null);
    } catch (err) {
      setError(err);
    }
  }, [keep]);
  useEffect(() => {
    load();
    const timer = setInterval(load, POLL_MS);
    let soon = null;
    const off = api.onChange(() => { clearTimeout(soon); soon = setTimeout(load, AFTER_CHANGE_MS); });
    return () => { clearInterval(timer); clearTimeout(soon); off(); };
  }, [load]);
  const apply = useCallback(async (call) => {
    const answer = await call();
    if (answer?.steering) keep(answer.steering);
    else await load();
    return answer;
  }, [keep, load]);
  return { state, error, load, apply };
}

/** A feature's op as the page writes it: +43, -5, clamp 3, cap 5, ablate. */
export function opText(f) {
  if (f.op === "add") return `${f.strength >= 0 ? "+" : ""}${num(f.strength)}`;
  return f.op === "ablate" ? "ablate" : `${f.op} ${num(f.value)}`;
}

/** Every live feature of a steering state as {sae, index, op, strength | value, attached}. */
export const liveRows = (state) => (state?.saes || []).flatMap((s) => s.features.map((f) => ({ ...f, sae: s.sae_id, attached: s.attached })));

/** Live features as chips: a link to the card, the op and, once the SAE's labels arrive, the label. */
function SaeFeatures({ sae, features }) {
  const labels = useLabels(sae);
  return features.map((f) => html`<span class="chip live-feature" key=${`${sae}:${f.index}`}><${FeatureLink} sae=${sae} index=${f.index} /> ${opText(f)}${
    labels[f.index] ? html` <span class="live-label">${labels[f.index]}</span>` : null}${f.attached === false ? " (not attached)" : ""}</span> `);
}

/** The live features of `rows`, grouped by SAE so each SAE's labels are fetched once. */
export function LiveFeatures({ rows }) {
  const saes = [...new Set(rows.map((r) => r.sae))];
  return saes.map((sae) => html`<${SaeFeatures} key=${sae} sae=${sae} features=${rows.filter((r) => r.sae === sae)} />`);
}

/** What the bar says steers every /v1 request now, and whether there is anything to clear. */
function summary(state, rows) {
  if (!state.enabled) {
    const kept = rows.length ? ` (${rows.length === 1 ? "1 live value is" : `${rows.length} live values are`} kept)` : "";
    return [html`Steering is disabled: /v1 requests are unsteered${kept}.`, rows.length > 0];
  }
  const base = state.active_base;
  if (base) {
    const problem = base.fits === false ? html` — it no longer fits the attached SAEs, so steered requests are refused` : null;
    return [html`Every /v1 request is steered by ${base.kind} <strong>${base.name}</strong>${problem}.`, true];
  }
  if (!rows.length) return [html`Nothing steers /v1 requests: they are unsteered.`, false];
  return [html`Every /v1 request is steered live: <${LiveFeatures} rows=${rows} />`, true];
}

/** The bar on every tab: what every /v1 client gets now, and Clear (deactivate the base, remove the live values). */
export function LiveBar() {
  const live = useLive();
  const act = useAction();
  const state = live.state;
  const rows = liveRows(state);
  const clear = () => act.run(async () => {
    if (state.active_base) await api[PLURAL[state.active_base.kind]].deactivate();
    if (rows.length) await live.apply(() => api.steering.clear());
    else await live.load();
  });
  if (!state) return live.error ? html`<div class="livebar"><${ErrorNote} error=${live.error} /></div>` : null;
  const [text, clearable] = summary(state, rows);
  return html`<section class=${`livebar${clearable ? " steering" : ""}`} aria-label="What /v1 gets now">
    <span class="livebar-text" role="status">${text}</span>
    ${clearable ? html`<button class="secondary" disabled=${act.busy} onClick=${clear}
      title="Deactivate the active profile, cluster or circuit and remove every live value: /v1 requests are then unsteered">Clear</button>` : null}
    <${ErrorNote} error=${act.error || live.error} />
  </section>`;
}
