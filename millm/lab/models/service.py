"""Models as the API presents them: the management views, the OpenAI model list, readiness and
the scheduler's figures. Loads and unloads block, so they run on a passing thread (torch work)."""

from __future__ import annotations

from millm.engine.gpus import read_gpus
from millm.errors import ModelNotResident, StoreUnavailable
from millm.kernel.model.leases import DEFAULT_TTL_S, presented, status
from millm.kernel.model.transitions import ModelStatus, ModelView, busy
from millm.kernel.runtime.threads import in_passing_thread
from millm.lab.models.parts import ModelParts
from millm.lab.models.protocol import LeaseRequest, RenewLease
from millm.store.batches import backlog


def model_view(view: ModelView) -> dict:
    """A registered model as the management API shows it."""
    body = {
        "object": "model",
        **view.entry.to_dict(),
        "state": view.state.value,
        "locked": view.locked,
    }
    if view.error is not None:
        body["error"] = view.error
    if view.lm is not None:
        body["loaded"] = {
            "device": str(view.lm.device),
            "dtype": view.lm.dtype_name,
            "max_model_len": view.lm.context_length,
            "system_fingerprint": view.lm.system_fingerprint,
        }
    return body


def prefix_cache_stats(scheduler) -> dict:
    """The prefix cache's counters, or why there is none."""
    cache = scheduler.prefix_cache
    if cache is not None:
        return {"enabled": True, "unavailable": None, **cache.snapshot()}
    runner = scheduler.lm.runner
    if getattr(runner, "prefix_storage", None) is not None:
        return {"enabled": False, "unavailable": "PREFIX_CACHE_BYTES is 0"}
    why = getattr(runner, "prefix_unavailable", None)
    return {
        "enabled": False,
        "unavailable": why or f"the {runner.name} runner cannot restore a prefix's keys and values",
    }


class ModelManagement:
    """Models as the API presents them: registrations, loads, locks, the OpenAI list, readiness
    and statistics."""

    def __init__(self, state: ModelParts):
        self.state = state

    def get_model(self, name: str) -> dict:
        """One registered model, its state and the lease on it (never its id)."""
        view = self.state.switch.view(name)
        return {**model_view(view), "lease": self._lease_on(view.entry.name)}

    def list_registered(self) -> dict:
        """Every registered model (with the lease on the loaded one) and the steering lock."""
        return {
            "object": "list",
            "locked": self.state.switch.locked,
            "data": [
                {**model_view(view), "lease": self._lease_on(view.entry.name)}
                for view in self.state.switch.views()
            ],
        }

    # leases ---------------------------------------------------------------------------------------
    def grant_lease(self, name: str, body: LeaseRequest) -> dict:
        """A lease on the loaded model: its id (shown here only) and its status; 409
        model_not_resident for another model, 503 model_busy while a model changes."""
        switch = self.state.switch
        name = switch.view(name).entry.name
        if switch.transition is not None:
            raise busy(switch.transition)
        if switch.resident != name:
            loaded = repr(switch.resident) if switch.resident else "none"
            raise ModelNotResident(
                f"model {name!r} is not loaded (the loaded model is {loaded}); only the loaded "
                "model can be leased",
                param="model",
            )
        ttl = body.ttl_seconds or DEFAULT_TTL_S
        token, status = switch.leases.grant(name, body.holder, body.reason, ttl)
        return {"lease_id": token, **status}

    def lease(self, name: str) -> dict:
        """The live lease on a model (never its id) and the last one that ended."""
        switch = self.state.switch
        return switch.leases.view(switch.view(name).entry.name, switch.resident)

    def renew_lease(self, name: str, body: RenewLease) -> dict:
        """The lease X-miLLM-Lease names, to end ttl_seconds from now."""
        switch = self.state.switch
        name = switch.view(name).entry.name
        ttl = body.ttl_seconds or DEFAULT_TTL_S
        return switch.leases.renew(name, presented.get(), ttl, switch.resident)

    def release_lease(self, name: str) -> dict:
        """End the lease X-miLLM-Lease names."""
        switch = self.state.switch
        return switch.leases.release(switch.view(name).entry.name, presented.get(), switch.resident)

    def _lease_on(self, name: str) -> dict | None:
        lease = self.state.switch.leases.live(self.state.switch.resident)
        if lease is None or lease.model != name:
            return None
        return status(lease, self.state.switch.leases.clock())

    def register_model(self, source: str, name: str | None) -> tuple[dict, bool]:
        """Register a checkpoint directory, .gguf file or hub id; returns the view and whether it
        is new."""
        entry, created = self.state.registrations.model(source, name)
        return model_view(self.state.switch.view(entry.name)), created

    async def load_model(self, name: str) -> dict:
        """Load a model (replacing the loaded one) and say whether the active base still fits."""
        await in_passing_thread(self.state.switch.load, name, presented.get())
        return {
            **model_view(self.state.switch.view(name)),
            "active_base": self.state.planner.active_fit(),
        }

    async def unload_model(self, name: str) -> dict:
        """Unload a model gracefully."""
        was = await in_passing_thread(self.state.switch.unload, name, presented.get())
        return {
            **model_view(self.state.switch.view(name)),
            "was_loaded": was,
            "active_base": self.state.planner.active_fit(),
        }

    def lock_model(self, name: str) -> dict:
        """Serve only this model."""
        self.state.switch.lock_to(name)
        return model_view(self.state.switch.view(name))

    def unlock_model(self, name: str) -> dict:
        """Release the steering lock (refused while SAEs are attached)."""
        was = self.state.switch.unlock(name)
        return {**model_view(self.state.switch.view(name)), "was_locked": was}

    def delete_model(self, name: str) -> dict:
        """Forget a registration (refused while loaded or locked)."""
        self.state.switch.forget(name)
        return {"id": name, "object": "model", "deleted": True}

    # health ---------------------------------------------------------------------------------------
    def readiness(self) -> tuple[dict, bool]:
        """The model's state (and load error, if any), and whether requests can be served now."""
        status = self.state.switch.status
        lm = self.state.switch.lm
        body = {
            "status": "ready" if status is ModelStatus.LOADED else status.value,
            "model": self.state.switch.expected_name,
        }
        if lm is not None:
            body["system_fingerprint"] = lm.system_fingerprint
        error = self.state.switch.load_error
        if error:
            body["error"] = error
        in_step, why = self.state.replication.in_step()
        if status is ModelStatus.LOADED and not in_step:
            # Out of the load balancer's rotation until it has reloaded what other replicas changed
            # meanwhile.
            body.update(status="out_of_step", error=why)
        sae_error = self.state.switch.startup_saes.error
        if status is ModelStatus.LOADED and in_step and sae_error:
            # Started to steer through an SAE that is not attached: not ready, rather than
            # unsteered.
            body.update(status="sae_not_attached", error=sae_error)
        ready = status is ModelStatus.LOADED and in_step and not sae_error
        return body, ready

    def _backlog(self) -> int | None:
        """Lines of live batches still to run; None while the store cannot be read (health
        answers all the same: it is how a replica cut off from the database says so)."""
        try:
            return backlog(self.state.store)
        except StoreUnavailable:
            return None

    def gpus(self) -> dict:
        """Each NVIDIA card's memory, as nvidia-smi and this process's allocator read it
        (blocking: nvidia-smi runs, each query within 5 s)."""
        return read_gpus(self.state.switch.slot.placement())

    def inference_stats(self) -> dict:
        """Which backend serves generation, what waits and runs now, and jobs per backend."""
        settings = self.state.settings
        scheduler = self.state.switch.scheduler
        body: dict = {
            "backend": None,
            "engine": None,
            "runner": None,
            "numerics": "reproducible" if settings.reproducible else "fast",
            "continuous_batching": {
                "enabled": settings.enable_continuous_batching,
                "max_batch_size": settings.max_batch_size,
                "unavailable": None,
            },
            "queue_depth": 0,
            "in_flight": 0,
            "background_waiting": 0,
            "estimated_wait_seconds": None,
            "batch_backlog_rows": self._backlog(),
            "running_rows": 0,
            "batch_size": 0,
            "peak_batch_size": 0,
            "jobs": {},
            "packed_scoring_jobs": 0,
            "background_pauses": 0,
            "prefix_cache": None,
            "prefill_chunk_tokens": None,
            "replica": self.state.replication.view(),
        }
        if scheduler is None:
            return body
        body["continuous_batching"]["unavailable"] = scheduler.batching_unavailable
        body.update(
            backend=scheduler.backend,
            engine=scheduler.lm.engine,
            runner=scheduler.lm.runner.name,
            queue_depth=scheduler.queue_depth,
            in_flight=scheduler.in_flight,
            background_waiting=scheduler.background_waiting,
            estimated_wait_seconds=scheduler.wait_estimate,
            running_rows=scheduler.running_rows,
            batch_size=scheduler.batch_rows,
            peak_batch_size=scheduler.peak_batch_rows,
            jobs={backend: dict(counts) for backend, counts in scheduler.stats.items()},
            packed_scoring_jobs=scheduler.packed_jobs,
            background_pauses=scheduler.pauses,
            prefix_cache=prefix_cache_stats(scheduler),
            prefill_chunk_tokens=scheduler.prefill_chunk,
        )
        return body

    def load_at_start(self) -> None:
        """Start the start-up model's load in the background (readiness reports its progress)."""
        self.state.switch.load_in_background()
