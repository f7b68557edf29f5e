// Labels from a calibration's top tokens (docs/labels.md): one click labels every feature that
// fired in the SAE's calibration by the tokens it fired hardest on; no model writes anything.
import { useState } from "preact/hooks";
import * as api from "../api.js";
import { ErrorNote, Panel, html, plural, useAction } from "../ui.js";

/** The Features view's "Label by top tokens" panel: only unlabelled features, or every one. */
export function TopTokenLabels({ sae }) {
  const act = useAction();
  const [overwrite, setOverwrite] = useState(false);
  const [done, setDone] = useState(null);
  const start = (e) => {
    e.preventDefault();
    act.run(async () => { setDone(null); setDone(await api.saes.labelTopTokens(sae, { overwrite })); });
  };
  return html`<${Panel} title="Label by top tokens">
    <p class="note">Each feature that fired in the SAE's calibration is labelled by the three tokens it fired hardest on ("pirate / ship / sea"), its top tokens and best example kept beside the label. Instant: no model writes anything. Calibrate first; more top examples make better labels.</p>
    <form class="row" onSubmit=${start} aria-label="Label by top tokens">
      <label class="inline"><input type="checkbox" checked=${overwrite} onChange=${(e) => setOverwrite(e.target.checked)} name="overwrite" /> Over the labels features have</label>
      <button type="submit" disabled=${!sae || act.busy}>Label</button>
    </form>
    <${ErrorNote} error=${act.error} />
    ${done ? html`<p role="status">${plural(done.imported, "feature")} labelled${done.replaced ? ` (${done.replaced} over a label)` : ""}, ${
      done.skipped} left as they were; ${plural(done.total, "label")} in all.</p>` : null}
  <//>`;
}
