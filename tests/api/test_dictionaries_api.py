"""Dictionaries on a live server (tiny Llama): an SAE trained by SAELens on activations millm reads,
saved in SAELens's format with its provenance (SAELens loads it and encodes as millm does),
registered, attached and graded in one job; a grade's figures against a float64 reference written
here; a cancel; and every bad request refused before anything runs."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from millm.engine.prompts import completion_prompt_ids
from millm.interp.sae_files import content_id
from millm.kernel.books.transcoders import read_set
from tests.api.clients import api, error, finished_job, post
from tests.support.dictionary_reference import reference, set_reference, transcoder_reference
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

WORDS = "the sea ship sails wind harbour old trees forest moon night city street quiet winter snow"
TEXTS = [
    " ".join(WORDS.split()[(i * 7) % 13 :] + WORDS.split()[: (i * 7) % 13]) * 3 for i in range(40)
]


def training(server, training_id: str, timeout: float = 240) -> dict:
    """The training's view once it is no longer running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = api(server, "GET", f"/api/saes/trainings/{training_id}").json()
        if view["state"] != "running":
            return view
        time.sleep(0.2)
    raise AssertionError(f"training {training_id} did not end")


def train_body(**extra) -> dict:
    return {
        "layer": 1,
        "d_sae": 128,
        "k": 8,
        "training_tokens": 6144,
        "batch_tokens": 256,
        "lr": 0.01,
        "corpus": {"texts": TEXTS, "context_size": 32},
        **extra,
    }


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    home = tmp_path_factory.mktemp("dictionaries-home")
    # a training's state capped at 1 MiB: 128 latents over the width of 64 fit, 1,024 do not
    env = {"MILLM_DICTIONARY_MAX_BYTES": str(1 << 20)}
    process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])], env=env)
    try:
        process.wait_ready()
        process.home = home
        yield process
    finally:
        process.stop()


def test_a_topk_sae_is_trained_saved_registered_attached_and_graded(server, tiny_dirs):
    started = post(server, "/api/saes/train", train_body(then={"attach": True}))
    assert started.status_code == 202, started.text
    view = training(server, started.json()["id"])
    assert view["state"] == "succeeded", view
    progress, result = view["progress"], view["result"]
    assert progress["steps"] == progress["total_steps"] == 24
    assert progress["tokens"] == 24 * 256
    curve = progress["curve"]
    assert len(curve) == 24
    assert curve[-1]["loss"] < 0.5 * curve[0]["loss"] and curve[-1]["fve"] > 0.5  # it learned
    assert all(point["l0"] == 8 for point in curve)  # TopK: exactly k per token

    folder = Path(result["path"])
    assert folder == server.home / "dictionaries" / "tiny-llama-L1-topk-128"
    config = json.loads((folder / "cfg.json").read_text())
    provenance = config["metadata"]["millm_provenance"]
    assert provenance["model"] == "tiny-llama" and provenance["layer"] == 1
    assert provenance["tokens"] == 24 * 256 and provenance["corpus"]["source"] == "texts"
    assert provenance["library"]["sae_lens"] and provenance["hyperparameters"]["k"] == 8
    assert config["metadata"]["hook_name"] == "blocks.1.hook_resid_post"

    # SAELens itself loads the file and encodes as the server's copy does
    from sae_lens import SAE

    from millm.interp.formats import read_sae

    theirs = SAE.load_from_disk(str(folder))
    _, ours = read_sae(folder)
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.allclose(theirs.encode(x), ours.encode(x), atol=1e-5)
    assert torch.allclose(theirs.decode(theirs.encode(x)), ours.decode(ours.encode(x)), atol=1e-5)

    sae = api(server, "GET", f"/api/saes/{result['sae_id']}").json()
    assert sae["attached"] is True and sae["attached_layer"] == 1 and sae["k"] == 8
    assert result["grade"]["state"] == "succeeded"
    cards = api(server, "GET", f"/api/saes/{result['sae_id']}/grades").json()["data"]
    assert len(cards) == 1 and cards[0]["corpus"]["part"] == "held_out"
    figures = cards[0]["figures"]
    assert figures["l0"] == 8.0
    assert 0.5 < figures["fraction_variance_explained"] < 1
    assert figures["ce_loss_spliced"] > 0 and figures["kl_spliced"] > 0
    listed = api(server, "GET", "/api/saes/trainings").json()["data"]
    assert [t["id"] for t in listed][:1] == [view["id"]]
    # the name is taken now: nothing already saved is overwritten
    error(post(server, "/api/saes/train", train_body()), 409, "dictionary_exists")


@pytest.mark.parametrize(
    ("architecture", "extra", "saved_as"),
    [
        ("batchtopk", {"k": 8}, "jumprelu"),
        ("jumprelu", {"l0_coefficient": 0.5}, "jumprelu"),
        ("matryoshka_batchtopk", {"k": 8, "matryoshka_widths": [32, 128]}, "jumprelu"),
    ],
)
def test_every_architecture_trains_and_loads(server, architecture, extra, saved_as):
    body = train_body(architecture=architecture, name=f"arch-{architecture}", then={"grade": False})
    body.pop("k")
    started = post(server, "/api/saes/train", {**body, **extra})
    assert started.status_code == 202, started.text
    view = training(server, started.json()["id"])
    assert view["state"] == "succeeded", view
    config = json.loads((Path(view["result"]["path"]) / "cfg.json").read_text())
    assert config["architecture"] == saved_as
    assert config["metadata"]["training_architecture"] == architecture
    sae = api(server, "GET", f"/api/saes/{view['result']['sae_id']}").json()
    assert sae["architecture"] == saved_as and sae["attached"] is False


def mlp_pairs(model_dir: Path, texts: list[str]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each block's MLP input and output on `texts`, read by hooks on the transformers model
    itself (the sink's position left out, as a training does)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    hooks = [
        layer.mlp.register_forward_hook(
            lambda _m, inputs, output, b=b: seen.setdefault(b, []).append(
                (inputs[0][0, 1:].detach(), output[0, 1:].detach())
            )
        )
        for b, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        for text in texts:
            model(torch.tensor([completion_prompt_ids(tokenizer, text)]))
    for hook in hooks:
        hook.remove()
    return {
        b: tuple(torch.cat(side) for side in zip(*pairs, strict=True)) for b, pairs in seen.items()
    }


def test_a_transcoder_set_is_trained_registered_and_draws_attribution_graphs(server, tiny_dirs):
    from sae_lens.saes.transcoder import JumpReLUSkipTranscoder

    options = {"kind": "transcoder_set", "skip": True, "d_sae": 64, "epochs": 4, "then": {}}
    body = {**train_body(**options), "training_tokens": 4 * 6144, "layer": None}
    started = post(server, "/api/saes/train", body)
    assert started.status_code == 202, started.text
    view = training(server, started.json()["id"])
    assert view["state"] == "succeeded", view
    assert view["request"]["architecture"] == "batchtopk"  # a transcoder's default
    folder = Path(view["result"]["path"])
    assert folder == server.home / "dictionaries" / "tiny-llama-transcoders-batchtopk-64"
    found = api(server, "GET", f"/api/transcoders/{view['result']['transcoder_set_id']}").json()
    assert found["layers"] == [0, 1, 2] and found["architecture"] == "jumprelu"

    curve = view["progress"]["curve"]
    assert curve[-1]["fve"] > 0.5 > curve[0]["fve"]
    # each block's transcoder, as SAELens loads it, predicts the model's own MLP output
    pairs = mlp_pairs(tiny_dirs["llama"], TEXTS[:8])
    for block, (x, y) in pairs.items():
        theirs = JumpReLUSkipTranscoder.load_from_disk(folder / f"layer_{block}")
        provenance = theirs.cfg.metadata.millm_provenance
        assert provenance["kind"] == "transcoder_set" and provenance["hook_point"] == "mlp"
        assert theirs.cfg.metadata.hook_name_out == f"blocks.{block}.hook_mlp_out"
        with torch.no_grad():
            predicted = theirs(x)
        explained = 1 - (predicted - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
        # an untrained one explains nothing (below 0); short, it learns part of each block's map
        assert explained > 0.25, (block, float(explained))

    graph = post(server, "/api/attribution", {"text": TEXTS[0][:60], "transcoders": found["id"],
                                               "max_feature_nodes": 32, "verify": 0})  # fmt: skip
    assert graph.status_code == 200, graph.text
    assert graph.json()["method"] == "transcoders"
    assert any(node["kind"] == "feature" for node in graph.json()["nodes"])


def test_a_grade_equals_a_float64_reference(server, tiny_dirs, tmp_path):
    sae_dir = build_saelens(tmp_path / "graded", layer=1, seed=5, architecture="standard")
    sae = post(server, "/api/saes", {"path": str(sae_dir)}).json()["id"]
    assert post(server, f"/api/saes/{sae}/attach", {}).status_code == 200
    texts = TEXTS[:6]
    corpus = {"texts": texts, "context_size": 1024}  # one window per text, as below
    started = post(server, f"/api/saes/{sae}/grade", {"corpus": corpus})
    assert started.status_code == 202, started.text
    card = finished_job(server, started.json()["id"])["result"]
    assert card == api(server, "GET", f"/api/saes/{sae}/grades").json()["data"][0]
    figures = card["figures"]

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    expected = reference(
        tiny_dirs["llama"], sae_dir, [completion_prompt_ids(tokenizer, t) for t in texts]
    )
    assert card["tokens"] == expected.pop("tokens")
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, rel=2e-4, abs=2e-5), name
    post(server, f"/api/saes/{sae}/detach", {})


def test_a_transcoders_grade_equals_a_float64_reference(server, tiny_dirs, tmp_path):
    from tests.support.tiny_transcoders import build_clt, build_transcoder_set

    block_file = build_transcoder_set(tmp_path / "set", seed=7, skip=True) / "layer_1.safetensors"
    sae = post(server, "/api/saes", {"path": str(block_file)}).json()["id"]
    assert post(server, f"/api/saes/{sae}/attach", {}).status_code == 200
    texts = TEXTS[:6]
    try:
        corpus = {"texts": texts, "context_size": 1024}
        started = post(server, f"/api/saes/{sae}/grade", {"corpus": corpus})
        assert started.status_code == 202, started.text
        card = finished_job(server, started.json()["id"])["result"]
    finally:
        post(server, f"/api/saes/{sae}/detach", {})
    assert card["hook_point"] == "mlp" and card["layer"] == 1
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    ids = [completion_prompt_ids(tokenizer, t) for t in texts]
    expected = transcoder_reference(tiny_dirs["llama"], block_file, 1, ids)
    assert card["tokens"] == expected.pop("tokens")
    for name, value in expected.items():
        assert card["figures"][name] == pytest.approx(value, rel=2e-4, abs=2e-5), name

    # a cross-layer transcoder's block writes into every later block: not one MLP's replacement
    clt = post(
        server, "/api/saes", {"path": str(build_clt(tmp_path / "clt") / "W_enc_0.safetensors")}
    )
    clt_id = clt.json()["id"]
    assert post(server, f"/api/saes/{clt_id}/attach", {}).status_code == 200
    try:
        refused = error(post(server, f"/api/saes/{clt_id}/grade", {"corpus": corpus}), 400)
        assert refused["code"] == "not_gradable" and refused["param"] == "sae_id"
    finally:
        post(server, f"/api/saes/{clt_id}/detach", {})


def test_a_transcoder_sets_grade_equals_a_float64_reference(server, tiny_dirs, tmp_path):
    from tests.support.tiny_transcoders import build_clt, build_transcoder_set

    directory = build_transcoder_set(tmp_path / "graded-set", seed=3, skip=True)
    found = post(server, "/api/transcoders", {"path": str(directory)}).json()["id"]
    texts = TEXTS[:4]
    corpus = {"texts": texts, "context_size": 1024}
    started = post(server, f"/api/transcoders/{found}/grade", {"corpus": corpus})
    assert started.status_code == 202, started.text
    card = finished_job(server, started.json()["id"])["result"]
    assert card["transcoder_set_id"] == found and card["hook_point"] == "mlp"
    assert api(server, "GET", f"/api/transcoders/{found}/grades").json()["data"] == [card]

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    ids = [completion_prompt_ids(tokenizer, t) for t in texts]
    expected = set_reference(tiny_dirs["llama"], directory, ids)
    assert card["tokens"] == expected.pop("tokens")
    figures = card["figures"]
    blocks = expected.pop("blocks")
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, rel=2e-4, abs=2e-5), name
    assert [entry["block"] for entry in figures["blocks"]] == [0, 1, 2]
    for mine, theirs in zip(figures["blocks"], blocks, strict=True):
        for name, value in theirs.items():
            assert mine[name] == pytest.approx(value, rel=2e-4, abs=2e-5), (mine["block"], name)
    fve = [entry["fraction_variance_explained"] for entry in blocks]
    assert figures["mean_fraction_variance_explained"] == pytest.approx(sum(fve) / 3, rel=2e-4)

    # the card shipped beside the set's copy (another checkout: another path, so another id) is
    # the copy's, while it is a card of these very weights
    files = read_set(directory).files
    weights_id = content_id(*(files[block] for block in sorted(files)))
    shipped = [shutil.copytree(directory, tmp_path / name) for name in ("shipped", "changed")]
    for folder, weights in zip(shipped, (weights_id, "sae_000000000000"), strict=True):
        (folder / "grade.json").write_text(json.dumps({**card, "weights_id": weights}))
    copies = [post(server, "/api/transcoders", {"path": str(f)}).json()["id"] for f in shipped]
    (kept,) = api(server, "GET", f"/api/transcoders/{copies[0]}/grades").json()["data"]
    assert kept == {**card, "weights_id": weights_id, "id": f"{card['id']}_{copies[0]}",
                    "transcoder_set_id": copies[0]}  # fmt: skip
    assert api(server, "GET", f"/api/transcoders/{copies[0]}/grades").json()["data"] == [kept]
    assert api(server, "GET", f"/api/transcoders/{copies[1]}/grades").json()["data"] == []

    # what cannot be graded is refused before anything runs
    clt = post(server, "/api/transcoders", {"path": str(build_clt(tmp_path / "clt-set"))}).json()
    refused = error(post(server, f"/api/transcoders/{clt['id']}/grade", {"corpus": corpus}), 400)
    assert refused["code"] == "not_gradable" and refused["param"] == "set_id"
    missing = post(server, "/api/transcoders/tc_nope/grade", {"corpus": corpus})
    error(missing, 404, "transcoder_set_not_found")
    for set_id in (found, clt["id"], *copies):
        api(server, "DELETE", f"/api/transcoders/{set_id}")


def test_a_cancelled_training_ends_cancelled_and_saves_nothing(server):
    body = train_body(name="cancelled", training_tokens=50_000_000, corpus={"texts": TEXTS * 50})
    started = post(server, "/api/saes/train", body)
    assert started.status_code == 202, started.text
    training_id = started.json()["id"]
    deadline = time.monotonic() + 60
    while api(server, "GET", f"/api/saes/trainings/{training_id}").json()["progress"]["steps"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    again = post(server, "/api/saes/train", body)  # the name is being made
    assert training_id in error(again, 409, "dictionary_exists")["message"]
    assert api(server, "DELETE", f"/api/saes/trainings/{training_id}").status_code == 200
    view = training(server, training_id)
    assert view["state"] == "cancelled" and view["result"] is None
    assert not (server.home / "dictionaries" / "cancelled").exists()


def test_bad_requests_are_refused_before_anything_runs(server, tmp_path):
    bad = [
        ({"layer": 3}, 400, "layer"),
        ({"d_sae": 1024}, 400, "d_sae"),  # over MILLM_DICTIONARY_MAX_BYTES
        ({"k": 200}, 400, "k"),
        ({"architecture": "jumprelu"}, 400, None),  # k given to a JumpReLU
        ({"buffer_tokens": 300}, 400, "buffer_tokens"),  # under two batches
        ({"matryoshka_widths": [32, 128]}, 400, None),  # only for matryoshka
        ({"corpus": {"texts": TEXTS, "files": ["/etc/hostname"]}}, 400, None),  # two sources
        ({"corpus": {"files": ["/etc/hostname"]}}, 403, "files[0]"),
        ({"corpus": {"shipped_by": "nope"}}, 404, None),
        ({"then": {"calibrate": {"corpus": "demo"}}}, 400, None),  # calibrate needs attach
        ({"then": {"attach": True, "label": True}}, 400, None),  # label needs calibrate
        (
            {
                "then": {
                    "attach": True,
                    "label": True,
                    "calibrate": {"corpus": "demo", "top_examples": 0},
                }
            },
            400,
            None,
        ),  # no examples
        ({"name": "../up"}, 400, None),
        ({"dead_window_tokens": 10}, 400, None),
        ({"skip": True}, 400, None),  # a transcoder's
        ({"kind": "transcoder_set"}, 400, None),  # with a layer
        ({"kind": "transcoder_set", "layer": None, "architecture": "topk"}, 400, None),
        ({"kind": "transcoder_set", "layer": None, "then": {"attach": True}}, 400, None),
        ({"kind": "transcoder_set", "layer": None, "d_sae": 512}, 400, "d_sae"),  # 3 blocks' state
    ]
    for extra, status, param in bad:
        response = post(server, "/api/saes/train", {**train_body(), **extra})
        body = error(response, status)
        if param is not None:
            assert body["param"] == param, (extra, body)
    (server.home / "dataset").mkdir()
    missing = {"corpus": {"dataset": str(server.home / "dataset")}}
    assert error(post(server, "/api/saes/train", {**train_body(), **missing}), 400)["param"] == (
        "dataset"
    )
    error(api(server, "GET", "/api/saes/trainings/train_nope"), 404, "training_not_found")
    sae_dir = build_saelens(tmp_path / "unattached", layer=1, seed=9)
    sae = post(server, "/api/saes", {"path": str(sae_dir)}).json()["id"]
    grade = {"corpus": {"texts": ["a b c d"]}}
    error(post(server, f"/api/saes/{sae}/grade", grade), 400, "sae_not_attached")
    assert api(server, "GET", "/api/saes/trainings").status_code == 200


def test_a_training_resumes_from_its_checkpoint_after_a_kill(tiny_dirs, tmp_path):
    home = tmp_path / "resume-home"
    first = ServerProcess(home, ["--model", str(tiny_dirs["llama"])]).wait_ready()
    body = train_body(
        name="resumed",
        training_tokens=400 * 256,
        checkpoint_every_tokens=2048,
        corpus={"texts": TEXTS * 120, "context_size": 32},
    )
    training_id = post(first, "/api/saes/train", body).json()["id"]

    def checkpointed() -> int:
        return api(first, "GET", f"/api/saes/trainings/{training_id}").json()["progress"]["steps"]

    deadline = time.monotonic() + 120
    while (seen := checkpointed()) < 40:  # past a few checkpoints, far from the end
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    second = ServerProcess(home, ["--model", str(tiny_dirs["llama"])]).wait_ready()
    try:
        view = training(second, training_id)
        assert view["state"] == "succeeded", view
        provenance = json.loads((Path(view["result"]["path"]) / "cfg.json").read_text())[
            "metadata"
        ]["millm_provenance"]
        [resumed_at] = provenance["resumed_at_tokens"]
        # from its last checkpoint: not from the start, nothing past what it had done
        assert 2048 <= resumed_at <= (seen + 8) * 256 and resumed_at % 256 == 0
        assert provenance["tokens"] == 400 * 256 and provenance["steps"] == 400, json.dumps(
            provenance
        )
        assert provenance["corpus_exhausted"] is False
        assert view["progress"]["curve"][-1]["step"] == 400
    finally:
        second.stop()


def test_epochs_replay_the_activations_read_once(server):
    body = train_body(name="epochs", epochs=4, training_tokens=32 * 256, then={"grade": False})
    started = post(server, "/api/saes/train", body)
    assert started.status_code == 202, started.text
    view = training(server, started.json()["id"])
    assert view["state"] == "succeeded", view
    progress = view["progress"]
    assert progress["rows_read"] == 2048  # a quarter of the 8192 trained on, read once
    assert progress["tokens"] == 8192 and progress["steps"] == 32
    assert progress["epoch"] >= 4
    provenance = json.loads((Path(view["result"]["path"]) / "cfg.json").read_text())["metadata"][
        "millm_provenance"
    ]
    assert provenance["activations_read"] == 2048
    work = server.home / "dictionaries" / ".work" / view["id"]
    assert not work.exists()  # the checkpoint and the activation cache went with the training


def test_a_grade_card_shipped_beside_the_weights_is_kept_once(server, tmp_path):
    sae_dir = build_saelens(tmp_path / "shipped-grade", layer=1, seed=13)
    sae = post(server, "/api/saes", {"path": str(sae_dir)}).json()["id"]
    card = {"id": "grade_shipped1", "object": "dictionary_grade", "sae_id": sae,
            "model": "tiny-llama", "created_at": 1.0, "tokens": 100,
            "corpus": {"source": "texts", "name": "shipped", "part": "all"},
            "figures": {"fraction_variance_explained": 0.5, "l0": 8.0}}  # fmt: skip
    (sae_dir / "grade.json").write_text(json.dumps(card))
    assert api(server, "GET", f"/api/saes/{sae}/grades").json()["data"] == [card]
    assert api(server, "GET", f"/api/saes/{sae}/grades").json()["data"] == [card]  # kept once
    other_dir = build_saelens(tmp_path / "other-weights", layer=1, seed=14)
    other = post(server, "/api/saes", {"path": str(other_dir)}).json()["id"]
    (other_dir / "grade.json").write_text(json.dumps(card))  # a card of other weights
    assert api(server, "GET", f"/api/saes/{other}/grades").json()["data"] == []
    (other_dir / "grade.json").write_text("not json")
    assert api(server, "GET", f"/api/saes/{other}/grades").json()["data"] == []


def test_a_saved_dataset_trains_and_the_chain_calibrates_labels_and_explains(server, tmp_path):
    import datasets

    folder = tmp_path / "saved-dataset"
    datasets.Dataset.from_dict({"body": TEXTS * 4, "n": list(range(160))}).save_to_disk(folder)
    then = {
        "attach": True,
        "grade": False,
        "calibrate": {"texts": TEXTS[:8], "top_examples": 3},
        "label": True,
        "explain": {"features": [0, 1], "top_examples": 2, "held_out": 2, "quantiles": 1,
                    "width": 8, "max_tokens": 16},
    }  # fmt: skip
    corpus = {"dataset": str(folder), "column": "body", "context_size": 32}
    body = train_body(name="from-dataset", training_tokens=2048, corpus=corpus, then=then)
    started = post(server, "/api/saes/train", body)
    assert started.status_code == 202, started.text
    view = training(server, started.json()["id"])
    assert view["state"] == "succeeded", view
    provenance = json.loads((Path(view["result"]["path"]) / "cfg.json").read_text())["metadata"][
        "millm_provenance"
    ]
    assert provenance["corpus"] == {"source": "dataset", "name": str(folder), "context_size": 32}
    result, sae = view["result"], view["result"]["sae_id"]
    assert "grade" not in result and result["calibration"]["state"] == "succeeded"
    calibration = api(server, "GET", f"/api/saes/{sae}/calibration").json()["summary"]
    assert calibration["texts"] == 8
    fired = calibration["features_fired"]
    assert result["labels"] == {"state": "succeeded", "sae_id": sae, "format": "top_tokens",
                                "source": "top_tokens", "imported": fired, "replaced": 0,
                                "skipped": 128 - fired, "total": fired}  # fmt: skip
    explained = api(server, "GET", f"/api/jobs/{result['explain']['job_id']}").json()
    assert explained["kind"] == "explain" and explained["state"] == result["explain"]["state"]
    assert explained["state"] in ("succeeded", "failed")  # the tiny model may write nothing
    assert post(server, f"/api/saes/{sae}/detach", {}).status_code == 200


def test_a_corpus_smaller_than_one_batch_fails_saying_so(server):
    body = train_body(name="too-small", corpus={"texts": ["The sea is wide and the ship is old."]})
    started = post(server, "/api/saes/train", body)
    assert started.status_code == 202, started.text
    view = training(server, started.json()["id"])
    assert view["state"] == "failed" and view["error"]["param"] == "corpus"
    assert "fewer activations than one batch (256)" in view["error"]["message"]
    assert not (server.home / "dictionaries" / ".work" / view["id"]).exists()
    assert not (server.home / "dictionaries" / "too-small").exists()


def test_a_training_failed_by_an_unload_resumes_once_its_model_is_back(tiny_dirs, tmp_path):
    process = ServerProcess(tmp_path / "unload-home", ["--model", str(tiny_dirs["llama"])])
    process.wait_ready()
    try:
        body = train_body(name="unloaded", training_tokens=400 * 256, checkpoint_every_tokens=2048,
                          corpus={"texts": TEXTS * 120, "context_size": 32})  # fmt: skip
        training_id = post(process, "/api/saes/train", body).json()["id"]
        path = f"/api/saes/trainings/{training_id}"
        deadline = time.monotonic() + 120
        while api(process, "GET", path).json()["progress"]["steps"] < 30:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert post(process, "/api/models/tiny-llama/unload", {}).status_code == 200
        view = training(process, training_id)
        assert view["state"] == "failed" and view["error"]["code"] == "model_not_loaded"
        assert view["progress"]["resumable"] is True
        error(post(process, f"{path}/resume", {}), 409, "training_not_resumable")  # no model
        assert post(process, "/api/models/tiny-llama/load", {}).status_code in (200, 202)
        deadline = time.monotonic() + 120
        while api(process, "GET", "/api/health/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        resumed = post(process, f"{path}/resume", {})
        assert resumed.status_code == 202, resumed.text
        error(post(process, f"{path}/resume", {}), 409, "training_not_resumable")  # running
        view = training(process, training_id)
        assert view["state"] == "succeeded", view
        [at] = view["progress"]["resumed_at_tokens"]
        assert 2048 <= at < 400 * 256 and view["progress"]["steps"] == 400
        assert not (tmp_path / "unload-home" / "dictionaries" / ".work" / training_id).exists()
        error(post(process, f"{path}/resume", {}), 409, "training_not_resumable")  # succeeded
        error(post(process, "/api/saes/trainings/train_nope/resume", {}), 404, "training_not_found")
    finally:
        process.stop()
