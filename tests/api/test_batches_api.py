"""The Batch API through the OpenAI SDK: lines checked as the routes check bodies, run through the
same serving code, every custom_id once across the output and error files, cancelled with what
ran kept, and resumed after a kill -9 without a line run twice."""

import signal
import time

import openai
import pytest

from tests.api.clients import MODEL, api, error, sdk
from tests.support.batch_files import jsonl, lines_of, wait
from tests.support.server import ServerProcess
from tests.support.waiting import until


def line(custom_id: str, prompt: str, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0, **body},
    }


def start(home, tiny_dirs, env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(home, ["--model", str(tiny_dirs["llama"])], env=env).wait_ready()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("batch-home")


@pytest.fixture(scope="module")
def server(home, tiny_dirs):
    process = start(home, tiny_dirs)
    yield process
    process.stop()


def run(client, entries: list, **create) -> object:
    stored = client.files.create(file=("in.jsonl", jsonl(entries)), purpose="batch")
    return client.batches.create(
        input_file_id=stored.id, endpoint="/v1/completions", completion_window="24h", **create
    )


def test_a_batch_answers_each_line_as_the_route_would(server):
    client = sdk(server)
    entries = [
        line("a", "The cat"),
        "{not json",
        line("b", "A river"),
        line("a", "again"),
        line("s", "x", stream=True),
        {**line("m", "x"), "method": "GET"},
        line("u", "x", colour="red"),
        line("c", "Paris is"),
    ]
    batch = run(client, entries, metadata={"job": "t1"})
    assert batch.status == "validating" and batch.metadata == {"job": "t1"}
    assert batch.millm["completion_window_extension"] is False
    done = wait(client, batch.id)
    assert done.status == "completed" and done.model == MODEL
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (8, 3, 5)
    output, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert [o["custom_id"] for o in output] == ["a", "b", "c"]  # in input order
    codes = {e["line"]: e["error"]["code"] for e in errors}
    assert codes == {
        2: "invalid_json",
        4: "duplicate_custom_id",
        5: "stream_not_supported",
        6: "invalid_method",
        7: "unused_fields_refused",
    }
    assert all(e["error"]["message"].startswith(f"Line {e['line']}: ") for e in errors)
    assert [e.line for e in done.errors.data] == [2, 4, 5, 6, 7]
    # The same text the route gives for the same body.
    sync = api(server, "POST", "/v1/completions", json=line("b", "A river")["body"]).json()
    answer = output[1]["response"]
    assert answer["status_code"] == 200 and answer["request_id"].startswith("req_")
    assert answer["body"]["choices"][0]["text"] == sync["choices"][0]["text"]
    assert answer["millm"]["packed"] is False and answer["millm"]["headers"]["X-miLLM-Steering"]
    error(api(server, "POST", f"/v1/batches/{done.id}/cancel"), 409, "batch_state_conflict")
    listed = client.batches.list(limit=5)
    assert done.id in [b.id for b in listed.data]


def test_what_a_batch_cannot_be_is_refused_at_once(server):
    client = sdk(server)
    stored = client.files.create(file=("in.jsonl", jsonl([line("a", "x")])), purpose="batch")
    for window in ("0h", "169h", "1d"):
        refused = api(server, "POST", "/v1/batches", json={"input_file_id": stored.id,
                      "endpoint": "/v1/completions", "completion_window": window})  # fmt: skip
        assert error(refused, 400, "invalid_batch_request")["param"] == "completion_window"
    body = {"input_file_id": stored.id, "endpoint": "/v1/foo", "completion_window": "24h"}
    assert error(api(server, "POST", "/v1/batches", json=body), 400)["param"] == "endpoint"
    body = {**body, "endpoint": "/v1/completions", "input_file_id": "file-none"}
    error(api(server, "POST", "/v1/batches", json=body), 404, "file_not_found")
    long = client.batches.create(
        input_file_id=stored.id, endpoint="/v1/completions", completion_window="48h"
    )
    assert long.expires_at - long.created_at == 48 * 3600
    assert long.millm["completion_window_extension"] is True
    assert wait(client, long.id).status == "completed"


def test_a_batch_of_two_models_or_no_valid_line_fails_without_running(server):
    client = sdk(server)
    two = wait(client, run(client, [line("a", "x"), {**line("b", "y"), "body": {
        **line("b", "y")["body"], "model": "other-model"}}]).id)  # fmt: skip
    assert two.status == "failed" and two.failed_at is not None
    failure = two.errors.data[-1]
    assert failure.code == "multiple_models" and "other-model (1 lines)" in failure.message
    assert [e["custom_id"] for e in lines_of(client, two.error_file_id)] == ["a", "b"]
    empty = wait(client, run(client, ["{oops"]).id)
    assert empty.status == "failed" and empty.output_file_id is None


def test_a_cancelled_batch_keeps_what_ran_and_says_what_did_not(server):
    client = sdk(server)
    batch = run(client, [line(f"r{i}", f"row {i}", max_tokens=24) for i in range(40)])
    wait(client, batch.id, until=("in_progress",))
    assert api(server, "GET", "/api/health/inference").json()["batch_backlog_rows"] > 0
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    output, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    ids = [o["custom_id"] for o in output] + [e["custom_id"] for e in errors]
    assert sorted(ids) == sorted(f"r{i}" for i in range(40))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert api(server, "GET", "/api/health/inference").json()["batch_backlog_rows"] == 0


def test_packed_scoring_lines_share_passes_say_so_and_keep_their_answers(server):
    client = sdk(server)
    rows = [line(f"s{i}", "word " * (1 + i % 5) + f"row {i}", max_tokens=1, logprobs=3)
            for i in range(20)] + [line("g", "Once", max_tokens=4)]  # fmt: skip
    health = "/api/health/inference"
    before = api(server, "GET", health).json()["packed_scoring_jobs"]
    packed = wait(client, run(client, rows, extra_body={"pack": True}).id)
    assert api(server, "GET", health).json()["packed_scoring_jobs"] > before
    single = wait(client, run(client, rows).id)  # MILLM_BATCH_PACK_DEFAULT: off
    assert (packed.millm["pack"], single.millm["pack"]) == (True, False)
    outputs = (lines_of(client, single.output_file_id), lines_of(client, packed.output_file_id))
    for alone, shared in zip(*outputs, strict=True):
        flags = (alone["response"]["millm"]["packed"], shared["response"]["millm"]["packed"])
        if alone["custom_id"] == "g":  # a generation line is never packed
            assert flags == (False, False)
            continue
        assert flags == (False, True)
        a, b = (x["response"]["body"]["choices"][0]["logprobs"] for x in (alone, shared))
        assert a["tokens"] == b["tokens"]
        assert abs(a["token_logprobs"][0] - b["token_logprobs"][0]) < 1e-4  # float32 model


def lease_on(server) -> dict:
    return api(server, "GET", f"/api/models/{MODEL}/lease").json()


def test_a_running_batch_holds_its_own_lease_and_lets_it_go(server):
    client = sdk(server)
    first = run(client, [line(f"o{i}", f"row {i}", max_tokens=24) for i in range(120)])
    held = until(lambda: (lease_on(server)["lease"] or {}).get("holder"), 60)
    assert held == f"millm-batch:{first.id}"
    asked = {"holder": "judge", "reason": "a run", "ttl_seconds": 60}
    refused = error(api(server, "POST", f"/api/models/{MODEL}/lease", json=asked), 409)
    assert refused["code"] == "model_leased" and first.id in refused["message"]
    # Another batch is made (a batch's own lease does not refuse it) and waits for the lease.
    second = run(client, [line("w", "waits")])
    waiting = wait(client, second.id, until=("in_progress",))
    until(
        lambda: client.batches.retrieve(second.id).millm["waiting_reason"] == "lease_unavailable",
        60,
    )
    assert waiting.status == "in_progress"
    client.batches.cancel(first.id)
    assert wait(client, first.id).millm["lease_mode"] == "own"
    done = wait(client, second.id)
    assert done.status == "completed" and done.millm["lease_mode"] == "own"
    assert lease_on(server)["lease"] is None
    ended = lease_on(server)["last_ended"]
    assert ended["holder"] == f"millm-batch:{second.id}" and ended["end_reason"] == "released"


def test_a_clients_lease_refuses_a_batch_without_its_id_and_carries_one_with_it(server):
    client = sdk(server)
    asked = {"holder": "judge", "reason": "scoring run", "ttl_seconds": 300}
    granted = api(server, "POST", f"/api/models/{MODEL}/lease", json=asked).json()
    mine = {"X-miLLM-Lease": granted["lease_id"]}
    try:
        with pytest.raises(openai.ConflictError) as refused:
            run(client, [line("x", "x")])
        assert refused.value.code == "model_leased" and "judge" in str(refused.value)
        rows = [line(f"c{i}", f"row {i}", max_tokens=24) for i in range(40)]
        batch = run(client, rows, extra_headers=mine)
        assert batch.millm["lease_mode"] == "caller"
        again = api(server, "POST", f"/v1/batches/{batch.id}/lease", headers=mine)
        assert again.status_code == 200 and again.json()["millm"]["lease_mode"] == "caller"
        done = wait(client, batch.id)
        assert done.status == "completed" and done.millm["lease_mode"] == "caller"
        live = lease_on(server)["lease"]  # the batch renewed it and left it held
        assert live["holder"] == "judge"
        ended = error(api(server, "POST", f"/v1/batches/{batch.id}/lease", headers=mine), 409)
        assert ended["code"] == "batch_state_conflict"
    finally:
        api(server, "DELETE", f"/api/models/{MODEL}/lease", headers=mine)
    bare = api(server, "POST", f"/v1/batches/{batch.id}/lease")
    assert error(bare, 400, "invalid_batch_request")["param"] == "X-miLLM-Lease"
    body = {"input_file_id": batch.input_file_id, "endpoint": "/v1/completions",
            "completion_window": "24h"}  # fmt: skip
    stale = api(server, "POST", "/v1/batches", headers=mine, json=body)
    error(stale, 409, "lease_expired")


def test_a_batch_resumes_after_a_kill_without_running_a_line_twice(tiny_dirs, tmp_path):
    home = tmp_path / "kill-home"
    claims = {"MILLM_BATCH_CLAIM_SECONDS": "3"}  # the dead server's claim on its chunk lapses soon
    first = start(home, tiny_dirs, claims)
    client = sdk(first)
    batch = run(client, [line(f"k{i}", f"row {i}", max_tokens=16) for i in range(24)])
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 8:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    second = start(home, tiny_dirs, claims)
    try:
        client = sdk(second)
        done = wait(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 24
        output = lines_of(client, done.output_file_id)
        assert [o["custom_id"] for o in output] == [f"k{i}" for i in range(24)]
    finally:
        second.stop()
