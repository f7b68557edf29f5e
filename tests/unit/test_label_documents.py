"""Feature-label documents: every format read (and detected), every refusal named by its entry,
exports read back."""

from __future__ import annotations

import json

import pytest

from millm.errors import InvalidFeatureIndex, InvalidRequest
from millm.formats.label_exports import export_csv, export_json, export_mistudio, export_neuronpedia
from millm.formats.labels import Label, LabelDocument, check_width, detect_format, read_document

NEURONPEDIA = [
    {
        "modelId": "gemma-2-2b",
        "layer": "20-gemmascope-res-16k",
        "index": "4691",
        "description": " LaTeX formatting elements",
        "explanationModelName": "gpt-4o-mini",
        "typeName": "oai_token-act-pair",
        "id": "x1",
        "embedding": [0.1],
    },
    {
        "modelId": "gemma-2-2b",
        "layer": "20-gemmascope-res-16k",
        "index": "4691",
        "description": "math markup",
        "explanationModelName": "claude-3",
    },
    {
        "modelId": "gemma-2-2b",
        "layer": "20-gemmascope-res-16k",
        "index": "12",
        "description": "",
        "explanationModelName": "gpt-4o-mini",
    },
    {
        "modelId": "gemma-2-2b",
        "layer": "20-gemmascope-res-16k",
        "index": "12",
        "description": " the word 'river'",
    },
    {"modelId": "gemma-2-2b", "layer": "20-gemmascope-res-16k", "index": "7", "description": "  "},
]
FEATURE_ANSWER = {
    "modelId": "gemma-2-2b",
    "layer": "20-gemmascope-res-16k",
    "index": 4691,
    "density": 0.01,
    "explanations": [
        {"description": "", "explanationModelName": "a"},
        {"description": " LaTeX", "explanationModelName": "gpt-4o-mini", "typeName": "oai"},
    ],
}
MISTUDIO = {
    "explanations": [
        {
            "feature_index": 3,
            "explanations": [
                {
                    "description": "expressions of love",
                    "method": "miStudio_openai",
                    "score": 0.85,
                    "created_at": "2025-12-01T00:00:00Z",
                }
            ],
        },
        {"feature_index": 9, "explanations": [{"description": " ", "method": "miStudio_auto"}]},
    ]
}
PLAIN = {
    "0": "zero",
    "2": {"label": " two ", "top_tokens": [" a", " b"], "example": "x[[ a]]", "frequency": 0.1},
    "5": "",
}


def doc(value, content_type="application/json", fmt=None) -> LabelDocument:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return read_document(raw, content_type, fmt)


def triples(document: LabelDocument) -> list[tuple[int, str]]:
    return [(x.index, x.label) for x in document.labels]


@pytest.mark.parametrize(
    "value, content_type, fmt, expected_format, expected, skipped",
    [
        # Neuronpedia's export: the first non-empty description of an index wins, stripped;
        # all-empty indices are skipped.
        (
            NEURONPEDIA,
            "application/json",
            None,
            "neuronpedia",
            [(12, "the word 'river'"), (4691, "LaTeX formatting elements")],
            1,
        ),
        ([], "application/json", None, "neuronpedia", [], 0),
        # The per-feature answer, alone or as a list.
        (FEATURE_ANSWER, "application/json", None, "neuronpedia_feature", [(4691, "LaTeX")], 0),
        (
            [
                FEATURE_ANSWER,
                {**FEATURE_ANSWER, "index": "8", "explanations": [{"description": "eight"}]},
            ],
            None,
            None,
            "neuronpedia_feature",
            [(8, "eight"), (4691, "LaTeX")],
            0,
        ),
        ({"index": 1, "explanations": []}, None, None, "neuronpedia_feature", [], 1),
        # miStudio's explanations.json.
        (MISTUDIO, "application/json", None, "mistudio", [(3, "expressions of love")], 1),
        # Plain JSON: strings or objects with a label; extra keys are detail.
        (PLAIN, "application/json", None, "json", [(0, "zero"), (2, "two")], 1),
        ({}, None, None, "json", [], 0),
        # CSV: by content type, by a body that is no JSON, or forced; header optional; quoted
        # commas.
        (
            b'index,label\n1,one\n2,"two, too"\n\n3,  \n',
            "text/csv",
            None,
            "csv",
            [(1, "one"), (2, "two, too")],
            1,
        ),
        (b"\xef\xbb\xbf1,one\r\n10,ten\r\n", None, None, "csv", [(1, "one"), (10, "ten")], 0),
        (
            b'Index,Label\n4,"multi\nline"\n',
            "application/octet-stream",
            None,
            "csv",
            [(4, "multi\nline")],
            0,
        ),
        (b"7,seven\n", "application/json", "csv", "csv", [(7, "seven")], 0),
        # Forcing a JSON format reads it so even when the shape would say another.
        (
            [{"index": "5", "description": "five"}],
            None,
            "neuronpedia",
            "neuronpedia",
            [(5, "five")],
            0,
        ),
    ],
)
def test_formats_are_read(value, content_type, fmt, expected_format, expected, skipped):
    document = doc(value, content_type, fmt)
    assert (document.format, triples(document), document.skipped) == (
        expected_format,
        expected,
        skipped,
    )


def test_details_keep_what_the_source_said():
    by_index = {x.index: x for x in doc(NEURONPEDIA).labels}
    assert by_index[4691].detail == {
        "model_id": "gemma-2-2b",
        "neuronpedia_layer": "20-gemmascope-res-16k",
        "explainer": "gpt-4o-mini",
        "type": "oai_token-act-pair",
        "others": ["math markup"],
    }
    assert by_index[12].detail == {
        "model_id": "gemma-2-2b",
        "neuronpedia_layer": "20-gemmascope-res-16k",
    }  # its explainer is unnamed
    assert doc(MISTUDIO).labels[0].detail == {
        "method": "miStudio_openai",
        "score": 0.85,
        "created_at": "2025-12-01T00:00:00Z",
    }
    assert doc(PLAIN).labels[1].detail == {
        "top_tokens": [" a", " b"],
        "example": "x[[ a]]",
        "frequency": 0.1,
    }
    assert {
        doc(NEURONPEDIA).source,
        doc(FEATURE_ANSWER).source,
        doc(MISTUDIO).source,
        doc(PLAIN).source,
    } == {"neuronpedia", "mistudio", "plain"}


@pytest.mark.parametrize(
    "value, content_type, fmt, message",
    [
        (
            [{"index": "1", "description": "a"}] * 12 + [{"index": "abc", "description": "x"}],
            None,
            None,
            "invalid Neuronpedia explanation export: entry 12: index 'abc' is not a number",
        ),
        ([{"index": -3, "description": "x"}], None, None, "entry 0: index -3 is not a number"),
        ([{"index": True, "description": "x"}], None, None, "entry 0: index true is not a number"),
        ([{"description": "x"}], None, None, "entry 0: index: Field required"),
        (
            [{"index": "1", "description": 5}],
            None,
            None,
            "entry 0: description: Input should be a valid string (got 5)",
        ),
        ([{"index": "1.5", "description": "x"}] * 7, None, None, "(and 2 more problems)"),
        (
            {"index": "x", "explanations": [{"description": 1}]},
            None,
            None,
            "invalid Neuronpedia feature answer: entry 0: index 'x' is not a number; entry 0: "
            "explanations[0].description: Input should be a valid string",
        ),
        (
            {"explanations": [{"feature_index": 1, "explanations": []}, {"feature_index": "q"}]},
            None,
            None,
            "invalid miStudio label export: entry 1: index 'q' is not a number",
        ),
        (
            {"explanations": 5},
            None,
            None,
            "invalid miStudio label export: explanations: Input should be a valid list",
        ),
        (
            {"0": "zero", "abc": "x"},
            None,
            None,
            "invalid labels object: entry 'abc': index 'abc' is not a number",
        ),
        (
            {"3": 3},
            None,
            None,
            "entry '3': the value must be a label (a string) or an object with a string 'label'",
        ),
        ({"3": {"top_tokens": []}}, None, None, "entry '3': label: Field required"),
        ({"5": "a", "05": "b"}, None, None, "entry '05': index 5 appears twice (also as '5')"),
        (
            b"1,one\n1,again\n",
            "text/csv",
            None,
            "invalid labels CSV: row 2: index 1 appears twice (first in row 1)",
        ),
        (
            b"index,label\nx,one\n",
            "text/csv",
            None,
            "invalid labels CSV: row 2: index 'x' is not a number",
        ),
        (
            b"1,one,two\n",
            "text/csv",
            None,
            "row 1: expected 2 cells (index,label), got 3; quote a label that holds a comma",
        ),
        (b"1\n", "text/csv", None, "row 1: expected 2 cells (index,label), got 1"),
        (b'1,"open\n', "text/csv", None, "invalid labels CSV: row 1: unexpected end of data"),
        (
            b"5",
            None,
            None,
            "a labels document is a JSON object or list (or index,label CSV); this one is a number",
        ),
        (b"null", None, None, "this one is null"),
        (b"[1,", "application/json", None, "the labels document is not valid JSON"),
        (b"\xff\xfe1,a", None, None, "the labels document is not UTF-8 text"),
        (
            {"0": "zero"},
            None,
            "neuronpedia",
            "invalid Neuronpedia explanation export: Input should be a valid list",
        ),
    ],
)
def test_bad_documents_are_refused_naming_the_entry(value, content_type, fmt, message):
    with pytest.raises(InvalidRequest) as refused:
        doc(value, content_type, fmt)
    assert refused.value.code == "invalid_labels" and refused.value.status == 400
    assert message in refused.value.message, refused.value.message


def test_indices_past_the_width_are_refused_naming_the_entry():
    check_width(doc({"0": "a", "127": "b"}), 128)
    with pytest.raises(
        InvalidFeatureIndex,
        match=r"^entry '128': feature 128 is past the SAE's width \(128 features: 0\.\.127\)$",
    ):
        check_width(doc({"0": "a", "128": "b"}), 128)
    with pytest.raises(InvalidFeatureIndex, match=r"^row 2: feature 9 is past"):
        check_width(doc(b"1,a\n9,b\n", "text/csv"), 5)
    with pytest.raises(InvalidFeatureIndex, match=r"^entry 1: feature 70 is past"):
        check_width(
            doc([{"index": "1", "description": "a"}, {"index": "70", "description": "b"}]), 64
        )


@pytest.mark.parametrize(
    "value, expected",
    [
        ([], "neuronpedia"),
        ([{"index": "1"}], "neuronpedia"),
        ([{"index": 1, "explanations": []}], "neuronpedia_feature"),
        ({"index": 1, "explanations": []}, "neuronpedia_feature"),
        ({"explanations": []}, "mistudio"),
        ({"1": "a"}, "json"),
        ({}, "json"),
    ],
)
def test_formats_are_detected_by_shape(value, expected):
    assert detect_format(value) == expected


LABELS = [
    Label(0, "zero", {"explainer": "gpt-4o-mini", "type": "oai"}),
    Label(3, 'comma, "quoted"\nand a new line', {}),
    Label(70, "seventy", {"top_tokens": ["x"]}),
]


@pytest.mark.parametrize(
    "raw, content_type",
    [
        (json.dumps(export_json(LABELS)).encode(), "application/json"),
        (json.dumps(export_json(LABELS, detail=True)).encode(), "application/json"),
        (export_csv(LABELS).encode(), "text/csv"),
        (json.dumps(export_neuronpedia(LABELS, "tiny", "1-res")).encode(), "application/json"),
        (json.dumps(export_mistudio(LABELS)).encode(), "application/json"),
    ],
)
def test_every_export_reads_back_to_the_same_labels(raw, content_type):
    assert triples(read_document(raw, content_type)) == [(x.index, x.label) for x in LABELS]


def test_exports_have_the_documented_shapes():
    assert export_json(LABELS[:1]) == {"0": "zero"}
    assert export_json(LABELS[2:], detail=True) == {"70": {"label": "seventy", "top_tokens": ["x"]}}
    assert export_csv(LABELS[:1]) == "index,label\n0,zero\n"
    assert export_neuronpedia(LABELS[:1], "tiny", "1-res") == [
        {
            "modelId": "tiny",
            "layer": "1-res",
            "index": "0",
            "description": "zero",
            "explanationModelName": "gpt-4o-mini",
            "typeName": "oai",
        }
    ]
    assert export_mistudio(LABELS[:1]) == {
        "explanations": [
            {
                "feature_index": 0,
                "explanations": [{"description": "zero", "method": None, "score": None}],
            }
        ]
    }
