"""The tables, as SQLAlchemy metadata: what survives a restart, one table per kind of thing kept.
Alembic's revisions (migrations/) bring an older database to this shape; the table modules beside
this one (settings, saes, steering, profiles, documents, models, labels, calibrations, vectors,
probes, responses_api, variants, evaluations, batch_files, batches, sensing, dictionaries) read and
write them."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

settings_table = Table(
    "millm_settings",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)
saes_table = Table(
    "millm_saes",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("info", Text, nullable=False),  # JSON of SAEInfo
    Column("registered_at", Float, nullable=False),
)
# Which SAE is attached at which layer, and on which served model (`model`; NULL in rows from
# before schema 6: they attach on whichever model loads, as they did then). A replica serving
# another model does not attach it.
attachments_table = Table(
    "millm_attachments",
    metadata,
    Column("sae_id", String(64), ForeignKey("millm_saes.id"), primary_key=True),
    Column("layer", Integer, nullable=False),
    Column("model", String(200), nullable=True),
)
# The live steering values: one row per (SAE, feature), its op and what the op takes (add: a
# strength; clamp and cap: a value; ablate: neither). `strength` is 0 for the ops other than add:
# it was NOT NULL before ops existed, and SQLite cannot drop that in place.
strengths_table = Table(
    "millm_strengths",
    metadata,
    Column("sae_id", String(64), primary_key=True),
    Column("feature", Integer, primary_key=True),
    Column("strength", Float, nullable=False),
    Column("op", String(16), nullable=False, server_default="add"),
    Column("value", Float, nullable=True),
)
profiles_table = Table(
    "millm_profiles",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("document", Text, nullable=False),  # the versioned profile document, as JSON
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # Optimistic concurrency: every write of the row adds one, and a write that names the version
    # it read is refused (409) when another writer got there first.
    Column("version", Integer, nullable=False, server_default="1"),
)

clusters_table = Table(
    "millm_clusters",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("raw", Text, nullable=False),  # the document exactly as imported
    Column("intensity", Float, nullable=False),  # the persistent dial
    Column("created_at", Float, nullable=False),
)
circuits_table = Table(
    "millm_circuits",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("raw", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("intensity", Float),  # the persistent dial; null: the document's authored intensity
)

models_table = Table(
    "millm_models",
    metadata,
    Column("name", String(200), primary_key=True),  # the name clients send as `model`
    # what was registered: a path, a .gguf file or a hub id
    Column("reference", Text, nullable=False),
    Column("info", Text, nullable=False),  # JSON: kind, owned_by, and what inspection found
    Column("registered_at", Float, nullable=False),
)

# Feature labels: one row per (SAE, feature); `detail` keeps what the source said beside the
# label (explainer model, type, top tokens, an example), as JSON.
feature_labels_table = Table(
    "millm_feature_labels",
    metadata,
    Column("sae_id", String(64), primary_key=True),
    Column("feature", Integer, primary_key=True),
    Column("label", Text, nullable=False),
    Column("source", String(64), nullable=False),  # neuronpedia | mistudio | plain | sae_file
    Column("detail", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)
# A calibration of one SAE on one model's residuals: what the corpus was (`summary`, JSON) and
# every feature's figures (`figures`, JSON).
calibrations_table = Table(
    "millm_calibrations",
    metadata,
    Column("sae_id", String(64), primary_key=True),
    Column("model", String(200), primary_key=True),
    Column("summary", Text, nullable=False),
    Column("figures", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Steering vectors (kernel/books/vectors.py): the unit direction as d_model little-endian float32
# bytes (read back bit for bit), its trained length and where and on which model it was trained.
vectors_table = Table(
    "millm_vectors",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("description", Text, nullable=False),
    Column("model", String(200), nullable=False),  # the served model name it was trained on
    Column("d_model", Integer, nullable=False),
    Column("layer", Integer, nullable=False),
    Column("hook_point", String(32), nullable=False),
    Column("method", String(32), nullable=False),
    Column("pairs", Integer, nullable=False),
    Column("norm", Float, nullable=False),
    Column("agreement", Float, nullable=True),  # null for an imported vector
    Column("unit", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Probes: a named detector (the versioned probe document, as JSON) and whether it is active,
# i.e. watches every generation request.
probes_table = Table(
    "millm_probes",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("document", Text, nullable=False),
    Column("active", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# Stored Responses API answers (v1/responses/store.py): the response object and the conversation it
# answered (input items, earlier turns included), both as JSON, for GET and previous_response_id.
responses_table = Table(
    "millm_responses",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Float, nullable=False, index=True),
    Column("response", Text, nullable=False),
    Column("items", Text, nullable=False),
)

# Steered variants (store/variants.py): a name clients use as a model, its base model and its
# steering (a profile or a request's own steering, an intensity, how scoring runs), as JSON.
variants_table = Table(
    "millm_variants",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("base", String(400), nullable=False),  # the registered model it steers
    Column("document", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# Steering evaluations (store/evaluations.py): each run's whole result as JSON, newest first.
evaluations_table = Table(
    "millm_evaluations",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Float, nullable=False, index=True),
    Column("concept", String(400), nullable=False),
    Column("result", Text, nullable=False),
)

# Transcoder sets registered for attribution (store/transcoders.py): where each lies; the files
# are read again at start (a set is its directory, not a copy).
# An explanation of one SAE feature written by a model (`explainer`: "served:<model>" or
# "endpoint:<model>"), one per explainer: a newer one by the same explainer replaces it. `detail`
# (JSON) holds the scorer, the prompt version, the scores and the examples' counts.
explanations_table = Table(
    "millm_explanations",
    metadata,
    Column("sae_id", String(64), primary_key=True),
    Column("feature", Integer, primary_key=True),
    Column("explainer", String(200), primary_key=True),
    Column("explanation", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)
transcoder_sets_table = Table(
    "millm_transcoder_sets",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("path", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)
# Files for the Batch API (store/batch_files.py): one record each, its bytes in 1 MiB chunks beside
# it, so every replica reads what any replica stored, and a read streams chunk by chunk.
batch_files_table = Table(
    "millm_batch_files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("filename", String(255), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("status", String(16), nullable=False),  # processed, deleted, expired
    Column("bytes", Integer, nullable=False),
    Column("lines", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),
    # seconds, with their fraction: files made within one second still list in order
    Column("created_at", Float, nullable=False, index=True),
    Column("expires_at", Integer, nullable=False),
)
batch_file_chunks_table = Table(
    "millm_batch_file_chunks",
    metadata,
    Column("file_id", String(64), ForeignKey("millm_batch_files.id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)
# Batches (store/batches.py): the batch object as JSON beside the columns queries need, and each
# line's result as it is recorded (a chunk at a time, with the counts, in one transaction).
batches_table = Table(
    "millm_batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("status", String(16), nullable=False, index=True),
    Column("created_at", Float, nullable=False, index=True),
    Column("input_file_id", String(64), nullable=False),
    Column("batch", Text, nullable=False),  # JSON: the batch object and its inner state
    Column("runner", String(64)),  # the replica draining it, and when it last said so
    Column("beat", Float),
)
batch_results_table = Table(
    "millm_batch_results",
    metadata,
    Column("batch_id", String(64), ForeignKey("millm_batches.id"), primary_key=True),
    Column("line", Integer, primary_key=True),
    Column("ok", Boolean, nullable=False),
    Column("record", Text, nullable=False),  # JSON: the output or error file's line
)
# The lines still to run: a replica claims a chunk of them (`runner`, `until`), skipping lines
# another holds, and deletes them as it records their results; a claim past `until` is anyone's.
batch_pending_table = Table(
    "millm_batch_pending",
    metadata,
    Column("batch_id", String(64), ForeignKey("millm_batches.id"), primary_key=True),
    Column("line", Integer, primary_key=True),
    Column("runner", String(64)),
    Column("until", Float),
)
# Sensing: which clusters and circuits are sensed and how (kind "cluster" or "circuit"), and the
# events recorded, each a JSON record; a base's events go with it (store/sensing.py).
sensing_table = Table(
    "millm_sensing",
    metadata,
    Column("kind", String(16), primary_key=True),
    Column("base_id", String(64), primary_key=True),
    Column("enabled", Boolean, nullable=False),
    Column("config", Text, nullable=False),  # JSON: min_k, context_tokens, max_token_lag
)
sensing_events_table = Table(
    "millm_sensing_events",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("base_id", String(64), nullable=False, index=True),
    Column("created_at", Float, nullable=False, index=True),
    Column("record", Text, nullable=False),  # JSON: the event as GET /api/sensing/events gives it
)
# Circuits' claims on the layers they steer: a live claim has no `released_at`; at most one live
# claim per layer that is not composed (the partial unique index holds it against concurrent
# writers and other replicas); `steering_keys` are the features it writes there (JSON).
circuit_claims_table = Table(
    "millm_circuit_claims",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("circuit_id", String(64), nullable=False, index=True),
    Column("layer", Integer, nullable=False),
    Column("claimed_at", Float, nullable=False),
    Column("released_at", Float),
    Column("composed", Boolean, nullable=False),
    Column("steering_keys", Text, nullable=False),
)
Index(
    "millm_one_live_claim_per_layer",
    circuit_claims_table.c.layer,
    unique=True,
    sqlite_where=circuit_claims_table.c.released_at.is_(None) & ~circuit_claims_table.c.composed,
    postgresql_where=circuit_claims_table.c.released_at.is_(None)
    & ~circuit_claims_table.c.composed,
)

# A dictionary training (store/dictionaries.py): its request, where its checkpoints lie, its state
# and progress (JSON, rewritten at each checkpoint with `heartbeat_at`, which tells a restart that
# a `running` row was left behind by a process that is gone), and its result or error.
dictionary_trainings_table = Table(
    "millm_dictionary_trainings",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("model", String(200), nullable=False),
    Column("request", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("work_dir", Text, nullable=False),
    Column("progress", Text, nullable=False),
    Column("result", Text),
    Column("error", Text),
    Column("created_at", Float, nullable=False, index=True),
    Column("heartbeat_at", Float, nullable=False),
    Column("finished_at", Float),
)
# A dictionary's grade on a model over a corpus: the card (JSON), newest first per SAE.
dictionary_grades_table = Table(
    "millm_dictionary_grades",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("sae_id", String(64), nullable=False, index=True),
    Column("model", String(200), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("card", Text, nullable=False),
)
