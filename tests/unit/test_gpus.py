"""GET /api/health/gpus' reading of nvidia-smi (a stand-in executable that prints what the real
one prints for these queries), and its answer without one."""

import stat

from millm.engine.gpus import Placement, read_gpus, uuid_key

CARDS = """0, GPU-1111aaaa-2222-3333-4444-555566667777, NVIDIA H100 80GB HBM3, 81559, 1024, 80535
1, GPU-9999bbbb-8888-7777-6666-555544443333, NVIDIA H100 80GB HBM3, 81559, 3, 81556
"""
APPS = "GPU-1111aaaa-2222-3333-4444-555566667777, 4242, 1018\n"


def stand_in(tmp_path, apps_fail: bool = False):
    """An executable answering the two queries read_gpus makes."""
    (tmp_path / "cards.csv").write_text(CARDS)
    (tmp_path / "apps.csv").write_text(APPS)
    apps = "exit 9" if apps_fail else f'cat "{tmp_path}/apps.csv"'
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  --query-gpu=*) cat "{tmp_path}/cards.csv" ;;\n'
        f"  --query-compute-apps=*) {apps} ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_each_card_as_nvidia_smi_says_and_nothing_measured_that_was_not(tmp_path):
    body = read_gpus(Placement(llama_cpp=frozenset({0})), smi=stand_in(tmp_path))
    assert body["reason"] is None and body["read_at"].endswith("Z")
    first, second = body["cards"]
    assert (first["smi_index"], first["name"], first["total_mb"], first["used_mb"]) == (
        0,
        "NVIDIA H100 80GB HBM3",
        81559.0,
        1024.0,
    )
    assert first["processes"] == [{"pid": 4242, "used_mb": 1018.0}] and second["processes"] == []
    # CUDA is not initialised in this process: torch is not asked, nothing is made up.
    for card in (first, second):
        assert card["torch_index"] is None and card["torch_measured"] is False
        assert card["millm_allocated_mb"] is None and card["millm_reserved_mb"] is None
    assert first["engine_memory"] == "not_measured_by_torch" and second["engine_memory"] is None


def test_a_failing_process_query_says_so(tmp_path):
    body = read_gpus(Placement(), smi=stand_in(tmp_path, apps_fail=True))
    card = body["cards"][0]
    assert card["processes"] is None
    assert card["processes_reason"] == "nvidia-smi --query-compute-apps unavailable"


def test_without_nvidia_smi_no_cards_and_the_reason(tmp_path):
    body = read_gpus(Placement(), smi=str(tmp_path / "absent"))
    assert (body["cards"], body["reason"]) == ([], "nvidia-smi unavailable")


def test_a_uuid_reads_the_same_from_nvidia_smi_and_torch():
    assert uuid_key("GPU-1111AAAA-2222-3333") == uuid_key("1111aaaa22223333")
