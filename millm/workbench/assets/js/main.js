// The workbench shell: the header (model state, key), the bar saying what steers /v1 now, the
// tabs, and the server and live-steering contexts the views share. Each tab is one module under
// views/; routes are hash fragments (#/features/sae/1403).

import { render } from "preact";
import { useCallback, useEffect, useState } from "preact/hooks";
import * as api from "./api.js";
import { ErrorNote, ServerContext, html } from "./ui.js";
import { LiveBar, LiveContext, useLiveSteering } from "./live.js";
import ChatView from "./views/chat.js";
import FeaturesView from "./views/features.js";
import InspectView from "./views/inspect.js";
import DocumentsView from "./views/documents.js";
import ProbesView from "./views/probes.js";
import MonitoringView from "./views/monitoring.js";
import SensingView from "./views/sensing.js";
import DictionariesView from "./views/dictionaries.js";
import SystemView from "./views/system.js";
import EvaluateView from "./views/evaluate.js";
import BatchesView from "./views/batches.js";

const TABS = [
  ["chat", "Chat & compare", ChatView],
  ["features", "Features", FeaturesView],
  ["inspect", "Inspect", InspectView],
  ["documents", "Profiles, clusters, circuits", DocumentsView],
  ["probes", "Probes", ProbesView],
  ["monitoring", "Monitoring", MonitoringView],
  ["sensing", "Sensing", SensingView],
  ["evaluate", "Evaluate", EvaluateView],
  ["dictionaries", "Dictionaries", DictionariesView],
  ["batches", "Batches", BatchesView],
  ["system", "Models, SAEs & jobs", SystemView],
];

function useRoute() {
  const parse = () => {
    const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
    return { tab: TABS.some(([id]) => id === parts[0]) ? parts[0] : "chat", args: parts.slice(1) };
  };
  const [route, setRoute] = useState(parse);
  useEffect(() => {
    const update = () => setRoute(parse());
    addEventListener("hashchange", update);
    return () => removeEventListener("hashchange", update);
  }, []);
  return route;
}

/** Polls readiness, the served model and the SAEs: what every view needs to know. */
function useServerState() {
  const [state, setState] = useState({ ready: false, model: null, saes: [], attached: [], error: null, loaded: false });
  const refresh = useCallback(async () => {
    try {
      const [ready, served, saes] = await Promise.all([api.health.ready(), api.models.served(), api.saes.list()]);
      const list = saes.data || [];
      setState({
        ready: ready.status === "ready",
        status: ready.status,
        model: ready.model || served.data?.[0]?.id || null,
        saes: list,
        attached: list.filter((s) => s.attached),
        error: null,
        loaded: true,
      });
    } catch (error) {
      setState((s) => ({ ...s, error, loaded: true }));
    }
  }, []);
  useEffect(() => {
    refresh();
    const timer = setInterval(refresh, 10000);
    return () => clearInterval(timer);
  }, [refresh]);
  return { ...state, refresh };
}

function KeyForm({ refusal, onSaved }) {
  const [value, setValue] = useState(api.key.get());
  const save = (event) => {
    event.preventDefault();
    api.key.set(value.trim());
    onSaved();
  };
  return html`<form class="keyform" onSubmit=${save} aria-label="API key">
    ${refusal ? html`<p class="error" role="alert">${refusal.status} ${refusal.code}: ${refusal.message}</p>` : null}
    <label>Key for this server (kept in this tab only)
      <input type="password" autocomplete="off" value=${value} onInput=${(e) => setValue(e.target.value)} name="key" /></label>
    <button type="submit">Use key</button>
    ${api.key.get() ? html`<button type="button" onClick=${() => { api.key.set(""); setValue(""); onSaved(); }}>Forget key</button>` : null}
  </form>`;
}

function App() {
  const route = useRoute();
  const server = useServerState();
  const live = useLiveSteering();
  const [refusal, setRefusal] = useState(null);
  const [showKey, setShowKey] = useState(false);
  const [generation, setGeneration] = useState(0); // remounts the view after a new key
  useEffect(() => api.onRefused((error) => { setRefusal(error); setShowKey(true); }), []);
  const keySaved = () => {
    setRefusal(null);
    setShowKey(false);
    setGeneration((g) => g + 1);
    server.refresh();
    live.load();
  };
  const [, , View] = TABS.find(([id]) => id === route.tab);
  return html`<${ServerContext.Provider} value=${server}><${LiveContext.Provider} value=${live}>
    <header class="top">
      <a class="brand" href="#/chat">millm workbench</a>
      <span class=${`state ${server.ready ? "ok" : "wait"}`} role="status" aria-label="Model state">
        ${server.model || "no model"} · ${server.status || "…"}
        ${server.attached.length ? ` · SAE ${server.attached.map((s) => `${s.id}@${s.attached_layer}`).join(", ")}` : " · no SAE attached"}
      </span>
      <button class="keybutton" onClick=${() => setShowKey(!showKey)} aria-expanded=${showKey}>${api.key.get() ? "Key ✓" : "Key"}</button>
    </header>
    ${showKey ? html`<${KeyForm} refusal=${refusal} onSaved=${keySaved} />` : null}
    <${LiveBar} />
    <${ErrorNote} error=${server.error && !server.error.refused ? server.error : null} />
    <nav class="tabs" aria-label="Views">
      ${TABS.map(([id, title]) => html`<a href=${`#/${id}`} aria-current=${route.tab === id ? "page" : undefined}>${title}</a>`)}
    </nav>
    <main id="view" key=${`${route.tab}-${generation}`}><${View} args=${route.args} /></main>
  <//><//>`;
}

const root = document.getElementById("app");
root.textContent = ""; // the "Loading…" line
render(html`<${App} />`, root);
