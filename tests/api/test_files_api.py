"""/v1/files through the OpenAI SDK and over HTTP: a file stored whole or not at all, read back
byte for byte, listed by a cursor, deleted with its record kept."""

import hashlib
import json

import httpx
import openai
import pytest

from tests.api.clients import api, error, sdk
from tests.support.server import ServerProcess

ROWS_CAP = 5


def jsonl(rows: int) -> bytes:
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "m", "prompt": f"row {i}"},
            }
        )  # fmt: skip
        for i in range(rows)
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("files-home"),
        ["--model", str(tiny_dirs["llama"]), "--batch-max-rows", str(ROWS_CAP)],
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def upload(server, data: bytes, purpose: str | None = "batch", name: str = "rows.jsonl"):
    fields = {"purpose": purpose} if purpose is not None else {}
    return httpx.post(
        f"{server.base_url}/v1/files", files={"file": (name, data)}, data=fields, timeout=60
    )


def test_the_sdk_stores_and_reads_back_a_file(server):
    client = sdk(server)
    data = jsonl(3)
    stored = client.files.create(file=("rows.jsonl", data), purpose="batch")
    assert (stored.bytes, stored.purpose, stored.status, stored.filename) == (
        len(data),
        "batch",
        "processed",
        "rows.jsonl",
    )
    assert stored.id.startswith("file-") and len(stored.id) == 5 + 24
    assert stored.expires_at - stored.created_at == 30 * 86_400
    assert client.files.retrieve(stored.id).bytes == len(data)
    content = client.files.content(stored.id)
    assert content.content == data
    raw = httpx.get(f"{server.base_url}/v1/files/{stored.id}/content")
    assert raw.headers["content-type"].startswith("application/jsonl")
    assert int(raw.headers["content-length"]) == len(data)


def test_a_file_of_several_chunks_comes_back_whole(server):
    data = (json.dumps({"custom_id": "x", "body": {"prompt": "y" * 2_700_000}}) + "\n").encode()
    stored = upload(server, data).json()
    back = httpx.get(f"{server.base_url}/v1/files/{stored['id']}/content", timeout=60).content
    assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()


def test_what_cannot_be_stored_is_refused_and_nothing_is_kept(server):
    before = {f["id"] for f in api(server, "GET", "/v1/files?limit=1000").json()["data"]}
    wrong = error(upload(server, jsonl(1), purpose="fine-tune"), 400, "invalid_batch_request")
    assert wrong["param"] == "purpose"
    missing = httpx.post(f"{server.base_url}/v1/files", data={"purpose": "batch"})
    assert error(missing, 400, "invalid_batch_request")["param"] == "file"
    rows = error(upload(server, jsonl(ROWS_CAP + 2)), 400, "batch_file_limit")
    assert rows["param"] == "file" and f"holds {ROWS_CAP + 2} rows" in rows["message"]
    # A last line without a newline is a line too.
    unterminated = jsonl(ROWS_CAP).rstrip(b"\n") + b'\n{"custom_id": "extra"}'
    assert f"holds {ROWS_CAP + 1} rows" in error(upload(server, unterminated), 400)["message"]
    after = {f["id"] for f in api(server, "GET", "/v1/files?limit=1000").json()["data"]}
    assert after == before


def test_the_list_is_a_cursor_newest_first(server):
    ids = [upload(server, jsonl(1), name=f"page-{i}.jsonl").json()["id"] for i in range(3)]
    newest = api(server, "GET", "/v1/files?limit=2").json()
    assert [f["id"] for f in newest["data"]] == ids[::-1][:2] and newest["has_more"] is True
    assert newest["first_id"] == ids[2] and newest["last_id"] == ids[1]
    rest = api(server, "GET", f"/v1/files?limit=1&after={ids[1]}").json()
    assert [f["id"] for f in rest["data"]] == [ids[0]]
    oldest = api(server, "GET", "/v1/files?order=asc&limit=1000&purpose=batch").json()["data"]
    assert [f["id"] for f in oldest][-3:] == ids
    error(api(server, "GET", "/v1/files?limit=0"), 400, "invalid_parameter")


def test_a_deleted_file_keeps_its_record_and_says_so(server):
    client = sdk(server)
    stored = client.files.create(file=("gone.jsonl", jsonl(2)), purpose="batch")
    assert client.files.delete(stored.id).deleted is True
    assert client.files.retrieve(stored.id).status == "deleted"
    error(api(server, "GET", f"/v1/files/{stored.id}/content"), 404, "file_deleted")
    error(api(server, "DELETE", f"/v1/files/{stored.id}"), 404, "file_deleted")
    with pytest.raises(openai.NotFoundError) as info:
        client.files.retrieve("file-000000000000000000000000")
    assert info.value.body["code"] == "file_not_found"
