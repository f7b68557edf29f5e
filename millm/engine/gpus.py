"""What each NVIDIA card holds, as nvidia-smi reads it, beside what this process's torch
allocator holds there: GET /api/health/gpus.

Reading a card never creates a CUDA context on it: torch's allocator is asked only about cards a
transformers model was placed on in this process (`touched`), and only once CUDA is initialised;
a card torch cannot see (or has not been asked about) is listed with `torch_index: null`. A
llama.cpp model's memory is its own allocator's, which torch cannot measure: its card says so
(found by torch's index, or by nvidia-smi's while CUDA is not initialised in this process: the
two orders agree under CUDA_DEVICE_ORDER=PCI_BUS_ID).
Without nvidia-smi the answer is no cards and the reason, never figures made up.
"""

from __future__ import annotations

import csv
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime

SMI_TIMEOUT_S = 5
CARDS = ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free"]
APPS = ["--query-compute-apps=gpu_uuid,pid,used_memory"]
CSV = ["--format=csv,noheader,nounits"]
MIB = 1024 * 1024


@dataclass(frozen=True)
class Placement:
    """Where this process put models: cards a transformers model was placed on (ever), and the
    cards a resident llama.cpp model holds now."""

    touched: frozenset[int] = frozenset()
    llama_cpp: frozenset[int] = frozenset()


def smi_rows(query: list[str], smi: str = "nvidia-smi") -> list[list[str]] | None:
    """nvidia-smi's CSV rows for a query, or None when it is absent, fails or hangs."""
    try:
        done = subprocess.run(
            [smi, *query, *CSV], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[cell.strip() for cell in row] for row in csv.reader(done.stdout.splitlines()) if row]


def uuid_key(uuid: str) -> str:
    """A card's UUID as nvidia-smi and torch both say it: lower case, no `GPU-`, no dashes."""
    text = uuid.strip().lower()
    return text.removeprefix("gpu-").replace("-", "")


def torch_cards() -> dict[str, int]:
    """Torch's index of each card by UUID, once CUDA is initialised (empty before: asking would
    create a context)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {
        uuid_key(str(torch.cuda.get_device_properties(i).uuid)): i
        for i in range(torch.cuda.device_count())
    }


def allocator_mib(index: int) -> tuple[float, float]:
    """What torch's allocator has allocated and reserved on a card, in MiB."""
    import torch

    return (
        round(torch.cuda.memory_allocated(index) / MIB, 1),
        round(torch.cuda.memory_reserved(index) / MIB, 1),
    )


def read_gpus(placement: Placement, smi: str = "nvidia-smi") -> dict:
    """The body of GET /api/health/gpus: {read_at, cards, reason}."""
    read_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    rows = smi_rows(CARDS, smi)
    if rows is None:
        return {"read_at": read_at, "cards": [], "reason": "nvidia-smi unavailable"}
    apps = smi_rows(APPS, smi)
    by_uuid = torch_cards()
    cards = []
    for smi_index, uuid, name, total, used, free in rows:
        index = by_uuid.get(uuid_key(uuid))
        measured = index is not None and index in placement.touched
        allocated, reserved = (
            allocator_mib(index) if measured and index is not None else (None, None)
        )
        processes = (
            None
            if apps is None
            else [
                {"pid": int(pid), "used_mb": float(mb)}
                for app_uuid, pid, mb in apps
                if uuid_key(app_uuid) == uuid_key(uuid)
            ]
        )
        cards.append(
            {
                "smi_index": int(smi_index),
                "uuid": uuid,
                "name": name,
                "total_mb": float(total),
                "used_mb": float(used),
                "free_mb": float(free),
                "torch_index": index,
                "torch_measured": measured,
                "millm_allocated_mb": allocated,
                "millm_reserved_mb": reserved,
                "engine_memory": "not_measured_by_torch"
                if (int(smi_index) if index is None else index) in placement.llama_cpp
                else None,
                "processes": processes,
                "processes_reason": None
                if apps is not None
                else "nvidia-smi --query-compute-apps unavailable",
            }
        )
    return {"read_at": read_at, "cards": cards, "reason": None}
