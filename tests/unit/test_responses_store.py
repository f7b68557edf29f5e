"""Stored Responses API answers on SQLite (the retention bound: count and age) and the
translation of chat locations into the Responses body's words."""

import time

import pytest

from millm.store.database import Store, database_url
from millm.v1.responses.request import relocate
from millm.v1.responses.store import delete_response, load_response, save_response

DAY = 86400.0


@pytest.fixture
def store(tmp_path):
    s = Store(database_url(tmp_path, None))
    yield s
    s.close()


def response(n: int) -> dict:
    return {
        "id": f"resp_{n}",
        "object": "response",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": str(n)}]}],
    }


def test_a_response_and_its_conversation_come_back_as_stored(store):
    items = [{"id": "msg_1", "type": "message", "role": "user", "content": "Hi"}]
    save_response(store, response(1), items, keep=10, retention_s=DAY)
    assert load_response(store, "resp_1", DAY) == (response(1), items)
    assert delete_response(store, "resp_1") is True and delete_response(store, "resp_1") is False
    assert load_response(store, "resp_1", DAY) is None


def test_past_the_count_the_oldest_go_first(store):
    for n in range(5):
        save_response(store, response(n), [], keep=3, retention_s=DAY)
        time.sleep(0.01)
    assert [n for n in range(5) if load_response(store, f"resp_{n}", DAY) is not None] == [2, 3, 4]


def test_past_the_retention_a_response_is_gone_and_swept(store):
    save_response(store, response(1), [], keep=10, retention_s=DAY)
    time.sleep(0.05)
    # too old to answer, even before a sweep
    assert load_response(store, "resp_1", retention_s=0.01) is None
    save_response(store, response(2), [], keep=10, retention_s=0.01)  # the next write sweeps it
    assert (
        load_response(store, "resp_1", DAY) is None
        and load_response(store, "resp_2", DAY) is not None
    )


@pytest.mark.parametrize(
    "chat, responses",
    [
        ("messages[2].content[0]", "input[1].content[0]"),
        ("messages[2].tool_call_id", "input[1].call_id"),
        ("messages[0]", "instructions"),
        ("messages[1]", "previous_response_id"),
        ("messages", "input"),
        ("response_format.json_schema.schema", "text.format.schema"),
        ("response_format", "text.format"),
        ("max_completion_tokens", "max_output_tokens"),
        ("tools[3].function.parameters", "tools[3].parameters"),
        ("tools[3].function", "tools[3]"),
        ("tool_choice", "tool_choice"),
    ],
)
def test_chat_locations_in_responses_words(chat, responses):
    # messages[0] came from instructions, [1] from an earlier turn, [2] from input[1].
    assert relocate(chat, ["instructions", None, "input[1]"]) == responses
