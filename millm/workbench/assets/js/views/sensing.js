// Sensing (docs/sensing.md): switch sensing on for a cluster or circuit, see what is armed now,
// and read the events every generation records: where a cluster's members fired together, where a
// circuit's edge was seen, each with the tokens around it (the span marked). New events arrive
// through the live feed while the view is open.

import { useEffect, useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, Panel, Table, html, num, plural, useAction, useLoad } from "../ui.js";

const KINDS = [
  ["cluster", "Clusters: co-activation", api.clusters],
  ["circuit", "Circuits: edges", api.circuits],
];

/** The tokens around an event, the span marked; fetched once (the feed carries no context). */
function Context({ kind, event }) {
  const [shown, setShown] = useState(event.context_parts ? event : null);
  const act = useAction();
  if (!shown) {
    return html`<button class="secondary" disabled=${act.busy}
      onClick=${() => act.run(async () => setShown(await api.sensing.event(kind, event.id)))}>Context</button>
      <${ErrorNote} error=${act.error} />`;
  }
  const parts = shown.context_parts;
  if (!parts) return html`<span class="meta">no context kept</span>`;
  return html`<span class="snippet">${parts.before}<mark>${parts.span}</mark>${parts.after}</span>`;
}

function Switches({ kind, book, status, onChange }) {
  const list = useLoad(() => book.list());
  const act = useAction();
  const on = new Set((status?.[kind === "cluster" ? "enabled_clusters" : "enabled_circuits"] || []).map((b) => b.id));
  const rows = list.value?.data || [];
  const flip = (row) => act.run(async () => {
    await (on.has(row.id) ? api.sensing.disable(kind, row.id) : api.sensing.enable(kind, row.id));
    onChange();
  });
  return html`<${Table} label=${`${kind} sensing switches`} rows=${rows} rowKey=${(r) => r.id}
      empty=${`No ${kind} imported yet (Profiles, clusters, circuits).`}
      columns=${[
        [kind === "cluster" ? "Cluster" : "Circuit", (r) => html`<strong>${r.name}</strong>${r.active ? html` <span class="badge good">active</span>` : null}`],
        ["Sensing", (r) => html`<button class=${on.has(r.id) ? "" : "secondary"} disabled=${act.busy}
          aria-label=${`${on.has(r.id) ? "Stop sensing" : "Sense"} ${r.name}`} onClick=${() => flip(r)}>${on.has(r.id) ? "On" : "Off"}</button>`],
      ]} />
    <${ErrorNote} error=${list.error || act.error} />`;
}

function Armed({ kind, status }) {
  if (!status) return null;
  if (!status.armed) {
    return html`<p class="note" role="status">Not armed${status.not_armed_reason ? `: ${status.not_armed_reason}` : ": no active "
      + kind + " with sensing on"}.</p>`;
  }
  if (kind === "cluster") {
    const said = `${plural(status.member_count, "member")}, ${status.sensable_count} sensable, quorum ${status.min_k} `
      + `(${status.threshold_mode.replace("_", " ")}), ±${status.context_tokens} tokens of context`;
    return html`<p class="note" role="status">Sensing <strong>${status.profile_name}</strong> at layer ${status.layer}: ${said}.</p>`;
  }
  const edges = `${plural(status.sensable_edges.length, "edge")} within ${status.max_token_lag} tokens`;
  return html`<p class="note" role="status">Sensing <strong>${status.circuit_name}</strong> on layers ${status.layers.join(", ")}: ${edges}.</p>
    ${status.unsensable_edges.length ? html`<${Table} label="Edges not sensed" rows=${status.unsensable_edges}
      columns=${[["Edge not sensed", (e) => html`<code>${e.edge_key}</code>`], ["Why", (e) => html`${e.reason}<div class="meta">${e.detail}</div>`]]} />` : null}`;
}

function Events({ kind, events }) {
  const columns = kind === "cluster"
    ? [
        ["Positions", (e) => html`${e.pos_start}–${e.pos_end}<div class="meta">${e.phase}${e.truncated ? " · truncated" : ""}</div>`],
        ["Members fired", (e) => e.fired_members.map(([index, peak]) => html`<span class="chip">#${index} ${num(peak, 3)}</span>`)],
        ["Score", (e) => num(e.score, 3)],
      ]
    : [
        ["Edge", (e) => html`<code>${e.edge_key}</code><div class="meta">${e.edge_rung_language}</div>`],
        ["Seen", (e) => html`${e.up.pos} → ${e.down.pos} (${plural(e.token_lag, "token")})<div class="meta">${e.phase}${e.truncated ? " · truncated" : ""}</div>`],
      ];
  return html`<${Table} label=${`${kind} sensing events`} rows=${events} rowKey=${(e) => e.id}
    empty="No event yet: chat with the model while it is armed."
    columns=${[...columns, ["Context", (e) => html`<${Context} kind=${kind} event=${e} />`], ["Request", (e) => html`<span class="meta">${e.request_id}</span>`]]} />`;
}

function KindPanel({ kind, title, book, fresh }) {
  const status = useLoad(() => api.sensing.status(kind));
  const events = useLoad(() => api.sensing.events(kind, { limit: 50 }));
  useEffect(() => { if (fresh) events.reload(); }, [fresh]);
  const refresh = () => { status.reload(); events.reload(); };
  return html`<${Panel} title=${title} actions=${html`<button class="secondary" onClick=${refresh}>Refresh</button>`}>
    <${Armed} kind=${kind} status=${status.value} />
    <${Switches} kind=${kind} book=${book} status=${status.value} onChange=${refresh} />
    <${ErrorNote} error=${status.error || events.error} />
    <${Events} kind=${kind} events=${events.value?.data || []} />
  <//>`;
}

export default function SensingView() {
  const [fresh, setFresh] = useState({ cluster: 0, circuit: 0 });
  useEffect(() => {
    const controller = new AbortController();
    api.sensing.watch((event) => setFresh((f) => ({ ...f, [event.kind]: f[event.kind] + 1 })), controller.signal).catch(() => {});
    return () => controller.abort();
  }, []);
  return html`<div>
    <p class="note">While a cluster or circuit with sensing on is the active base, every generation records where its
      members fire together, or where its edges are seen (docs/sensing.md).</p>
    ${KINDS.map(([kind, title, book]) => html`<${KindPanel} key=${kind} kind=${kind} title=${title} book=${book} fresh=${fresh[kind]} />`)}
  </div>`;
}
