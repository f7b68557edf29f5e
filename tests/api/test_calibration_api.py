"""Calibration on a live server (tiny Llama, a TopK SAE at layer 1): the job, its figures against
numpy over activations captured offline (a stock transformers model, a hook, the SAE's encode),
top examples, cancellation, refusals, percentiles in return_sae_activations and monitoring
records, a shipped calibration.json, and a restart."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
import torch

from millm.engine.prompts import chat_prompt_ids
from millm.interp.calibration_stats import pack_grids
from millm.interp.formats import read_sae
from tests.api.clients import MODEL, api, error, post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

LAYER = 1
CAP = 30_000  # MILLM_CALIBRATION_MAX_TOKENS of the server under test
SUBJECTS = [
    "The old river",
    "A small cat",
    "Paris",
    "My friend",
    "Every feature",
    "The capital",
    "Sparse codes",
    "The model",
]
ENDINGS = [
    "runs quickly to the sea.",
    "is the city of France.",
    "counts one two three four five.",
    "reads a naïve café menu.",
    "steers über the hills.",
    "writes 数字 again and again, then stops.",
]
TEXTS = [
    f"{s} {e}" * (1 + i % 3)
    for i, (s, e) in enumerate(zip(SUBJECTS * 2, ENDINGS * 3, strict=False))
]
CONVERSATIONS = [
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital."},
    ],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hello! How are you today?"},
    ],
]
TOP = 3


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cal-saes")
    return {
        "main": build_saelens(base / "main", layer=LAYER, architecture="topk", seed=71),
        "plain": build_saelens(base / "plain", layer=2, architecture="standard", seed=72),
        "loose": build_saelens(base / "loose", layer=0, architecture="jumprelu", seed=73),
        "shipped": build_saelens(base / "shipped", layer=0, architecture="topk", seed=74),
    }


def start_server(home, tiny_dirs) -> ServerProcess:
    process = ServerProcess(
        home, ["--model", str(tiny_dirs["llama"])], env={"MILLM_CALIBRATION_MAX_TOKENS": str(CAP)}
    )
    return process.wait_ready()


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dirs):
    home = tmp_path_factory.mktemp("cal-home")
    process = start_server(home, tiny_dirs)
    holder = {"process": process}
    try:
        ids = {}
        for name in ("main", "plain", "loose"):
            ids[name] = post(process, "/api/saes", {"path": str(sae_dirs[name])}).json()["id"]
        for name in ("main", "plain"):
            assert post(process, f"/api/saes/{ids[name]}/attach", {}).status_code == 200
        holder.update(ids=ids, home=home)
        yield holder
    finally:
        holder["process"].stop()


@pytest.fixture(scope="module")
def offline(tiny_dirs, sae_dirs):
    """Each text's SAE activations `[positions, d_sae]` at every position (stock transformers
    model, a hook, the SAE's encode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    sae = read_sae(sae_dirs["main"])[1]
    captured = {}

    def hook(module, args, output):
        captured["resid"] = output[0] if isinstance(output, tuple) else output

    model.model.layers[LAYER].register_forward_hook(hook)

    def run(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            model(torch.tensor([ids]))
            return sae.encode(captured["resid"][0]).numpy()

    prompts = [tokenizer(text)["input_ids"] for text in TEXTS]
    prompts += [chat_prompt_ids(tokenizer, messages) for messages in CONVERSATIONS]
    return {"prompts": prompts, "acts": [run(ids) for ids in prompts], "tokenizer": tokenizer}


def wait_job(process, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api(process, "GET", f"/api/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running after {timeout} s")


def calibrate(process, sae_id: str, body: dict) -> httpx.Response:
    return post(process, f"/api/saes/{sae_id}/calibrate", body)


@pytest.fixture(scope="module")
def calibrated(server):
    """The main SAE calibrated on TEXTS and CONVERSATIONS: the finished job."""
    process, sae = server["process"], server["ids"]["main"]
    response = calibrate(
        process, sae, {"texts": TEXTS, "conversations": CONVERSATIONS, "top_examples": TOP}
    )
    assert response.status_code == 202, response.text
    started = response.json()
    assert (
        started["kind"] == "calibration"
        and started["state"] == "running"
        and started["progress"]["unit"] == "texts"
    )
    return wait_job(process, started["id"])


def figures_of(process, sae_id: str, features: list[int]) -> list[dict]:
    response = api(
        process,
        "GET",
        f"/api/saes/{sae_id}/calibration",
        params={"features": ",".join(map(str, features))},
    )
    assert response.status_code == 200, response.text
    return response.json()["features"]


def test_the_job_runs_to_the_end_and_reports_its_progress(server, calibrated, offline):
    assert calibrated["state"] == "succeeded", calibrated
    total = len(TEXTS) + len(CONVERSATIONS)
    assert calibrated["progress"] == {"done": total, "total": total, "unit": "texts"}
    summary = calibrated["result"]
    assert (
        summary["texts"] == total and summary["model"] == MODEL and summary["corpus"] == "request"
    )
    assert summary["tokens"] == sum(map(len, offline["prompts"]))
    # each text's first position is not read
    assert summary["positions"] == summary["tokens"] - total
    assert summary["sample_rate"] == 1.0 and "where the feature fired" in summary["quantiles"]
    stored = api(server["process"], "GET", f"/api/saes/{server['ids']['main']}/calibration").json()
    assert stored["summary"] == summary and stored["features"] is None


def test_figures_equal_numpy_over_the_captured_activations(server, calibrated, offline):
    dense = np.concatenate([acts[1:] for acts in offline["acts"]])  # position 0 is never read
    d_sae = dense.shape[1]
    figures = figures_of(server["process"], server["ids"]["main"], list(range(d_sae)))
    assert [f["index"] for f in figures] == list(range(d_sae))
    fired_any = 0
    for f, got in enumerate(figures):
        column = dense[:, f]
        on = column[column > 0].astype(np.float64)
        assert got["count"] == on.size
        assert got["frequency"] == pytest.approx(on.size / dense.shape[0], rel=1e-5)
        assert got["max"] == pytest.approx(column.max(), rel=1e-4, abs=1e-5)
        if on.size == 0:
            assert got["mean"] is None and got["p50"] is None and got["top_examples"] == []
            continue
        fired_any += 1
        assert got["mean"] == pytest.approx(on.mean(), rel=1e-4)
        want = np.quantile(on, [0.5, 0.9, 0.99])
        assert [got["p50"], got["p90"], got["p99"]] == pytest.approx(
            want.tolist(), rel=1e-4, abs=1e-5
        )
    assert fired_any > d_sae // 2  # a TopK SAE with k=8 of 128 spreads over most features


def test_label_search_and_feature_details_carry_the_calibration(server, calibrated):
    process, sae = server["process"], server["ids"]["main"]
    found = api(
        process, "GET", f"/api/saes/{sae}/features", params={"q": "paris", "limit": 5}
    ).json()
    assert found["calibrated_on"] == MODEL and found["data"]
    figures = {
        f["index"]: f for f in figures_of(process, sae, [hit["index"] for hit in found["data"]])
    }
    for hit in found["data"]:
        assert (hit["frequency"], hit["max_activation"]) == (
            figures[hit["index"]]["frequency"],
            figures[hit["index"]]["max"],
        )
    index = found["data"][0]["index"]
    detail = api(process, "GET", f"/api/saes/{sae}/features/{index}").json()
    assert detail["calibrated_on"] == MODEL and detail["calibration"] == figures[index]
    bare = api(
        process, "GET", f"/api/saes/{server['ids']['loose']}/features/0"
    ).json()  # never calibrated
    assert bare["calibrated_on"] is None and bare["calibration"] is None
    unfound = api(
        process,
        "GET",
        f"/api/saes/{server['ids']['loose']}/features",
        params={"q": "paris", "limit": 1},
    ).json()
    assert unfound["calibrated_on"] is None and unfound["data"][0]["frequency"] is None


def test_top_examples_are_the_largest_activations_with_their_text(server, calibrated, offline):
    d_sae = offline["acts"][0].shape[1]
    figures = figures_of(server["process"], server["ids"]["main"], list(range(d_sae)))
    tokenizer = offline["tokenizer"]

    def snippet(t: int, p: int) -> tuple[str, str, str]:
        ids = offline["prompts"][t]
        return (
            tokenizer.decode(ids[max(0, p - 16) : p]),
            tokenizer.decode(ids[p : p + 1]),
            tokenizer.decode(ids[p + 1 : p + 5]),
        )

    repeats = 0
    for f, got in enumerate(figures):
        ranked = sorted(
            (-float(acts[p, f]), t, p)
            for t, acts in enumerate(offline["acts"])
            for p in range(1, acts.shape[0])
            if acts[p, f] > 0
        )
        want, seen = [], set()
        for value, t, p in ranked[
            : TOP * 4
        ]:  # the largest first; a snippet already listed is skipped
            if snippet(t, p) not in seen:
                seen.add(snippet(t, p))
                want.append((-value, t, p))
        repeats += len(want) < min(len(ranked), TOP * 4)
        want = want[:TOP]
        examples = got["top_examples"]
        assert [(e["text_index"], e["position"]) for e in examples] == [(t, p) for _, t, p in want]
        assert [e["activation"] for e in examples] == pytest.approx(
            [v for v, _, _ in want], rel=1e-4
        )
        for example in examples:
            assert (example["before"], example["token"], example["after"]) == snippet(
                example["text_index"], example["position"]
            )
            assert (
                example["display"] == f"{example['before']}[[{example['token']}]]{example['after']}"
            )
    assert repeats > 0  # texts sharing a prefix repeat snippets, so the rule was exercised


def percentile_reference(offline, feature: int, value: float) -> float:
    """The percentile as the docs define it: the value's place in the feature's 101 quantiles of
    its firing values."""
    on = np.concatenate([acts[1:, feature] for acts in offline["acts"]])
    grid = np.quantile(on[on > 0].astype(np.float64), np.arange(101) / 100)
    if value < grid[0]:
        return 0.0
    if value >= grid[-1]:
        return 100.0
    i = int(np.searchsorted(grid, value, side="right")) - 1
    return i + (value - grid[i]) / (grid[i + 1] - grid[i])


def test_percentiles_in_return_sae_activations_when_asked(server, calibrated, offline):
    process, ids = server["process"], server["ids"]
    # A text the corpus has no prefix of: its activations are none of the calibration's own values,
    # so the reference (over activations that differ from the server's in the last bits) is stable.
    body = {
        "model": MODEL,
        "prompt": "Hello! The cat writes quickly, then über the capital.",
        "max_tokens": 3,
        "temperature": 0,
    }
    answer = post(
        process,
        "/v1/completions",
        {
            **body,
            "return_sae_activations": {
                "sae_id": ids["main"],
                "positions": "prompt",
                "top_k": 4,
                "percentiles": True,
            },
        },
    ).json()
    block = answer["millm"]["sae_activations"]
    assert (
        block["percentiles"]["calibrated"] is True
        and block["percentiles"]["calibrated_at"] == calibrated["result"]["created_at"]
    )
    entries = [entry for position in block["positions"][1:] for entry in position["features"]]
    assert entries and all(0 <= e["percentile"] <= 100 for e in entries)
    for entry in entries:
        assert entry["percentile"] == pytest.approx(
            percentile_reference(offline, entry["index"], entry["value"]), abs=0.05
        )
    plain = post(
        process,
        "/v1/completions",
        {
            **body,
            "return_sae_activations": {"sae_id": ids["main"], "positions": "prompt", "top_k": 4},
        },
    ).json()
    block = plain["millm"]["sae_activations"]
    assert "percentiles" not in block and all(
        "percentile" not in e for p in block["positions"] for e in p["features"]
    )


def test_percentiles_are_null_for_an_uncalibrated_sae(server, calibrated):
    process, ids = server["process"], server["ids"]
    ask = {"sae_id": ids["plain"], "positions": "prompt", "top_k": 2, "percentiles": True}
    answer = post(
        process,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": "Paris is",
            "max_tokens": 1,
            "temperature": 0,
            "return_sae_activations": ask,
        },
    ).json()
    block = answer["millm"]["sae_activations"]
    assert (
        block["percentiles"]["calibrated"] is False
        and "not calibrated" in block["percentiles"]["note"]
    )
    entries = [e for p in block["positions"] for e in p["features"]]
    assert entries and all(e["percentile"] is None for e in entries)


def test_monitoring_records_carry_percentiles_when_asked(server, calibrated):
    process, ids = server["process"], server["ids"]
    settings = {
        "enabled": True,
        "sae_id": ids["main"],
        "positions": "all",
        "top_k": 3,
        "percentiles": True,
    }
    configured = api(process, "PUT", "/api/monitoring", json=settings)
    assert configured.status_code == 200 and configured.json()["percentiles"] is True, (
        configured.text
    )
    try:
        last = api(process, "GET", "/api/monitoring/records", params={"limit": 1}).json()["data"]
        after = last[-1]["id"] if last else 0
        assert (
            post(
                process,
                "/v1/completions",
                {"model": MODEL, "prompt": TEXTS[1], "max_tokens": 3, "temperature": 0},
            ).status_code
            == 200
        )
        for _ in range(100):
            records = api(
                process, "GET", "/api/monitoring/records", params={"after": after}
            ).json()["data"]
            if records:
                break
            time.sleep(0.05)
        record = records[-1]
        assert record["percentiles"]["calibrated"] is True
        entries = [e for p in record["positions"] for e in p["features"]]
        assert entries and all(0 <= e["percentile"] <= 100 for e in entries)
    finally:
        api(process, "PUT", "/api/monitoring", json={"enabled": False, "percentiles": False})


def test_cancelling_keeps_the_earlier_calibration(server, calibrated):
    process, sae = server["process"], server["ids"]["main"]
    before = api(process, "GET", f"/api/saes/{sae}/calibration").json()["summary"]
    # ~27,000 tokens: seconds of work
    many = [f"{SUBJECTS[i % 8]} {ENDINGS[i % 6]}" for i in range(1800)]
    started = calibrate(process, sae, {"texts": many})
    assert started.status_code == 202, started.text
    job_id = started.json()["id"]
    second = calibrate(process, sae, {"texts": ["A river."]})
    assert job_id in error(second, 409, "calibration_running")["message"]
    cancelled = api(process, "DELETE", f"/api/jobs/{job_id}")
    assert cancelled.status_code == 200
    job = wait_job(process, job_id)
    assert job["state"] == "cancelled" and job["result"] is None
    assert job["progress"]["done"] < job["progress"]["total"] == 1800
    assert api(process, "GET", f"/api/saes/{sae}/calibration").json()["summary"] == before
    # The claim is released: a new calibration may start (and is cancelled at once).
    again = calibrate(process, sae, {"texts": many})
    assert again.status_code == 202
    api(process, "DELETE", f"/api/jobs/{again.json()['id']}")
    assert wait_job(process, again.json()["id"])["state"] == "cancelled"


@pytest.mark.parametrize(
    "sae, body, status, code, needle",
    [
        (
            "loose",
            {"texts": ["A river."]},
            400,
            "sae_not_attached",
            "is not attached to the loaded model",
        ),
        ("sae_000000000000", {"texts": ["A river."]}, 404, "sae_not_found", "no SAE"),
        ("main", {"texts": []}, 400, "invalid_parameter", "at least one text"),
        ("main", {}, 400, "invalid_parameter", "give corpus"),
        (
            "loose",
            {},
            400,
            "invalid_parameter",
            "give corpus",
        ),  # the body is checked before the attachment
        ("main", {"texts": [""]}, 400, "invalid_parameter", "texts[0]"),
        ("main", {"texts": ["a"], "colour": "blue"}, 400, "invalid_parameter", "colour"),
        ("main", {"texts": "A river."}, 400, "invalid_parameter", "texts"),
        ("main", {"texts": ["a"], "top_examples": 50}, 400, "invalid_parameter", "top_examples"),
        ("main", {"corpus": "demo", "texts": ["a"]}, 400, "invalid_parameter", "not both"),
        ("main", {"corpus": "demo"}, 400, "invalid_parameter", "ships no calibration corpus"),
        (
            "main",
            {"conversations": [[{"role": "tool", "content": "x"}]]},
            400,
            "invalid_parameter",
            "role",
        ),
        (
            "main",
            {
                "texts": ["The old river runs quickly to the sea. " * 60] * 80,
                "max_tokens_per_text": 1000,
            },
            400,
            "invalid_parameter",
            f"MILLM_CALIBRATION_MAX_TOKENS ({CAP})",
        ),
    ],
)
def test_refusals_before_anything_runs(server, sae, body, status, code, needle):
    sae_id = server["ids"].get(sae, sae)
    before = len(api(server["process"], "GET", "/api/jobs").json()["data"])
    response = calibrate(server["process"], sae_id, body)
    assert needle in error(response, status, code)["message"]
    # no job was started
    assert len(api(server["process"], "GET", "/api/jobs").json()["data"]) == before


def test_reading_refusals(server, calibrated):
    process, ids = server["process"], server["ids"]
    assert (
        "POST /api/saes"
        in error(
            api(process, "GET", f"/api/saes/{ids['plain']}/calibration"),
            404,
            "calibration_not_found",
        )["message"]
    )
    assert (
        error(
            api(process, "GET", f"/api/saes/{ids['main']}/calibration", params={"features": "1,x"}),
            400,
        )["param"]
        == "features"
    )
    error(
        api(process, "GET", f"/api/saes/{ids['main']}/calibration", params={"features": "128"}),
        400,
        "invalid_feature_index",
    )
    error(
        api(process, "GET", f"/api/saes/{ids['main']}/calibration", params={"model": "other"}),
        404,
        "calibration_not_found",
    )
    error(
        api(process, "DELETE", f"/api/saes/{ids['plain']}/calibration"),
        404,
        "calibration_not_found",
    )


def shipped_calibration(sae_id: str, d_sae: int) -> dict:
    """A calibration.json for an SAE: every feature fired 10 times with values 1..10 (feature 3
    never)."""
    grids = np.tile(np.quantile(np.arange(1.0, 11.0), np.arange(101) / 100), (d_sae, 1))
    grids[3] = np.nan
    features = []
    for j in range(d_sae):
        fired = j != 3
        features.append(
            {
                "index": j,
                "count": 10 * fired,
                "frequency": 0.1 * fired,
                "mean": 5.5 if fired else None,
                "max": 10.0 * fired,
                "p50": 5.5 if fired else None,
                "p90": 9.1 if fired else None,
                "p99": 9.91 if fired else None,
                "top_examples": [],
            }
        )
    summary = {
        "sae_id": sae_id,
        "model": MODEL,
        "created_at": 1.0,
        "corpus": "demo",
        "texts": 1,
        "tokens": 101,
        "positions": 100,
        "truncated_texts": 0,
        "max_tokens_per_text": 256,
        "top_examples": 0,
        "d_sae": d_sae,
        "features_fired": d_sae - 1,
        "sample_rate": 1.0,
        "duration_s": 0.1,
    }
    return {
        "kind": "millm.calibration",
        "version": 1,
        "sae_id": sae_id,
        "model": MODEL,
        "created_at": 1.0,
        "summary": summary,
        "figures": {"features": features, "grids": pack_grids(grids)},
    }


def test_a_shipped_calibration_is_imported_restored_by_delete_and_everything_survives_a_restart(
    server, calibrated, sae_dirs, tiny_dirs
):
    process, ids = server["process"], server["ids"]
    shipped_dir = sae_dirs["shipped"]
    info = read_sae(shipped_dir)[0]
    (shipped_dir / "calibration.json").write_text(
        json.dumps(shipped_calibration(info.id, info.d_sae))
    )
    registered = post(process, "/api/saes", {"path": str(shipped_dir)})
    assert registered.status_code == 201, registered.text
    shipped = api(
        process, "GET", f"/api/saes/{info.id}/calibration", params={"features": "2,3"}
    ).json()
    assert shipped["summary"]["created_at"] == 1.0
    assert [f["p90"] for f in shipped["features"]] == [9.1, None]
    # A calibration of its own replaces it; DELETE brings the shipped one back.
    assert post(process, f"/api/saes/{info.id}/attach", {}).status_code == 200
    assert (
        wait_job(process, calibrate(process, info.id, {"texts": TEXTS[:2]}).json()["id"])["state"]
        == "succeeded"
    )
    own = api(process, "GET", f"/api/saes/{info.id}/calibration").json()["summary"]
    assert own["created_at"] > 1.0 and own["texts"] == 2
    deleted = api(process, "DELETE", f"/api/saes/{info.id}/calibration")
    assert deleted.status_code == 200 and deleted.json()["restored_shipped"] is True
    assert (
        api(process, "GET", f"/api/saes/{info.id}/calibration").json()["summary"]["created_at"]
        == 1.0
    )
    assert (
        wait_job(process, calibrate(process, info.id, {"texts": TEXTS[:3]}).json()["id"])["state"]
        == "succeeded"
    )

    main = api(
        process, "GET", f"/api/saes/{ids['main']}/calibration", params={"features": "0,5"}
    ).json()
    process.stop()
    server["process"] = process = start_server(server["home"], tiny_dirs)
    assert (
        api(
            process, "GET", f"/api/saes/{ids['main']}/calibration", params={"features": "0,5"}
        ).json()
        == main
    )
    # not the shipped one
    assert api(process, "GET", f"/api/saes/{info.id}/calibration").json()["summary"]["texts"] == 3
    ask = {"sae_id": ids["main"], "positions": "prompt", "top_k": 2, "percentiles": True}
    answer = post(
        process,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": TEXTS[0],
            "max_tokens": 1,
            "temperature": 0,
            "return_sae_activations": ask,
        },
    )
    assert answer.json()["millm"]["sae_activations"]["percentiles"]["calibrated"] is True


def test_a_token_budget_reads_the_texts_in_order_up_to_it(server, offline):
    """Runs last: it calibrates the plain SAE, which test_reading_refusals expects uncalibrated."""
    process, sae = server["process"], server["ids"]["plain"]
    lengths = [len(ids) for ids in offline["prompts"][: len(TEXTS)]]
    budget = sum(lengths[:3]) + 2  # three whole texts and two tokens of the fourth
    job = wait_job(
        process, calibrate(process, sae, {"texts": TEXTS, "max_tokens": budget}).json()["id"]
    )
    assert job["state"] == "succeeded", job
    summary = api(process, "GET", f"/api/saes/{sae}/calibration").json()["summary"]
    assert (summary["texts"], summary["tokens"], summary["positions"]) == (4, budget, budget - 4)
    assert summary["budget"] == {
        "max_tokens": budget,
        "max_seconds": None,
        "texts_offered": len(TEXTS),
        "tokens_offered": sum(lengths),
        "stopped_by": "max_tokens",
    }
    # A corpus over MILLM_CALIBRATION_MAX_TOKENS is taken when its budget is under it.
    many = ["The old river runs quickly to the sea. " * 60] * 80
    within = calibrate(
        process, sae, {"texts": many, "max_tokens_per_text": 1000, "max_tokens": 500}
    )
    assert within.status_code == 202, within.text
    assert wait_job(process, within.json()["id"])["state"] == "succeeded"


def test_a_time_budget_keeps_what_was_read_by_then(server):
    process, sae = server["process"], server["ids"]["plain"]
    many = [f"{SUBJECTS[i % 8]} {ENDINGS[i % 6]}" for i in range(1800)]
    job = wait_job(
        process, calibrate(process, sae, {"texts": many, "max_seconds": 0.5}).json()["id"]
    )
    assert job["state"] == "succeeded", job
    summary = api(process, "GET", f"/api/saes/{sae}/calibration").json()["summary"]
    assert 0 < summary["texts"] < 1800 and summary["budget"]["stopped_by"] == "max_seconds"
    assert summary["budget"]["texts_offered"] == 1800
    assert summary["duration_s"] < 30
    for body in ({"texts": ["a b"], "max_seconds": 0}, {"texts": ["a b"], "max_tokens": 1}):
        error(calibrate(process, sae, body), 400, "invalid_parameter")
