// The answers of the Chat & compare view: a chat answer with the X-miLLM-* headers millm sent, its
// finish and token counts and its probe verdicts (where each probe fired); a comparison's answers
// side by side, each with the steering it was given.

import { ErrorNote, FeatureLink, Table, html, num, plural } from "../ui.js";
import { opText } from "../live.js";

// The headers docs/openai-api.md, docs/clusters-circuits.md and docs/request-policy.md describe,
// shown on every answer, absent ones included: "not sent" is itself an answer (no seed, no circuit).
export const HEADERS = ["X-miLLM-Steering", "X-miLLM-Steering-Intensity", "X-miLLM-Circuit-Rung", "X-miLLM-Ignored-Fields", "X-miLLM-Seed"];
const ABSENT = {
  "X-miLLM-Steering-Intensity": "not sent (no dial changed the steering)",
  "X-miLLM-Circuit-Rung": "not sent (no circuit steered in full)",
  "X-miLLM-Ignored-Fields": "not sent (every field was used)",
  "X-miLLM-Seed": "not sent (no seed)",
};
/** Name/value rows as a small table (rows are found by their name, values read as text). */
const KeyValues = ({ label, rows }) => html`<table class="kv" aria-label=${label}><tbody>
  ${rows.map(([name, value, absent]) => html`<tr class=${absent ? "absent" : ""}><th scope="row">${name}</th><td>${value}</td></tr>`)}
</tbody></table>`;

function HeaderList({ headers }) {
  if (!headers) return null;
  const extra = Object.keys(headers).filter((name) => !HEADERS.includes(name));
  return html`<${KeyValues} label="Response headers"
    rows=${[...HEADERS, ...extra].map((name) => [name, headers[name] ?? ABSENT[name] ?? "not sent", headers[name] === undefined])} />`;
}

const quoted = (text) => JSON.stringify(text);

/** Where an absolute position lies: in the prompt, or the answer's n-th token. */
function place(position, promptTokens) {
  if (promptTokens === undefined) return `position ${position}`;
  return position < promptTokens ? `position ${position} (prompt)` : `position ${position} (answer token ${position - promptTokens + 1})`;
}

function Where({ verdict, promptTokens }) {
  if (!verdict.fired) return html`<span class="note">—</span>`;
  const hits = (verdict.positions || []).map((p, i) => ({ position: p, text: verdict.tokens?.[i]?.text }));
  const shown = hits.slice(0, 8);
  return html`<ul class="hits">${shown.map((h) => html`<li>${place(h.position, promptTokens)}${h.text !== undefined ? html` <code>${quoted(h.text)}</code>` : null}</li>`)}
    ${hits.length > shown.length ? html`<li class="note">and ${hits.length - shown.length} more</li>` : null}</ul>
    ${verdict.acted_at != null ? html`<div class="meta">${verdict.action === "abort" ? "ended the answer" : "steered from"} at ${place(verdict.acted_at, promptTokens)}</div>` : null}`;
}

function ProbeVerdicts({ meta }) {
  const verdicts = meta.probes;
  const prompt = meta.usage?.prompt_tokens;
  if (!verdicts?.length) {
    if (meta.pending || meta.stopped || meta.error) return null;
    return html`<p class="meta">No probe watched this answer (none active, none chosen in Settings).</p>`;
  }
  return html`<${Table} label="Probe verdicts" rows=${verdicts} rowKey=${(v, i) => `${v.name}-${v.action}-${i}`}
    columns=${[
      ["Probe", (v) => html`<strong>${v.name}</strong> <span class="badge">${v.source}</span>`],
      ["Action", (v) => v.action],
      ["Fired", (v) => (v.fired ? html`<span class="badge bad">fired</span>` : html`<span class="badge">no</span>`)],
      ["Where", (v) => html`<${Where} verdict=${v} promptTokens=${prompt} />`],
      ["Peak / threshold", (v) => html`<span class="mono">${num(v.peak)} / ${num(v.threshold)}</span>${v.peak_position != null ? html`<div class="meta">peak at ${v.peak_position}</div>` : null}`],
    ]} />`;
}

// The prompt tokens the server's prefix cache supplied (usage.prompt_tokens_details.cached_tokens), when any.
function cachedNote(usage) {
  const cached = usage.prompt_tokens_details?.cached_tokens;
  return cached ? ` (${cached} cached)` : "";
}

function Finish({ meta }) {
  if (meta.pending) return null;
  if (meta.stopped) return html`<p class="meta stopped">Stopped: the stream was aborted here; the text so far is kept.</p>`;
  if (!meta.finish_reason) return null;
  const usage = meta.usage ? ` · ${meta.usage.prompt_tokens} prompt${cachedNote(meta.usage)} + ${meta.usage.completion_tokens} completion tokens` : "";
  if (meta.finish_reason === "content_filter") {
    const by = (meta.probes || []).find((v) => v.action === "abort" && v.acted_at != null);
    return html`<p class="aborted" role="note"><strong>finish_reason: content_filter</strong> — ended by the abort probe
      ${by ? html` <strong>${by.name}</strong> at ${place(by.acted_at, meta.usage?.prompt_tokens)}${by.tokens?.[0] ? html` on <code>${quoted(by.tokens[0].text)}</code>` : null}` : null}${usage}</p>`;
  }
  return html`<p class="meta">finish_reason: ${meta.finish_reason}${usage}</p>`;
}

export function ChatAnswer({ n, entry }) {
  const { meta } = entry;
  return html`<article class="answer chat-answer" aria-label=${`Answer ${n}`} aria-busy=${meta?.pending ? "true" : "false"}>
    <h3>Answer ${n}${meta?.steeredBy ? html` <span class="meta">· steered by ${meta.steeredBy}</span>` : null}</h3>
    <div class="text">${entry.content}${meta?.pending ? html`<span class="cursor" aria-hidden="true">▍</span>` : null}</div>
    ${meta ? html`
      <${Finish} meta=${meta} />
      <${ErrorNote} error=${meta.error} />
      <${HeaderList} headers=${meta.headers} />
      <${ProbeVerdicts} meta=${meta} />
      ${meta.skipped?.length ? html`<p class="meta">Probes skipped: ${meta.skipped.map((s) => `${s.name} (${s.reason})`).join("; ")}</p>` : null}` : null}
  </article>`;
}

/** What live steering meant for a variant steered `live`: its features at that version, as the
 *  page read them when the comparison started (the answer names only the version). */
function liveFeatures(live) {
  if (!live) return null;
  if (live.changed) return `unknown: the live values changed before the page read them (now version ${live.version})`;
  if (!live.rows.length) return "none (no live value was set)";
  return live.rows.map((f, i) => html`${i ? ", " : ""}<${FeatureLink} sae=${f.sae} index=${f.index} /> ${opText(f)}`);
}

function SteeringApplied({ steering, live }) {
  if (!steering) return null;
  const rows = [["kind", steering.kind]];
  if (steering.name != null) rows.push(["name", steering.name]);
  if (steering.intensity != null) rows.push(["intensity", num(steering.intensity)]);
  if (steering.rung != null) rows.push(["rung", steering.rung]);
  if (steering.features?.length) {
    rows.push(["features", steering.features.map((f, i) => html`${i ? ", " : ""}<${FeatureLink} sae=${f.sae_id} index=${f.index} /> ${f.strength >= 0 ? "+" : ""}${num(f.strength)}`)]);
  }
  if (steering.kind === "live" && live) rows.push(["features", liveFeatures(live)]);
  for (const [key, value] of Object.entries(steering.params || {})) rows.push([key, String(value)]);
  return html`<${KeyValues} label="Steering applied" rows=${rows} />`;
}

export function CompareTurn({ n, meta }) {
  return html`<section class="compare-turn" aria-label=${`Comparison ${n}`} aria-busy=${meta.pending ? "true" : "false"}>
    <h3>Comparison ${n}${meta.seed != null ? html` <span class="meta">· seed ${meta.seed}, the same for every variant</span>` : null}</h3>
    <div class="answers">
      ${meta.variants.map((v) => html`<article class="answer" key=${v.index} aria-label=${v.label}>
        <h4>${v.label}${v.live?.rows?.length ? html` <span class="meta">· ${v.live.rows.map((f) => `#${f.index} ${opText(f)}`).join(", ")}</span>` : null}</h4>
        <div class="text">${v.text}${meta.pending && !v.finish_reason ? html`<span class="cursor" aria-hidden="true">▍</span>` : null}</div>
        ${v.finish_reason ? html`<p class="meta">finish_reason: ${v.finish_reason}${v.usage ? ` · ${plural(v.usage.completion_tokens, "token")}` : ""}</p>` : null}
        <${SteeringApplied} steering=${v.steering} live=${v.live} />
      </article>`)}
    </div>
    ${meta.stopped ? html`<p class="meta stopped">Stopped: the stream was aborted here; the texts so far are kept.</p>` : null}
    <${ErrorNote} error=${meta.error} />
    <${HeaderList} headers=${meta.headers} />
    <p class="meta">No probe verdicts here: /api/compare does not run probes (switch Compare off to see them).</p>
  </section>`;
}

