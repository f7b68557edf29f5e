"""What every capability shares, and its one owner: the served model and its switch (model/),
live steering and a request's plans (steering/), the books of stored things (books/), probes
and steered variants as a request meets them (probes/, variants/), live monitoring
(monitoring/), and how work runs (runtime/). Imports nothing of lab/, v1/ or server/."""
