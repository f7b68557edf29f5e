"""Batches in the workbench: a JSONL file uploaded and started from the page, its progress and
counts followed until it completes, its output downloaded (every custom_id once, each answer the
API's), and a long batch cancelled from its row."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.sync_api import expect

from tests.api.clients import MODEL


def jsonl(path, prefix: str, count: int, max_tokens: int):
    rows = [
        {"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": MODEL, "prompt": f"Row {i} is", "max_tokens": max_tokens,
                  "temperature": 0}}
        for i in range(count)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def start(page, path) -> None:
    form = page.get_by_role("form", name="New batch")
    form.get_by_label("JSONL file").set_input_files(str(path))
    form.get_by_label("Endpoint").select_option("/v1/completions")
    form.get_by_role("button", name="Start batch").click()


def row_of(page, prefix_file: str):
    return page.get_by_role("table", name="Batches").get_by_role("row").filter(has_text=prefix_file)


def test_a_batch_started_here_completes_and_its_output_downloads(workbench, page, tmp_path):
    page.goto(f"{workbench.url}#/batches")
    start(page, jsonl(tmp_path / "rows.jsonl", "r", 6, 4))
    said = page.get_by_role("region", name="Batches").get_by_role("status")
    expect(said).to_contain_text("started")
    batch_id = said.text_content().split()[1]
    row = row_of(page, batch_id)
    expect(row.locator("[data-status]")).to_have_attribute(
        "data-status", "completed", timeout=60_000
    )
    expect(row).to_contain_text("6 completed · 0 failed")
    with page.expect_download() as download:
        row.get_by_role("button", name=f"Download the output of {batch_id}").click()
    lines = [json.loads(x) for x in Path(download.value.path()).read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(6)]
    body = {"model": MODEL, "prompt": "Row 0 is", "max_tokens": 4, "temperature": 0}
    direct = workbench.api("POST", "/v1/completions", json=body).json()
    assert lines[0]["response"]["body"]["choices"][0]["text"] == direct["choices"][0]["text"]


def test_a_running_batch_is_cancelled_from_its_row(workbench, page, tmp_path):
    page.goto(f"{workbench.url}#/batches")
    start(page, jsonl(tmp_path / "long.jsonl", "l", 200, 24))
    said = page.get_by_role("region", name="Batches").get_by_role("status")
    expect(said).to_contain_text("started")
    batch_id = said.text_content().split()[1]
    row = row_of(page, batch_id)
    row.get_by_role("button", name=f"Cancel {batch_id}").click()
    expect(row.locator("[data-status]")).to_have_attribute(
        "data-status", "cancelled", timeout=60_000
    )
    ended = workbench.api("GET", f"/v1/batches/{batch_id}").json()
    assert ended["status"] == "cancelled" and ended["request_counts"]["total"] == 200
    assert ended["request_counts"]["completed"] < 200
    with page.expect_download() as download:
        row.get_by_role("button", name=f"Download the errors of {batch_id}").click()
    errors = [json.loads(x) for x in Path(download.value.path()).read_text().splitlines()]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
