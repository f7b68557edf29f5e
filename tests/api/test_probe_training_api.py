"""POST /api/probes/train on a live server (tiny Llama): the job's held-out accuracy and AUC against
the same computation done here on residuals captured offline (a stock transformers model and a
hook), the seeded stratified split, the stored probe, and the refusals before any job starts."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, roc_auc_score
from sklearn.model_selection import train_test_split

from millm.engine.prompts import chat_prompt_ids
from tests.api.clients import MODEL, api, error, post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

MAX_TEXTS, MAX_TOKENS = 12, 1000  # the discovery caps of the server under test
SEA = [
    "The pirate ship sails across the stormy sea.",
    "Sailors raise the black flag at dawn.",
    "The captain buries treasure on the island.",
    "Waves crash against the wooden hull of the ship.",
    "The crew sings songs of the sea and gold.",
    "A parrot squawks from the mast of the ship.",
    "They sail the ocean looking for treasure.",
    "The old sailor tells stories of the sea.",
]
OFFICE = [
    "The meeting was moved to Thursday afternoon.",
    "Please sign the forms before Friday.",
    "The report has three sections and an appendix.",
    "I need to update the spreadsheet before lunch.",
    "The printer on this floor is out of paper.",
    "Our office is on the second floor.",
    "We talked about the schedule for next month.",
    "The manager approved the budget today.",
]
CHATS = [
    [
        {"role": "user", "content": "Tell me about pirate ships."},
        {"role": "assistant", "content": "They sail the sea for treasure."},
    ],
    [
        {"role": "user", "content": "What do sailors sing?"},
        {"role": "assistant", "content": "Songs of the sea and the waves."},
    ],
]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    env = {
        "MILLM_DISCOVERY_MAX_TEXTS": str(MAX_TEXTS),
        "MILLM_DISCOVERY_MAX_TOKENS": str(MAX_TOKENS),
    }
    process = ServerProcess(
        tmp_path_factory.mktemp("train-home"), ["--model", str(tiny_dirs["llama"])], env=env
    ).wait_ready()
    try:
        base = tmp_path_factory.mktemp("train-saes")
        process.sae = post(
            process, "/api/saes", {"path": str(build_saelens(base / "main", layer=1, seed=83))}
        ).json()["id"]
        process.loose = post(
            process, "/api/saes", {"path": str(build_saelens(base / "loose", layer=2, seed=84))}
        ).json()["id"]
        assert post(process, f"/api/saes/{process.sae}/attach", {}).status_code == 200
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def offline(tiny_dirs):
    """Each text's residuals after a block at every position but the first (a stock transformers
    model and a hook)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    captured = {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(
            lambda module, args, output, i=i: captured.__setitem__(
                i, output[0] if isinstance(output, tuple) else output
            )
        )

    def read(ids: list[int], block: int) -> np.ndarray:
        with torch.no_grad():
            model(torch.tensor([ids]))
        return captured[block][0, 1:].double().numpy()

    def texts(items: list[str], block: int) -> list[np.ndarray]:
        return [read(tokenizer(text)["input_ids"], block) for text in items]

    def chats(items: list[list[dict]], block: int) -> list[np.ndarray]:
        return [read(chat_prompt_ids(tokenizer, messages), block) for messages in items]

    return {"texts": texts, "chats": chats}


def wait_job(server, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api(server, "GET", f"/api/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running after {timeout} s")


def train(server, body: dict) -> dict:
    started = post(server, "/api/probes/train", body)
    assert started.status_code == 202, started.text
    assert (
        started.json()["kind"] == "probe-training" and started.json()["progress"]["unit"] == "texts"
    )
    job = wait_job(server, started.json()["id"])
    assert job["state"] == "succeeded", job
    return job


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def held_out_figures(
    x: list[np.ndarray], labels: np.ndarray, test: list[int], detector: dict
) -> dict:
    """With the stored weights and threshold on the held-out texts: the verdict's accuracy per text
    (fired: its largest probability reaches the threshold) and the AUC of those largest
    probabilities; accuracy and AUC per position (labelled by its text)."""
    w, b, threshold = np.asarray(detector["weights"]), detector["bias"], detector["threshold"]
    texts = np.array([sigmoid(x[i] @ w + b).max() for i in test])
    positions = sigmoid(np.concatenate([x[i] @ w + b for i in test]))
    position_labels = np.concatenate([np.full(len(x[i]), labels[i]) for i in test])
    return {
        "accuracy": accuracy_score(labels[test], texts >= threshold),
        "auc": roc_auc_score(labels[test], texts),
        "position_accuracy": accuracy_score(position_labels, positions >= threshold),
        "position_auc": roc_auc_score(position_labels, positions),
    }


def assert_figures(result: dict, want: dict) -> None:
    assert result["accuracy"] == want["accuracy"] and result["position_accuracy"] == pytest.approx(
        want["position_accuracy"], abs=1e-12
    )
    assert result["auc"] == pytest.approx(want["auc"], abs=1e-9) and result[
        "position_auc"
    ] == pytest.approx(want["position_auc"], abs=1e-9)


def test_held_out_accuracy_and_auc_equal_a_computation_on_captured_residuals(server, offline):
    job = train(
        server,
        {
            "name": "sea-talk",
            "positive": {"texts": SEA},
            "negative": {"texts": OFFICE},
            "layer": 2,
            "seed": 7,
            "threshold": 0.6,
        },
    )
    assert job["progress"] == {"done": 16, "total": 16, "unit": "texts"}
    result, probe = job["result"]["metrics"], job["result"]["probe"]

    labels = np.array([1] * len(SEA) + [0] * len(OFFICE))
    train_idx, test_idx = train_test_split(
        np.arange(16), test_size=0.25, stratify=labels, random_state=7
    )
    held = sorted(test_idx.tolist())
    assert result["held_out_texts"] == {
        "positive": [i for i in held if i < 8],
        "negative": [i - 8 for i in held if i >= 8],
    }
    assert (result["train"], result["held_out"], result["threshold"]) == (12, 4, 0.6)

    detector = probe["document"]["detector"]
    assert (detector["type"], detector["layer"], detector["hook_point"], detector["threshold"]) == (
        "linear",
        2,
        "resid_post",
        0.6,
    )
    assert len(detector["weights"]) == 64
    x = offline["texts"](SEA, 2) + offline["texts"](OFFICE, 2)
    assert_figures(result, held_out_figures(x, labels, held, detector))
    assert result["train_positions"] == sum(len(x[i]) for i in train_idx)
    trained = sorted(train_idx.tolist())
    train_peaks = np.array(
        [sigmoid(x[i] @ np.asarray(detector["weights"]) + detector["bias"]).max() for i in trained]
    )
    assert result["train_accuracy"] == accuracy_score(labels[trained], train_peaks >= 0.6)

    training = detector["training"]
    assert training["model"] == MODEL and (
        training["positives"],
        training["negatives"],
        training["held_out"],
        training["seed"],
    ) == (8, 8, 4, 7)
    assert {k: training[k] for k in ("accuracy", "auc", "position_accuracy", "position_auc")} == {
        k: result[k] for k in ("accuracy", "auc", "position_accuracy", "position_auc")
    }
    stored = api(server, "GET", "/api/probes/sea-talk").json()
    assert stored == probe and stored["active"] is False
    assert (
        probe["document"]["description"]
        == "linear probe trained on 8 positive and 8 negative texts"
    )


def test_an_sae_names_where_to_read_and_conversations_are_examples(server, offline):
    body = {
        "name": "sea-chat",
        "description": "sea in chats",
        "positive": {"conversations": CHATS + [[{"role": "user", "content": t}] for t in SEA[:2]]},
        "negative": {"texts": OFFICE[:4]},
        "sae_id": server.sae,
        "held_out": 0.5,
    }
    job = train(server, body)
    result, detector = job["result"]["metrics"], job["result"]["probe"]["document"]["detector"]
    assert (detector["layer"], detector["hook_point"]) == (1, "resid_post")
    conversations = body["positive"]["conversations"]
    x = offline["chats"](conversations, 1) + offline["texts"](OFFICE[:4], 1)
    labels = np.array([1] * 4 + [0] * 4)
    held = result["held_out_texts"]["positive"] + [
        i + 4 for i in result["held_out_texts"]["negative"]
    ]
    assert len(held) == 4 and len(result["held_out_texts"]["positive"]) == 2
    assert_figures(result, held_out_figures(x, labels, held, detector))


@pytest.mark.parametrize(
    "change, status, code, param",
    [
        ({"positive": {"texts": SEA[:1]}}, 400, "invalid_parameter", "positive.texts"),
        (
            {"negative": {"conversations": CHATS[:1]}},
            400,
            "invalid_parameter",
            "negative.conversations",
        ),
        (
            {"positive": {"texts": SEA + OFFICE[:5]}},
            400,
            "invalid_parameter",
            "positive.texts",
        ),  # over MILLM_DISCOVERY_MAX_TEXTS
        (
            {"positive": {"texts": [t * 3 for t in SEA + OFFICE[:4]]}},
            400,
            "invalid_parameter",
            "positive.texts[11]",
        ),  # over MILLM_DISCOVERY_MAX_TOKENS
        (
            {"positive": {"texts": ["", *SEA[:2]]}},
            400,
            "invalid_parameter",
            "positive.texts[0]",
        ),  # the BOS only: no position after the sink
        ({"layer": None}, 400, "invalid_parameter", "layer"),
        ({"sae_id": "sae_x"}, 400, "invalid_parameter", "layer"),  # both
        ({"layer": 4}, 400, "invalid_parameter", "layer"),
        ({"layer": None, "hook_point": "resid_pre"}, 400, "invalid_parameter", "layer"),
        ({"held_out": 0.7}, 400, "invalid_parameter", "held_out"),
        (
            {"held_out": 0.1, "positive": {"texts": SEA[:2]}, "negative": {"texts": OFFICE[:2]}},
            400,
            "invalid_parameter",
            "held_out",
        ),
        ({"name": "taken"}, 409, "probe_exists", "name"),
        ({"colour": "blue"}, 400, "invalid_parameter", "colour"),
    ],
)
def test_refusals_before_any_job_starts(server, change, status, code, param):
    if change.get("name") == "taken" and api(server, "GET", "/api/probes/taken").status_code == 404:
        post(
            server,
            "/api/probes",
            {"name": "taken", "detector": {"type": "linear", "layer": 1, "weights": [0.0] * 64}},
        )
    body = {
        "name": "refused",
        "positive": {"texts": SEA[:4]},
        "negative": {"texts": OFFICE[:4]},
        "layer": 1,
        **change,
    }
    body = {k: v for k, v in body.items() if v is not None}
    jobs = len(api(server, "GET", "/api/jobs").json()["data"])
    refused = error(post(server, "/api/probes/train", body), status, code)
    if param is not None:
        assert refused["param"] == param, refused
    assert len(api(server, "GET", "/api/jobs").json()["data"]) == jobs


def test_an_sae_that_is_not_attached_is_refused(server):
    body = {
        "name": "loose",
        "positive": {"texts": SEA[:4]},
        "negative": {"texts": OFFICE[:4]},
        "sae_id": server.loose,
    }
    assert (
        error(post(server, "/api/probes/train", body), 400, "sae_not_attached")["param"] == "sae_id"
    )
