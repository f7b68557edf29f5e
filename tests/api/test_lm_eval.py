"""lm-evaluation-harness, unchanged, against a live millm (issue 34): `local-completions`
(loglikelihood, loglikelihood_rolling, generate_until) with millm's remote tokenizer routes, and
`local-chat-completions` (generate_until). Its numbers are held against lm-eval's own `hf`
backend on the same weights, and its generations against millm's own answers; on a steered
variant (scoring steered), against the hf backend over the same weights with the steering hooked
in."""

from __future__ import annotations

import json
import os

import pytest

from tests.api.clients import MODEL, llama_with_sae, post
from tests.support.steering_header import member

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tasks read local JSON files; nothing is fetched
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks import TaskManager  # noqa: E402

CHOICES = [
    {
        "question": "The capital of France is",
        "choices": [" Paris", " Rome", " a city"],
        "answer": 0,
    },
    {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
    {"question": "The sky is", "choices": [" blue", " green", " made of cheese"], "answer": 1},
]
TEXTS = [{"text": "The quick brown fox jumps over the lazy dog."}, {"text": "A short line."}]
QUESTIONS = [{"question": "Say hi:", "answer": "hi"}, {"question": "Count: one two", "answer": "3"}]
MAX_GEN = 8


def task_yaml(name: str, data: str, body: str) -> str:
    return (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"test_split: test\n{body}"
    )


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> TaskManager:
    """Three local tasks over JSON files made here: one per request kind."""
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    for name, rows in (("choice", CHOICES), ("rolling", TEXTS), ("gen", QUESTIONS)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "choice.yaml").write_text(
        task_yaml(
            "millm_choice",
            folder / "choice.jsonl",
            'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_target: answer\n'
            'doc_to_choice: "{{choices}}"\nmetric_list:\n  - metric: acc\n',
        )
    )
    (folder / "rolling.yaml").write_text(
        task_yaml(
            "millm_rolling",
            folder / "rolling.jsonl",
            'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
            "metric_list:\n  - metric: word_perplexity\n",
        )
    )
    (folder / "gen.yaml").write_text(
        task_yaml(
            "millm_gen",
            folder / "gen.jsonl",
            'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: '
            f'"{{{{answer}}}}"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: {MAX_GEN}\n '
            " do_sample: false\n"
            "metric_list:\n  - metric: exact_match\n",
        )
    )
    return TaskManager(include_path=str(folder))


def completions_args(server, model: str) -> dict:
    """local-completions against `server` naming `model`, tokenised by millm's /tokenize."""
    return {
        "base_url": f"{server.base_url}/v1/completions",
        "model": model,
        "tokenizer_backend": "remote",
        "max_length": 128,
        "num_concurrent": 1,
        "max_retries": 1,
    }


def responses(result: dict, task: str) -> list:
    """Each document's filtered responses, in document order."""
    return [s["filtered_resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


@pytest.fixture(scope="module")
def served(llama_server, tasks):
    """The three kinds through local-completions, tokenised by millm's /tokenize."""
    return lm_eval.simple_evaluate(
        model="local-completions",
        model_args=completions_args(llama_server, MODEL),
        tasks=["millm_choice", "millm_rolling", "millm_gen"],
        task_manager=tasks,
        log_samples=True,
    )


@pytest.fixture(scope="module")
def reference(tiny_dirs, tasks):
    """lm-eval's own transformers backend on the same weights, tokenising as the remote one does."""
    return lm_eval.simple_evaluate(
        model="hf",
        model_args={
            "pretrained": str(tiny_dirs["llama"]),
            "dtype": "float32",
            "device": "cpu",
            "max_length": 128,
            "add_bos_token": False,
        },
        tasks=["millm_choice", "millm_rolling"],
        task_manager=tasks,
        log_samples=True,
    )


def test_the_remote_tokenizer_is_detected(llama_server):
    from lm_eval.utils import check_remote_tokenizer_support

    assert check_remote_tokenizer_support(f"{llama_server.base_url}/v1/completions")


def test_choice_loglikelihoods_equal_the_hf_backend(served, reference):
    ours, theirs = responses(served, "millm_choice"), responses(reference, "millm_choice")
    assert [len(doc) for doc in ours] == [len(c["choices"]) for c in CHOICES]
    for doc_ours, doc_theirs in zip(ours, theirs, strict=True):
        for (logprob, greedy), (expected, expected_greedy) in zip(
            doc_ours, doc_theirs, strict=True
        ):
            assert logprob == pytest.approx(expected, abs=1e-4)
            assert greedy == expected_greedy
    assert served["results"]["millm_choice"]["acc,none"] == pytest.approx(
        reference["results"]["millm_choice"]["acc,none"]
    )


def test_rolling_loglikelihoods_equal_the_hf_backend(served, reference):
    ours = [doc[0] for doc in responses(served, "millm_rolling")]
    theirs = [doc[0] for doc in responses(reference, "millm_rolling")]
    assert ours == pytest.approx(theirs, abs=1e-4)
    assert all(value < 0 for value in ours)


def test_generate_until_gives_millms_own_greedy_answer(served, llama_server):
    for doc, answer in zip(QUESTIONS, responses(served, "millm_gen"), strict=True):
        direct = post(
            llama_server,
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": doc["question"],
                "max_tokens": MAX_GEN,
                "temperature": 0,
                "stop": ["\n"],
                "add_special_tokens": False,
            },
        )
        assert direct.status_code == 200, direct.text
        assert answer == [direct.json()["choices"][0]["text"]]


def test_local_chat_completions_generates_what_the_chat_route_answers(llama_server, tasks):
    result = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args={
            "base_url": f"{llama_server.base_url}/v1/chat/completions",
            "model": MODEL,
            "num_concurrent": 1,
            "max_retries": 1,
        },
        tasks=["millm_gen"],
        task_manager=tasks,
        apply_chat_template=True,
        log_samples=True,
    )
    for doc, answer in zip(QUESTIONS, responses(result, "millm_gen"), strict=True):
        direct = post(
            llama_server,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": doc["question"]}],
                "max_tokens": MAX_GEN,
                "temperature": 0,
                "stop": ["\n"],
            },
        )
        assert direct.status_code == 200, direct.text
        assert answer == [direct.json()["choices"][0]["message"]["content"]]


@pytest.fixture(scope="module")
def steered_server(tiny_dirs, tmp_path_factory):
    """A server whose variant `pirate` steers one feature of an attached SAE, scoring steered."""
    with llama_with_sae(tiny_dirs, tmp_path_factory.mktemp("lm-eval"), seed=21) as server:
        steering = [
            {"sae_id": server.sae, "layer": 1, "features": [{"index": 3, "strength": 40.0}]}
        ]
        variant = {
            "name": "pirate",
            "base": MODEL,
            "steering": {"steering": steering},
            "scoring": "steered",
        }
        assert post(server, "/api/variants", variant).status_code == 201
        yield server, server.sae_dir


def test_a_steered_variants_loglikelihoods_equal_a_forward_pass_under_its_steering(
    steered_server, tiny_dirs, tasks
):
    """lm-eval names the variant (loglikelihood, rolling and generate_until); its reference is
    lm-eval's own hf backend over transformers' forward pass with the same feature's decoder row
    added after block 1 (a forward hook)."""
    from lm_eval.models.huggingface import HFLM

    from tests.support.steered_forward import hooked_model

    server, sae_dir = steered_server
    served = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=completions_args(server, "pirate"),
        tasks=["millm_choice", "millm_rolling", "millm_gen"],
        task_manager=tasks,
        log_samples=True,
    )
    for doc, answer in zip(QUESTIONS, responses(served, "millm_gen"), strict=True):
        direct = post(
            server,
            "/v1/completions",
            {
                "model": "pirate",
                "prompt": doc["question"],
                "max_tokens": MAX_GEN,
                "temperature": 0,
                "stop": ["\n"],
                "add_special_tokens": False,
            },
        )
        assert direct.status_code == 200
        assert "variant" in member(direct.headers["x-millm-steering"])[1]
        assert answer == [direct.json()["choices"][0]["text"]]
    stock = hooked_model(tiny_dirs["llama"], sae_dir, layer=1, index=3, strength=40.0)
    reference = lm_eval.simple_evaluate(
        model=HFLM(
            pretrained=stock,
            tokenizer=str(tiny_dirs["llama"]),
            device="cpu",
            max_length=128,
            add_bos_token=False,
        ),
        tasks=["millm_choice", "millm_rolling"],
        task_manager=tasks,
        log_samples=True,
    )
    for task in ("millm_choice", "millm_rolling"):
        ours, theirs = (
            [r[0] if isinstance(r, (list, tuple)) else r for d in responses(run, task) for r in d]
            for run in (served, reference)
        )
        assert ours == pytest.approx(theirs, abs=1e-4), task
    unsteered = post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": "The sky is blue", "echo": True, "logprobs": 1, "max_tokens": 0},
    ).json()["choices"][0]["logprobs"]["token_logprobs"][1:]
    steered = post(
        server,
        "/v1/completions",
        {
            "model": "pirate",
            "prompt": "The sky is blue",
            "echo": True,
            "logprobs": 1,
            "max_tokens": 0,
        },
    ).json()["choices"][0]["logprobs"]["token_logprobs"][1:]
    assert max(abs(a - b) for a, b in zip(steered, unsteered, strict=True)) > 1e-3
