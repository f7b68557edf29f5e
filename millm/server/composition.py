"""The composition root: every part of the server's state made once, in dependency order, and
wired by its constructor (no part is patched in after it is made).

`ServerState` is what the routes' facades are built over; it owns nothing itself. What each part
owns: the store (the database), replication (other replicas' changes), the books (SAEs, labels,
calibrations, profiles, probes, vectors, clusters, circuits, variants, evaluations), the live
steering and its planner, the model switch (the served model, its slot and lock), the monitor and
the jobs."""

from __future__ import annotations

from millm.engine.sources import ModelSource
from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.books.documents import CircuitBook, ClusterBook
from millm.kernel.books.labels import LabelBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.books.transcoders import TranscoderBook
from millm.kernel.books.vectors import VectorBook
from millm.kernel.model.registrations import ClientRegistrations
from millm.kernel.model.registry import ModelRegistry
from millm.kernel.model.shipped import Shipped
from millm.kernel.model.slot import ModelSlot
from millm.kernel.model.startup_saes import StartupSAEs
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.monitoring.monitor import Monitor
from millm.kernel.probes.book import ProbeBook
from millm.kernel.probes.conditions import ProbeConditions
from millm.kernel.runtime.jobs import JobBook
from millm.kernel.runtime.replication import Replication
from millm.kernel.sensing.sensing import Sensing
from millm.kernel.state import ServerState
from millm.kernel.steering.base_fit import DialLimits
from millm.kernel.steering.decoders import DecoderCache
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner
from millm.kernel.steering.resolution import Resolvers
from millm.kernel.steering.saes import SAERegistry
from millm.kernel.variants.book import VariantBook
from millm.kernel.variants.naming import VariantRouting
from millm.settings import Settings
from millm.store.changes import Topic
from millm.store.database import Store, database_url
from millm.store.single_process import claim_sqlite

JOBS_KEPT = 50  # ended jobs remembered for GET /api/jobs


def build_state(settings: Settings, source: ModelSource) -> ServerState:
    """Make every part once, each from the parts it needs, and follow the other replicas."""
    settings.home.mkdir(parents=True, exist_ok=True)
    url = database_url(settings.home, settings.database_url)
    claim = claim_sqlite(url)  # DatabaseInUse when another server holds this SQLite file
    store = Store(url)
    replication = Replication(store)
    labels = LabelBook(store)
    saes = SAERegistry(store, settings.hub_dir, labels)
    profiles = ProfileBook(store)
    probes = ProbeBook(store)
    vectors = VectorBook(store)
    calibrations = CalibrationBook(store)
    slot = ModelSlot()
    resolvers = Resolvers(ProbeConditions(probes, calibrations, slot.loaded), vectors, slot.loaded)
    steering = Steering(store, saes, profiles, replication, resolvers)
    clusters = ClusterBook(store, settings.steering_intensity_max)
    circuits = CircuitBook(store, settings.steering_intensity_max)
    limits = DialLimits(
        settings.cluster_intensity_min,
        settings.circuit_intensity_min,
        settings.steering_intensity_max,
    )
    for info in list(saes.infos.values()):  # SAEs registered before they shipped a calibration
        calibrations.import_shipped(info)
    variants = VariantBook(store)
    models = ModelRegistry(store, settings.hub_dir, variants.has)
    registrations = ClientRegistrations(settings, source, saes, models, calibrations)
    transcoders = TranscoderBook(store)
    shipped = Shipped(store, saes, calibrations, steering, profiles, transcoders)
    startup_saes = StartupSAEs(settings, registrations, steering, labels)
    switch = ModelSwitch(
        settings, source, store, models, steering, registrations, shipped, startup_saes, slot
    )
    planner = Planner(steering, clusters, circuits, limits)
    state = ServerState(
        settings=settings,
        source=source,
        claim=claim,
        store=store,
        replication=replication,
        labels=labels,
        saes=saes,
        decoders=DecoderCache(steering, saes),
        profiles=profiles,
        probes=probes,
        vectors=vectors,
        calibrations=calibrations,
        steering=steering,
        clusters=clusters,
        circuits=circuits,
        planner=planner,
        variants=VariantRouting(variants, planner),
        monitor=Monitor(
            store,
            settings.monitoring_history,
            batch_history=settings.monitoring_batch_history,
            labels=labels.entries,
            prompt_chars=settings.monitoring_prompt_max_chars,
        ),
        sensing=Sensing(store, settings, planner, clusters, circuits),
        models=models,
        registrations=registrations,
        switch=switch,
        jobs=JobBook(settings.max_jobs, JOBS_KEPT, settings.job_share, slot.generating),
        transcoders=transcoders,
    )
    follow_other_replicas(state)
    return state


def follow_other_replicas(state: ServerState) -> None:
    """What to read again when another replica changes a part of the shared state (the order of a
    full reload: registrations before the documents and the steering that name them)."""
    on = state.replication.on
    on(Topic.SAES, state.saes.reload)
    on(Topic.LABELS, state.labels.reload)
    on(Topic.CALIBRATIONS, state.calibrations.reload)
    on(Topic.MODELS, state.models.reload)
    on(Topic.VECTORS, state.vectors.refresh)
    on(Topic.PROBES, state.probes.refresh)
    on(Topic.PROFILES, state.profiles.refresh)
    on(Topic.CLUSTERS, state.clusters.refresh)
    on(Topic.CIRCUITS, state.circuits.refresh)
    on(Topic.VARIANTS, state.variants.book.refresh)
    on(Topic.TRANSCODERS, state.transcoders.refresh)
    on(Topic.STEERING, state.switch.steering_changed)
    on(Topic.MONITORING, state.monitor.reload)
    on(Topic.SENSING, state.sensing.reload)
    state.replication.start()
