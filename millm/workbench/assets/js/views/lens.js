// The logit lens (POST /api/lens), a panel of the Inspect view: what each block's residual would
// predict at each position, as a grid (blocks up the side, the last at the top; tokens along the
// bottom), each cell the block's top token, shaded by a probability the user picks.

import { useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, Panel, html, num, plural, useAction } from "../ui.js";

const SHADES = [
  ["final_probability", "the probability of the model's final prediction"],
  ["top", "the top token's own probability"],
];

/** A token with its white space made visible. */
const shown = (token) => (/^\s*$/.test(token) ? token.replace(/ /g, "·").replace(/\n/g, "↵") || "∅" : token.replace(/\n/g, "↵"));

function Grid({ lens, shade }) {
  const layers = [...lens.layers].reverse();
  const cell = (prediction, layer) => prediction.layers.find((c) => c.layer === layer);
  const value = (c) => (shade === "top" ? c.top[0].probability : c.final_probability);
  return html`<div class="table-wrap lens"><table aria-label="Logit lens">
    <thead><tr><th scope="col">block</th>${lens.predictions.map((p) => html`<th scope="col" title=${`position ${p.position}`}>${shown(lens.tokens[p.position].token)}</th>`)}</tr></thead>
    <tbody>
      <tr><th scope="row">model</th>${lens.predictions.map((p) => html`<td class="final" title=${`${num(p.final.probability, 3)}`}>${shown(p.final.token)}</td>`)}</tr>
      ${layers.map((layer) => html`<tr key=${layer}><th scope="row">${layer}</th>
        ${lens.predictions.map((p) => {
          const c = cell(p, layer);
          const alpha = Math.max(0, Math.min(1, value(c)));
          return html`<td style=${{ backgroundColor: `rgba(31, 95, 191, ${(0.85 * alpha).toFixed(3)})`, color: alpha > 0.5 ? "#fff" : "inherit" }}
            title=${c.top.map((t) => `${JSON.stringify(t.token)} ${num(t.probability, 3)}`).join("\n") + `\nfinal prediction: ${num(c.final_probability, 3)}`}>${shown(c.top[0].token)}</td>`;
        })}</tr>`)}
    </tbody></table></div>`;
}

export default function LensPanel() {
  const [text, setText] = useState("The capital of France is");
  const [positions, setPositions] = useState("all");
  const [steering, setSteering] = useState("none");
  const [shade, setShade] = useState("final_probability");
  const [lens, setLens] = useState(null);
  const act = useAction();
  const run = (e) => {
    e.preventDefault();
    const body = { text, positions, top_k: 3, ...(steering === "live" ? { steering: "live" } : {}) };
    act.run(async () => setLens(await api.lens(body)));
  };
  return html`<${Panel} title="Logit lens">
    <p class="note">Each block's residual stream through the model's final norm and output head: what the model would
      predict if it stopped there. The top row is the model's own prediction.</p>
    <form class="row" onSubmit=${run} aria-label="Logit lens">
      <label class="grow">Text <input value=${text} onInput=${(e) => setText(e.target.value)} name="lens-text" /></label>
      <label>Positions <select value=${positions} onChange=${(e) => setPositions(e.target.value)} aria-label="Positions">
        <option value="all">every token</option><option value="last">the last token</option></select></label>
      <label>Read <select value=${steering} onChange=${(e) => setSteering(e.target.value)} aria-label="Read the model">
        <option value="none">unsteered</option><option value="live">live (what /v1 gets now)</option></select></label>
      <button type="submit" disabled=${act.busy || !text.trim()}>Read</button>
    </form>
    <${ErrorNote} error=${act.error} />
    ${lens ? html`<label>Shade by <select value=${shade} onChange=${(e) => setShade(e.target.value)} aria-label="Shade by">
        ${SHADES.map(([key, label]) => html`<option value=${key}>${label}</option>`)}</select></label>
      <p class="meta">${lens.model} · ${lens.steered ? `steered (${lens.steering.kind})` : "unsteered"} · ${plural(lens.layers.length, "block")}</p>
      <${Grid} lens=${lens} shade=${shade} />` : null}
  <//>`;
}
