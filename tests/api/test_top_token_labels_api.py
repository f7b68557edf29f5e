"""Labels from a calibration's top tokens on a live server (tiny Llama, a TopK SAE without labels
at layer 1, calibrated on texts): each feature that fired is labelled by its top examples' tokens
weighted by their activations, as computed here from the calibration the server shows; labels a
feature already had stay unless asked; the refusals before a calibration, and after one that kept
no examples."""

from __future__ import annotations

import pytest

from tests.api.clients import api, error, post
from tests.api.test_explain_api import TEXTS, wait_job
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

WIDTH = 128


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    sae_dir = build_saelens(
        tmp_path_factory.mktemp("top-token-sae") / "sae", layer=1, seed=73, labels=False
    )
    process = ServerProcess(
        tmp_path_factory.mktemp("top-token-home"), ["--model", str(tiny_dirs["llama"])]
    ).wait_ready()
    try:
        sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{sae}/attach", {}).status_code == 200
        yield process, sae
    finally:
        process.stop()


def expected(figures: dict) -> dict:
    """One feature's label by the documented rule, from its calibration figures."""
    weight: dict[str, float] = {}
    for example in figures["top_examples"]:
        weight[example["token"]] = weight.get(example["token"], 0.0) + example["activation"]
    tokens = sorted(weight, key=lambda t: -weight[t])
    words: list[str] = []
    for token in tokens:
        word = token.strip() or repr(token)
        if word.lower() not in [w.lower() for w in words]:
            words.append(word)
    best = figures["top_examples"][0]
    return {
        "label": " / ".join(words[:3]),
        "top_tokens": tokens[:10],
        "example": f"{best['before']}[[{best['token']}]]{best['after']}",
        "frequency": figures["frequency"],
        "max_activation": figures["max"],
    }


def label_top_tokens(process, sae: str, **body) -> dict:
    response = post(process, f"/api/saes/{sae}/labels/top-tokens", body)
    assert response.status_code == 200, response.text
    return response.json()


def test_features_are_labelled_by_their_calibrations_top_tokens(server):
    process, sae = server
    refused = post(process, f"/api/saes/{sae}/labels/top-tokens", {})
    assert "calibrate first" in error(refused, 400, "sae_not_calibrated")["message"]
    started = post(process, f"/api/saes/{sae}/calibrate", {"texts": TEXTS, "top_examples": 6})
    assert wait_job(process, started.json()["id"])["state"] == "succeeded"
    view = api(
        process,
        "GET",
        f"/api/saes/{sae}/calibration",
        params={"features": ",".join(map(str, range(WIDTH)))},
    ).json()
    fired = {f["index"]: f for f in view["features"] if f["count"] > 0}
    assert 10 < len(fired) < WIDTH  # some never fire on ten short texts

    done = label_top_tokens(process, sae)
    assert (done["source"], done["imported"], done["replaced"]) == ("top_tokens", len(fired), 0)
    assert (done["skipped"], done["total"]) == (WIDTH - len(fired), len(fired))
    stored = api(process, "GET", f"/api/saes/{sae}/labels", params={"detail": "true"}).json()
    assert set(map(int, stored)) == set(fired)
    for index, figures in fired.items():
        entry = stored[str(index)]
        assert {key: entry[key] for key in expected(figures)} == expected(figures)
    # the label is searchable as any other, with its source
    index = max(fired, key=lambda i: fired[i]["max"])
    word = stored[str(index)]["label"].split(" / ")[0]
    hits = api(process, "GET", f"/api/saes/{sae}/features", params={"q": word}).json()["data"]
    assert (index, "top_tokens") in [(hit["index"], hit["source"]) for hit in hits]


def test_a_label_a_feature_had_stays_unless_overwritten(server):
    process, sae = server
    labelled = api(process, "GET", f"/api/saes/{sae}/labels").json()
    if not labelled:  # run alone: calibrate and label as the test above does
        started = post(process, f"/api/saes/{sae}/calibrate", {"texts": TEXTS, "top_examples": 6})
        assert wait_job(process, started.json()["id"])["state"] == "succeeded"
        label_top_tokens(process, sae)
        labelled = api(process, "GET", f"/api/saes/{sae}/labels").json()
    mine = next(iter(labelled))
    patched = api(process, "PATCH", f"/api/saes/{sae}/labels", json={mine: "my own name"})
    assert patched.status_code == 200, patched.text

    kept = label_top_tokens(process, sae)
    assert (kept["imported"], kept["replaced"], kept["total"]) == (0, 0, len(labelled))
    assert kept["skipped"] == WIDTH  # the features that never fired, and those kept as they were
    assert api(process, "GET", f"/api/saes/{sae}/labels").json()[mine] == "my own name"

    again = label_top_tokens(process, sae, overwrite=True)
    assert (again["imported"], again["replaced"]) == (len(labelled), len(labelled))
    assert api(process, "GET", f"/api/saes/{sae}/labels").json() == labelled
    wrong = post(process, f"/api/saes/{sae}/labels/top-tokens", {"overwrite": "yes"})
    assert error(wrong, 400)["param"] == "overwrite"

    # a calibration that kept no examples has no top tokens to read
    started = post(process, f"/api/saes/{sae}/calibrate", {"texts": TEXTS, "top_examples": 0})
    assert wait_job(process, started.json()["id"])["state"] == "succeeded"
    none_kept = post(process, f"/api/saes/{sae}/labels/top-tokens", {"overwrite": True})
    assert "(it kept none)" in error(none_kept, 400, "sae_not_calibrated")["message"]
    assert api(process, "GET", f"/api/saes/{sae}/labels").json() == labelled
