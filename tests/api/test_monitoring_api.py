"""/api/monitoring on a live server (tiny Llama, one TopK SAE attached): settings and their
refusals, per-request records equal to the request's own pre_steering read, statistics derived
from the records, a bounded history, the live SSE feed, scoring and embeddings never recorded,
token text and labels when set (the same shape as before when not), each record's link to its
request's prompt (bounded per request, forgotten with the history), a batch's lines recorded apart
(never on the live feed or in the statistics), and settings that survive a restart."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from transformers import AutoTokenizer

from tests.api.clients import MODEL, api, post, sdk, sse_events
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about rivers."}],
    "max_tokens": 6,
    "temperature": 0,
}


PROMPT_CHARS = 300  # MONITORING_PROMPT_MAX_CHARS of this file's server


def wait_records(server, count, timeout=30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = api(server, "GET", "/api/monitoring/records", params={"limit": 1000}).json()[
            "data"
        ]
        if len(records) >= count:
            return records
        time.sleep(0.05)
    raise AssertionError(f"expected {count} records, have {len(records)}")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("monitor-home")


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    return build_saelens(
        tmp_path_factory.mktemp("monitor-sae") / "sae", layer=1, architecture="topk", seed=77
    )


@pytest.fixture(scope="module")
def server(tiny_dirs, home, sae_dir):
    process = ServerProcess(
        home,
        ["--model", str(tiny_dirs["llama"])],
        env={
            "MONITORING_HISTORY": "4",
            "MONITORING_BATCH_HISTORY": "2",
            "MONITORING_PROMPT_MAX_CHARS": str(PROMPT_CHARS),
        },
    )
    try:
        process.wait_ready()
        refused = api(process, "POST", "/api/monitoring/enable")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "sae_not_attached"
        process.sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{process.sae}/attach", {}).status_code == 200
        assert (
            api(
                process, "PUT", f"/api/steering/saes/{process.sae}/features/2", json={"strength": 5}
            ).status_code
            == 200
        )
        yield process
    finally:
        process.stop()


@pytest.fixture
def fresh(server):
    api(
        server,
        "PUT",
        "/api/monitoring",
        json={
            "enabled": False,
            "features": None,
            "top_k": 5,
            "positions": "completion",
            "tokens": False,
            "labels": False,
        },
    )
    api(server, "POST", "/api/monitoring/reset")
    return server


def test_settings_are_validated_whole(fresh):
    before = api(fresh, "GET", "/api/monitoring").json()
    for body, needle in [
        ({"top_k": 65}, "top_k"),
        ({"positions": "middle"}, "positions"),
        ({"features": [128], "sae_id": fresh.sae}, "past the width"),
        ({"sae_id": "sae_000000000000"}, "sae_000000000000"),
        ({"colour": "blue"}, "colour"),
    ]:
        response = api(fresh, "PUT", "/api/monitoring", json=body)
        assert response.status_code in (400, 404, 422), response.text
        assert needle in response.text
    assert api(fresh, "GET", "/api/monitoring").json() == before


def test_a_bad_flag_is_refused_naming_it(fresh):
    before = api(fresh, "GET", "/api/monitoring").json()
    for body, param in [({"tokens": "yes"}, "tokens"), ({"labels": None}, "labels")]:
        response = api(fresh, "PUT", "/api/monitoring", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["message"].startswith(f"{param}: "), error
    assert api(fresh, "GET", "/api/monitoring").json() == before


def test_records_equal_the_requests_own_pre_steering_read(fresh):
    settings = api(
        fresh,
        "PUT",
        "/api/monitoring",
        json={"enabled": True, "features": [2, 5, 9, 40], "top_k": 3},
    ).json()
    assert (
        settings["reading"] == {"sae_id": fresh.sae, "layer": 1}
        and settings["read_point"] == "pre_steering"
    )
    ask = {
        "sae_id": fresh.sae,
        "features": [2, 5, 9, 40],
        "top_k": 3,
        "positions": "completion",
        "read_point": "pre_steering",
    }
    answer = post(fresh, "/v1/chat/completions", {**CHAT, "return_sae_activations": ask}).json()
    [record] = wait_records(fresh, 1)
    assert (
        record["sae_id"] == fresh.sae
        and record["layer"] == 1
        and record["read_point"] == "pre_steering"
    )
    assert record["positions"] == answer["millm"]["sae_activations"]["positions"]
    assert all(
        len(p["features"]) == 3 and {f["index"] for f in p["features"]} <= {2, 5, 9, 40}
        for p in record["positions"]
    )
    listed = api(fresh, "GET", "/api/monitoring/stats").json()["features"]
    assert [f["index"] for f in listed] == [2, 5, 9, 40]  # every watched feature, fired or not
    assert all(
        f["count"] == 0 and f["mean"] == 0.0
        for f in listed
        if f["index"]
        not in {e["index"] for p in record["positions"] for e in p["features"] if e["value"] > 0}
    )


def test_statistics_follow_the_records_and_reset_clears_them(fresh):
    api(
        fresh,
        "PUT",
        "/api/monitoring",
        json={"enabled": True, "features": None, "top_k": 4, "positions": "all"},
    )
    for topic in ("rivers", "cities"):
        post(
            fresh,
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": f"About {topic}."}]},
        )
    records = wait_records(fresh, 2)
    values: dict[int, list[float]] = {}
    positions = 0
    for record in records:
        positions += len(record["positions"])
        for entry in record["positions"]:
            for feature in entry["features"]:
                values.setdefault(feature["index"], []).append(feature["value"])
    stats = api(fresh, "GET", "/api/monitoring/stats").json()
    assert stats["positions_read"] == positions and stats["requests"] == 2
    by_index = {f["index"]: f for f in stats["features"]}
    assert set(by_index) == set(values)
    for index, seen in values.items():
        assert by_index[index]["count"] == len(seen)
        assert by_index[index]["mean"] == pytest.approx(sum(seen) / len(seen))
        assert by_index[index]["max"] == pytest.approx(max(seen))
        assert by_index[index]["fraction_active"] == pytest.approx(len(seen) / positions)
    cleared = api(fresh, "POST", "/api/monitoring/reset").json()
    assert cleared["positions_read"] == 0 and cleared["features"] == []
    assert api(fresh, "GET", "/api/monitoring/records").json()["data"] == []


def test_scoring_and_embeddings_are_never_recorded_and_disabled_records_nothing(fresh):
    api(fresh, "POST", "/api/monitoring/enable")
    for path, body in [
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "The river", "max_tokens": 1, "logprobs": 2},
        ),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 1, "logprobs": True}),
        ("/v1/embeddings", {"model": MODEL, "input": "The river"}),
    ]:
        # each really ran, so its absence below means something
        assert post(fresh, path, body).status_code == 200
    # Prompts of growing length tell the three generations' records apart by their first position.
    generate = {"model": MODEL, "max_tokens": 3, "temperature": 0}
    first = post(fresh, "/v1/completions", {**generate, "prompt": "The river"}).json()["usage"]
    api(fresh, "POST", "/api/monitoring/disable")
    unmonitored = post(
        fresh, "/v1/completions", {**generate, "prompt": "The river and the sea"}
    ).json()["usage"]
    api(fresh, "POST", "/api/monitoring/enable")
    last = post(
        fresh, "/v1/completions", {**generate, "prompt": "The river, the sea and the old hills"}
    ).json()["usage"]
    assert first["prompt_tokens"] < unmonitored["prompt_tokens"] < last["prompt_tokens"]
    # each record has a position
    assert min(u["completion_tokens"] for u in (first, unmonitored, last)) >= 2

    # The worker records in the order rows finished, so once the last generation's record is in,
    # anything handed over before it (scoring, embeddings, the disabled request) would be too.
    deadline = time.monotonic() + 30
    while True:
        records = wait_records(fresh, 1)
        if any(r["positions"][0]["position"] == last["prompt_tokens"] for r in records):
            break
        assert time.monotonic() < deadline, records
        time.sleep(0.05)
    assert [[p["position"] for p in r["positions"]] for r in records] == [
        # completion positions; the final sampled token is never fed back, so it has none
        list(range(u["prompt_tokens"], u["prompt_tokens"] + u["completion_tokens"] - 1))
        for u in (first, last)
    ]
    assert api(fresh, "GET", "/api/monitoring/stats").json()["requests"] == 2


def test_history_is_bounded(fresh):
    api(fresh, "POST", "/api/monitoring/enable")
    sent = [
        post(
            fresh, "/v1/completions", {"model": MODEL, "prompt": f"Count {i}", "max_tokens": 2}
        ).json()["id"]
        for i in range(6)
    ]
    deadline = time.monotonic() + 30
    while (
        api(fresh, "GET", "/api/monitoring/stats").json()["requests"] < 6
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    records = api(fresh, "GET", "/api/monitoring/records", params={"limit": 100}).json()["data"]
    assert len(records) == 4  # MONITORING_HISTORY
    ids = [r["id"] for r in records]
    assert ids == sorted(ids)
    assert (
        api(fresh, "GET", "/api/monitoring/records", params={"after": ids[1]}).json()["data"]
        == records[2:]
    )
    # Each kept record finds its request's prompt; the requests whose records are gone do not.
    for record in records:
        assert prompt_of(fresh, record["request_id"])["request_id"] == record["request_id"]
    forgotten = [i for i in sent if i not in {r["request_id"] for r in records}]
    assert len(forgotten) == 2
    for request_id in forgotten:
        gone = api(fresh, "GET", f"/api/monitoring/requests/{request_id}")
        assert gone.status_code == 404 and "MONITORING_HISTORY" in gone.json()["error"]["message"]


def listening(server) -> tuple[threading.Thread, list]:
    """A client of the live feed, connected: it keeps the first record it receives."""
    received, ready = [], threading.Event()

    def listen():
        url = f"{server.base_url}/api/monitoring/stream"
        with httpx.stream("GET", url, timeout=120) as response:
            for line in response.iter_lines():
                ready.set()
                if line.startswith("data: "):
                    received.append(json.loads(line[6:]))
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(30)
    return listener, received


def test_live_feed_pushes_each_record(fresh):
    api(fresh, "POST", "/api/monitoring/enable")
    listener, received = listening(fresh)
    post(fresh, "/v1/completions", {"model": MODEL, "prompt": "Live", "max_tokens": 3})
    listener.join(30)
    [record] = wait_records(fresh, 1)
    assert received == [record]


def test_a_batchs_lines_are_recorded_apart_and_never_fed_live(fresh):
    api(fresh, "POST", "/api/monitoring/enable")
    listener, received = listening(fresh)
    client = sdk(fresh)
    lines = "".join(
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {**CHAT, "max_tokens": 3}}) + "\n"
        for i in range(3)
    )  # fmt: skip
    stored = client.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=stored.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.1)
    answered = {
        json.loads(row)["custom_id"]: json.loads(row)["response"]["request_id"]
        for row in client.files.content(batch.output_file_id).text.splitlines()
    }
    path = "/api/monitoring/records"
    query = {"origin": "batch", "batch_id": batch.id}
    deadline = time.monotonic() + 30
    while len(kept := api(fresh, "GET", path, params=query).json()["data"]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # MONITORING_BATCH_HISTORY is 2: the first line's record went first, whichever ran first
    assert len(kept) == 2 and len(answered) == 3
    for record in kept:
        assert record["origin"] == "batch" and record["batch_id"] == batch.id
        assert record["request_id"] == answered[record["custom_id"]]
        assert record["custom_id"] == f"line-{record['batch_line'] - 1}"  # lines count from 1
        assert record["positions"]  # the same reads as a live request's
    other = api(fresh, "GET", path, params={"origin": "batch", "batch_id": "batch_none"})
    assert other.json()["data"] == []
    # Nothing of the batch is live: no record, no statistic, no prompt, nothing on the feed.
    assert api(fresh, "GET", path).json()["data"] == []
    assert api(fresh, "GET", "/api/monitoring/stats").json()["requests"] == 0
    lookup = api(fresh, "GET", f"/api/monitoring/requests/{kept[0]['request_id']}")
    assert lookup.status_code == 404
    assert received == []
    history = api(fresh, "GET", "/api/monitoring").json()["history"]
    assert (history["batch_records"], history["batch_max"], history["records"]) == (2, 2, 0)
    post(fresh, "/v1/chat/completions", CHAT)
    listener.join(30)
    [live] = wait_records(fresh, 1)
    assert received == [live] and live["origin"] == "request" and "batch_id" not in live
    api(fresh, "POST", "/api/monitoring/reset")
    assert api(fresh, "GET", path, params=query).json()["data"] == []


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs):
    return AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))


def decoded(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_records_carry_token_text_and_labels_when_set(fresh, tokenizer):
    labelled = {"2": "two rivers", "5": "five rivers"}  # 9 and 40 stay unlabelled
    assert api(fresh, "PUT", f"/api/saes/{fresh.sae}/labels", json=labelled).status_code == 200
    watched = {"enabled": True, "features": [2, 5, 9, 40], "top_k": 4, "positions": "all"}
    settings = api(
        fresh, "PUT", "/api/monitoring", json={**watched, "tokens": True, "labels": True}
    ).json()
    assert (settings["tokens"], settings["labels"]) == (True, True)
    post(fresh, "/v1/chat/completions", CHAT)
    [readable] = wait_records(fresh, 1)
    assert readable["positions"]
    for entry in readable["positions"]:
        assert set(entry) == {"position", "token_id", "token", "features"}
        assert entry["token"] == decoded(tokenizer, [entry["token_id"]])
        assert sorted(f["index"] for f in entry["features"]) == [2, 5, 9, 40]
        for feature in entry["features"]:
            assert feature["label"] == labelled.get(str(feature["index"]))

    api(fresh, "PUT", "/api/monitoring", json={"tokens": False, "labels": False})
    post(fresh, "/v1/chat/completions", CHAT)
    plain = wait_records(fresh, 2)[-1]
    assert all(set(entry) == {"position", "token_id", "features"} for entry in plain["positions"])
    assert all(
        set(f) == {"index", "value"} for entry in plain["positions"] for f in entry["features"]
    )
    # Greedy, so the same request read the same numbers: only the flags' keys differ.
    assert plain["positions"] == [
        {
            "position": entry["position"],
            "token_id": entry["token_id"],
            "features": [{"index": f["index"], "value": f["value"]} for f in entry["features"]],
        }
        for entry in readable["positions"]
    ]


def prompt_of(server, request_id: str) -> dict:
    response = api(server, "GET", f"/api/monitoring/requests/{request_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_a_record_links_to_the_prompt_its_request_sent(fresh, tokenizer):
    api(fresh, "POST", "/api/monitoring/enable")
    chat = post(fresh, "/v1/chat/completions", CHAT).json()
    text = "The river, said the old map,"
    completion = post(fresh, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 3})
    streamed = post(fresh, "/v1/chat/completions", {**CHAT, "stream": True}).text
    stream_id = [e for e in sse_events(streamed) if e != "[DONE]"][0]["id"]
    responses = post(
        fresh, "/v1/responses", {"model": MODEL, "input": "Rivers?", "max_output_tokens": 3}
    ).json()
    records = wait_records(fresh, 4)
    ids = [chat["id"], completion.json()["id"], stream_id, responses["id"]]
    assert sorted(r["request_id"] for r in records) == sorted(ids)  # the ids the clients got
    assert {r["prompt_index"] for r in records} == {0}

    [conversation] = prompt_of(fresh, chat["id"])["prompts"]
    template = tokenizer.apply_chat_template(CHAT["messages"], add_generation_prompt=True)
    assert conversation["text"] == decoded(tokenizer, template)
    assert "Tell me about rivers." in conversation["text"]
    assert conversation["tokens"] == chat["usage"]["prompt_tokens"]
    assert (conversation["truncated"], conversation["chars"]) == (
        False,
        len(conversation["text"]),
    )
    kept = prompt_of(fresh, completion.json()["id"])
    assert kept["request_id"] == completion.json()["id"] and kept["model"] == MODEL
    [prompt] = kept["prompts"]
    assert prompt["text"] == decoded(tokenizer, tokenizer(text)["input_ids"])
    assert prompt["text"].endswith(text)
    assert "Rivers?" in prompt_of(fresh, responses["id"])["prompts"][0]["text"]
    assert "Tell me about rivers." in prompt_of(fresh, stream_id)["prompts"][0]["text"]

    missing = api(fresh, "GET", "/api/monitoring/requests/chatcmpl-0")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "request_id"
    api(fresh, "POST", "/api/monitoring/reset")
    assert api(fresh, "GET", f"/api/monitoring/requests/{chat['id']}").status_code == 404


def test_each_row_names_its_prompt_and_the_kept_text_is_bounded(fresh, tokenizer):
    api(fresh, "POST", "/api/monitoring/enable")
    first = "A long one: " + "the river runs to the sea, " * 12
    body = {
        **CHAT,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": first}],
        "extra_messages": [[{"role": "user", "content": "Short."}]],
    }
    answer = post(fresh, "/v1/chat/completions", body).json()
    records = wait_records(fresh, 2)
    assert sorted((r["row"], r["prompt_index"]) for r in records) == [(0, 0), (1, 1)]
    long, short = prompt_of(fresh, answer["id"])["prompts"]
    full = decoded(
        tokenizer, tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True)
    )
    assert len(full) > PROMPT_CHARS
    # MONITORING_PROMPT_MAX_CHARS counts the request's prompts together, each one's start first.
    assert (long["text"], long["chars"], long["truncated"]) == (
        full[:PROMPT_CHARS],
        len(full),
        True,
    )
    assert (short["text"], short["truncated"]) == ("", True) and short["chars"] > 0

    api(fresh, "POST", "/api/monitoring/reset")
    n = post(fresh, "/v1/chat/completions", {**CHAT, "max_tokens": 2, "n": 2})
    assert n.status_code == 200, n.text
    records = wait_records(fresh, 2)
    assert sorted((r["row"], r["prompt_index"]) for r in records) == [(0, 0), (1, 0)]
    assert len(prompt_of(fresh, n.json()["id"])["prompts"]) == 1


def test_settings_survive_a_restart(tiny_dirs, home, server):
    api(
        server,
        "PUT",
        "/api/monitoring",
        json={"enabled": True, "features": [2, 9], "top_k": 2, "positions": "last"},
    )
    server.stop()
    again = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    try:
        again.wait_ready()
        settings = api(again, "GET", "/api/monitoring").json()
        assert (
            settings["enabled"],
            settings["features"],
            settings["top_k"],
            settings["positions"],
        ) == (True, [2, 9], 2, "last")
        post(again, "/v1/completions", {"model": MODEL, "prompt": "Again", "max_tokens": 3})
        [record] = wait_records(again, 1)
        assert len(record["positions"]) == 1
    finally:
        again.stop()
