// placeholder while the view is written
import { html } from "../ui.js";
export default function View() { return html`<p>monitoring</p>`; }
