// Attribution graphs (POST /api/attribution), a panel of the Inspect view: prompt tokens along the
// bottom, the SAEs' blocks up the side, the explained logit at the top; nodes sized by influence,
// edges drawn by weight (blue adds to its target, orange takes away). Click a node for its card;
// pick features (by node; a feature picked at one position is steered at every one) to ablate
// and see the unsteered model's next token move (the graph's own base, whatever is live now).
// Transcoder features are drawn but not steered. The features come from the attached SAEs or from
// a registered transcoder set (the exact kind).

import { useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, FeatureLink, FileImport, JobProgress, Note, Panel, download, html, num, plural, useAction, useLoad } from "../ui.js";

const WIDTH = 960;
const ROW = 110;
const EDGES_DRAWN = 160;
const PER_CELL = 10; // feature nodes drawn in one (block, token) cell, the most influential

const shown = (token) => (/^\s*$/.test(token) ? token.replace(/ /g, "·").replace(/\n/g, "↵") || "∅" : token.replace(/\n/g, "↵"));
/** Node radius: the most influential (smallest cumulative share) are the largest. */
const radius = (node) => (node.kind === "target" ? 8 : 3 + 9 * Math.max(0, 1 - node.influence));

/** A transcoder set as the source picker names it: its folder, blocks and width. */
const setName = (set) => `${set.kind === "cross_layer_transcoder" ? "cross-layer transcoder" : "transcoders"} ${set.path.split("/").filter(Boolean).pop()} (${set.layers.length} blocks × ${set.d_transcoder})`;

function layout(graph) {
  const layers = [...new Set(graph.nodes.map((n) => n.layer))].sort((a, b) => a - b);
  const height = ROW * (layers.length - 1) + 70;
  const left = 70;
  const column = (WIDTH - left - 10) / graph.tokens.length;
  const y = (layer) => height - 40 - ROW * layers.indexOf(layer);
  const cells = new Map();
  for (const node of [...graph.nodes].sort((a, b) => a.influence - b.influence)) {
    const key = `${node.layer}:${node.position}`;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(node);
  }
  const at = new Map();
  for (const nodes of cells.values()) {
    const kept = nodes.slice(0, PER_CELL);
    kept.forEach((node, i) => {
      const spread = kept.length > 1 ? (i / (kept.length - 1) - 0.5) * column * 0.8 : 0;
      at.set(node.id, { x: left + column * (node.position + 0.5) + spread, y: y(node.layer) - (i % 2) * 14 });
    });
  }
  return { layers, height, left, y, at };
}

function GraphPicture({ graph, chosen, onChoose }) {
  const { layers, height, y, at } = layout(graph);
  const edges = graph.edges.filter((e) => at.has(e.source) && at.has(e.target)).slice(0, EDGES_DRAWN);
  const strongest = Math.max(1e-9, ...edges.map((e) => Math.abs(e.weight)));
  const name = (layer) => (layer === -1 ? "tokens" : layer === Math.max(...layers) ? "logit" : `block ${layer}`);
  return html`<svg class="attribution-graph" viewBox=${`0 0 ${WIDTH} ${height}`} role="img" aria-label="Attribution graph">
    ${layers.map((layer) => html`<g key=${`l${layer}`}><line x1="60" x2=${WIDTH} y1=${y(layer)} y2=${y(layer)} class="rule" />
      <text x="4" y=${y(layer) + 4} class="axis">${name(layer)}</text></g>`)}
    ${edges.map((e) => {
      const a = at.get(e.source), b = at.get(e.target);
      return html`<line key=${`${e.source}>${e.target}`} x1=${a.x} y1=${a.y} x2=${b.x} y2=${b.y}
        class=${e.weight > 0 ? "edge up" : "edge down"} stroke-width=${(0.4 + 3.2 * Math.abs(e.weight) / strongest).toFixed(2)} />`;
    })}
    ${graph.nodes.filter((n) => at.has(n.id)).map((n) => {
      const p = at.get(n.id);
      const picked = chosen?.id === n.id;
      if (n.kind === "token") {
        return html`<text key=${n.id} x=${p.x} y=${p.y + 22} class="token" text-anchor="middle" onClick=${() => onChoose(n)}>${shown(n.token)}</text>`;
      }
      const title = n.kind === "feature" ? `#${n.feature} ${n.label || ""}` : n.kind === "error" ? "error (what the SAE misses)" : n.token;
      return html`<circle key=${n.id} cx=${p.x} cy=${p.y} r=${radius(n)} class=${`node ${n.kind}${picked ? " picked" : ""}`}
        data-node=${n.id} onClick=${() => onChoose(n)}><title>${title}</title></circle>`;
    })}
  </svg>`;
}

/** The SAE a feature node steers as: its own, or for a transcoder set's feature its block's file once attached. */
const steeredBy = (node, steerAs) => (node.sae_id?.includes("/") ? steerAs.get(node.sae_id) : node.sae_id);

/** Register and attach the block's transcoder file of a set's feature node as an SAE; its id. */
async function attachBlock(node, sets) {
  const [setId, block] = node.sae_id.split("/");
  const found = sets.find((s) => s.id === setId);
  if (!found) throw new Error(`transcoder set ${setId} is no longer registered`);
  const registered = await api.saes.register({ path: found.files[Number(block)] });
  await api.saes.attach(registered.id);
  return registered.id;
}

function NodeCard({ node, graph, ablate, onToggle, steerAs, onAttach, busy }) {
  if (!node) return html`<p class="note">Click a node for its card.</p>`;
  const into = graph.edges.filter((e) => e.target === node.id).slice(0, 5);
  const out = graph.edges.filter((e) => e.source === node.id).slice(0, 5);
  const named = (id) => {
    const n = graph.nodes.find((m) => m.id === id);
    return n?.kind === "feature" ? `#${n.feature} ${n.label || ""} @${shown(graph.tokens[n.position].token)}` : n ? `${n.kind} ${shown(n.token || "")} @${n.position}` : id;
  };
  return html`<div class="node-card" aria-label="Node">
    <p><strong>${node.kind}</strong> · ${node.kind === "token" ? "embedding" : `block ${node.layer}`} · position ${node.position} (${shown(graph.tokens[node.position]?.token ?? "")})</p>
    ${node.kind === "feature" ? html`<p>${steeredBy(node, steerAs) ? html`<${FeatureLink} sae=${steeredBy(node, steerAs)} index=${node.feature}>${node.label || ""}<//>`
        : html`<strong>#${node.feature}</strong> ${node.label || ""}`}${node.site === "mlp" ? html` <span class="meta">(transcoder, block ${node.layer})</span>` : null} · activation ${num(node.activation, 3)}</p>
      ${steeredBy(node, steerAs) ? html`<label class="inline"><input type="checkbox" checked=${ablate.has(node.id)} onChange=${() => onToggle(node)} /> ablate this feature</label>`
        : html`<button type="button" disabled=${busy} onClick=${() => onAttach(node)}>Attach block ${node.layer}'s transcoder to steer it</button>`}` : null}
    <p class="meta">cumulative influence ${num(node.influence, 3)}</p>
    ${into.length ? html`<p>from: ${into.map((e) => html`<span class="pill">${named(e.source)} ${num(e.weight, 2)}</span>`)}</p>` : null}
    ${out.length ? html`<p>to: ${out.map((e) => html`<span class="pill">${named(e.target)} ${num(e.weight, 2)}</span>`)}</p>` : null}
  </div>`;
}

/** The chosen nodes' features, one entry per SAE, as a request's `steering` that ablates them. */
function ablating(graph, ids, steerAs) {
  const bySae = new Map();
  for (const node of graph.nodes.filter((n) => ids.includes(n.id))) {
    const sae = steeredBy(node, steerAs);
    if (!bySae.has(sae)) bySae.set(sae, new Set());
    bySae.get(sae).add(node.feature);
  }
  return { steering: [...bySae].map(([sae_id, features]) => ({ sae_id, features: [...features].map((index) => ({ index, op: "ablate" })) })) };
}

/** The next token's top candidates and a short continuation on the unsteered model, with the chosen
 * nodes' features ablated or not. Both requests carry their own `steering`, which replaces the live
 * steering a /v1 request would otherwise get (docs/steering.md): an empty one is the unsteered
 * model, the one the graph was traced on, whatever is live now. */
async function nextTokens(graph, text, ids, steerAs) {
  const steering = ids.length ? ablating(graph, ids, steerAs) : { steering: [] };
  const answer = await api.completion({ model: graph.model, prompt: text, max_tokens: 6, temperature: 0, logprobs: 5, steering });
  const top = answer.choices[0].logprobs.top_logprobs[0];
  return { text: answer.choices[0].text, top: Object.entries(top).sort((a, b) => b[1] - a[1]) };
}

/** The ticked features saved as a profile that ablates them, or as a miStudio circuit at one
 * strength (POST /api/attribution/{id}/profile, /circuit). */
function SaveSubgraph({ graph, ablate }) {
  const [name, setName] = useState("graph-path");
  const [strength, setStrength] = useState(20);
  const [saved, setSaved] = useState(null);
  const act = useAction();
  const nodes = [...ablate];
  const off = act.busy || !nodes.length || graph.method === "imported";
  const profile = () => act.run(async () => setSaved(["profile", await api.attribution.profile(graph.id, { name, nodes })]));
  const circuit = () => act.run(async () => setSaved(["circuit", await api.attribution.circuit(graph.id, { name, nodes, strength: Number(strength) })]));
  return html`<div class="row">
    <label>Name <input value=${name} onInput=${(e) => setName(e.target.value)} aria-label="Profile or circuit name" /></label>
    <button type="button" onClick=${profile} disabled=${off}>Save as a profile that ablates them</button>
    <label>Strength <input type="number" min="-300" max="300" value=${strength} onInput=${(e) => setStrength(e.target.value)} aria-label="Circuit strength" /></label>
    <button type="button" onClick=${circuit} disabled=${off}>Save as a circuit</button>
    <${ErrorNote} error=${act.error} />
    ${saved ? html`<${Note}>Saved ${saved[0]} ${saved[1].name}: activate it under Profiles, clusters, circuits to steer every request.<//>` : null}
  </div>`;
}

function Ablation({ graph, text, ablate, steerAs }) {
  const [result, setResult] = useState(null);
  const act = useAction();
  const features = [...ablate];
  if (graph.method === "imported") return html`<${Note}>An imported graph: its features are not this server's to ablate.<//>`;
  // The page rebuilds only the unsteered base: a steered graph's ablations would compare unlike things.
  if (graph.steered) {
    return html`<div class="ablation"><${Note}>This graph was traced steered (${graph.steering.kind}); the page ablates on the unsteered model
      only, so it does not generate beside it.<//><${SaveSubgraph} graph=${graph} ablate=${ablate} /></div>`;
  }
  const run = () => act.run(async () => setResult({ before: await nextTokens(graph, text, [], steerAs), after: await nextTokens(graph, text, features, steerAs), count: features.length }));
  const side = (label, base, r) => html`<section aria-label=${`Next tokens ${label}`}><h4>${label}</h4><p class="meta">${base}</p>
    <p class="continuation">${JSON.stringify(r.text)}</p>
    <ol>${r.top.map(([token, lp]) => html`<li>${shown(token)} <span class="num">${num(Math.exp(lp), 3)}</span></li>`)}</ol></section>`;
  return html`<div class="ablation">
    <button type="button" onClick=${run} disabled=${act.busy || !features.length}>Ablate ${plural(features.length, "feature")} (every position) and generate</button>
    ${act.busy ? html`<${Note}>Generating on the unsteered model, without and with ${plural(features.length, "feature")} ablated…<//>` : null}
    <${ErrorNote} error=${act.error} />
    <${SaveSubgraph} graph=${graph} ablate=${ablate} />
    ${result ? html`<p class="meta">Both sides run on the unsteered model, as the graph was traced: live steering, which every /v1 client gets, does not apply to them.</p>
      <div class="cols">${side("unsteered", "unsteered, as the graph was traced", result.before)}${side("ablated", `${plural(result.count, "feature")} ablated, on the unsteered model`, result.after)}</div>` : null}
  </div>`;
}

export default function AttributionPanel() {
  const [text, setText] = useState("The capital of France is");
  const [nodes, setNodes] = useState(64);
  const [source, setSource] = useState("");
  const [steps, setSteps] = useState("0");
  const sets = useLoad(() => api.transcoders.list(), []);
  const [graph, setGraph] = useState(null);
  const [tracing, setTracing] = useState(""); // the text of the trace under way
  const [traced, setTraced] = useState(""); // the shown graph's text: what its ablations read
  const [job, setJob] = useState(null);
  const [chosen, setChosen] = useState(null);
  const [ablate, setAblate] = useState(new Set());
  const [steerAs, setSteerAs] = useState(new Map());
  const act = useAction();
  const attach = (node) => act.run(async () => setSteerAs(new Map(steerAs).set(node.sae_id, await attachBlock(node, sets.value?.data ?? []))));
  // Traced as a job: its features expanded are its progress, and Cancel stops it.
  const run = (e) => {
    e.preventDefault();
    act.run(async () => {
      const from = source ? { transcoders: source } : {};
      const integrated = Number(steps) ? { integrated_gradients: Number(steps) } : {};
      const started = await api.attribution.start({ text, max_feature_nodes: Number(nodes), ...from, ...integrated });
      setTracing(text);
      setJob(started);
    });
  };
  const ended = (done) => act.run(async () => {
    setJob(done);
    if (done.state !== "succeeded") return;
    setGraph(await api.attribution.get(done.result.graph_id));
    setTraced(tracing);
    setChosen(null);
    setAblate(new Set());
  });
  const running = job?.state === "running";
  const toggle = (node) => {
    const next = new Set(ablate);
    next.has(node.id) ? next.delete(node.id) : next.add(node.id);
    setAblate(next);
  };
  const check = graph?.verification;
  return html`<${Panel} title="Attribution graph">
    <p class="note">Which features drove the model's next token, from the attached SAEs or a transcoder set (one on every
      block replaces the MLPs: the exact kind). Each edge is a direct effect, each node sized by its influence on the logit;
      the top features are ablated on the served model to check the graph.</p>
    <form class="row" onSubmit=${run} aria-label="Attribution graph">
      <label class="grow">Text <input value=${text} onInput=${(e) => setText(e.target.value)} name="graph-text" /></label>
      <label>Features from <select value=${source} onChange=${(e) => setSource(e.target.value)} aria-label="Feature source">
        <option value="">attached SAEs</option>
        ${(sets.value?.data ?? []).filter((s) => !s.error).map((s) => html`<option value=${s.id}>${setName(s)}</option>`)}
      </select></label>
      <label>Features <input type="number" min="1" max="1024" value=${nodes} onInput=${(e) => setNodes(e.target.value)} aria-label="Features expanded" /></label>
      <label title="SAE graphs: the gradient at the prompt (gradient × activation), or averaged along each source's path (integrated gradients; slower)">Gradients <select value=${steps} onChange=${(e) => setSteps(e.target.value)} aria-label="Gradients">
        <option value="0">at the prompt</option>
        <option value="8">integrated, 8 steps</option>
        <option value="16">integrated, 16 steps</option>
      </select></label>
      <button type="submit" disabled=${act.busy || running || !text.trim()}>${running ? "Tracing…" : "Trace"}</button>
      <${FileImport} label="Open a graph file" onText=${(t) => act.run(async () => { setGraph(await api.attribution.importText(t)); setChosen(null); setAblate(new Set()); })} />
    </form>
    <${ErrorNote} error=${act.error} />
    ${job ? html`<${JobProgress} key=${job.id} job=${job} label="Attribution job" onEnd=${ended} />` : null}
    ${graph ? html`<p class="meta" aria-label="Graph summary">${`${shown(graph.target.tokens[0])} (p ${num(graph.target.probability, 3)}) · ${graph.method} · ${graph.method === "imported" ? "" : graph.steered ? `traced steered (${graph.steering.kind}) · ` : "traced unsteered · "}`}
        ${graph.method === "imported" ? `${plural(graph.expanded_features, "feature")} · ` : `${plural(graph.expanded_features, "feature")} expanded · replacement ${num(graph.replacement_score, 2)} · completeness ${num(graph.completeness_score, 2)} · `}
        ${check ? html`check <strong class=${check.passed ? "ok" : "bad"}>${check.passed ? "passed" : "failed"}</strong>${` (r ${check.correlation === null ? "—" : num(check.correlation, 2)} over ${plural(check.nodes.length, "ablation")}) · `}` : "not checked · "}
        ${`${num(graph.seconds, 1)} s `}
        <button type="button" onClick=${async () => download(await api.attribution.exportText(graph.id), `${graph.id}.json`)}>export (circuit-tracer JSON)</button></p>
      <div class="graph-with-card"><${GraphPicture} graph=${graph} chosen=${chosen} onChoose=${setChosen} />
        <${NodeCard} node=${chosen} graph=${graph} ablate=${ablate} onToggle=${toggle} steerAs=${steerAs} onAttach=${attach} busy=${act.busy} /></div>
      <${Ablation} graph=${graph} text=${traced} ablate=${ablate} steerAs=${steerAs} />` : null}
  <//>`;
}
