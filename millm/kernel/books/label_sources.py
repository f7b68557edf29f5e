"""Where a labels document comes from when it is not a request body: a file, a URL, or the SAE's
own explanations on Neuronpedia (its export route, for the SAE's Neuronpedia id).

Neuronpedia's bulk dumps are JSON Lines, often gzipped: both are read, as is a plain JSON list.
What is fetched has a size bound and a time bound, and is then imported as any labels document
is (read_document: format detected, width checked, all or nothing).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

from millm.errors import InvalidRequest, describe
from millm.formats.labels import LabelDocument, check_width, read_document
from millm.interp.sae_files import SAEInfo
from millm.kernel.books.labels import ImportCounts, LabelBook

MAX_FETCHED_BYTES = 256 * 1024 * 1024  # a 1M-feature SAE's explanations fit with room to spare
FETCH_TIMEOUT_S = 120.0
NEURONPEDIA = "neuronpedia"


def neuronpedia_url(base: str, info: SAEInfo) -> str:
    """Neuronpedia's export of every explanation of this SAE (from its Neuronpedia id)."""
    if not info.neuronpedia_id or "/" not in info.neuronpedia_id:
        raise InvalidRequest(
            f"SAE {info.id} has no Neuronpedia id (registered by a SAELens release name, it gets "
            "one where Neuronpedia hosts it); give the export's URL or file instead",
            param="source",
            code="no_neuronpedia_id",
        )
    model_id, sae = info.neuronpedia_id.split("/", 1)
    query = urlencode({"modelId": model_id, "saeId": sae})
    return f"{base.rstrip('/')}/api/explanation/export?{query}"


def is_url(source: str) -> bool:
    """Whether a labels source is fetched over HTTP(S)."""
    return source.startswith(("http://", "https://"))


def fetch(url: str) -> bytes:
    """The document at `url` (at most MAX_FETCHED_BYTES), or a 400 saying why it could not be
    had."""
    import httpx

    try:
        with httpx.stream("GET", url, timeout=FETCH_TIMEOUT_S, follow_redirects=True) as response:
            if response.status_code != 200:
                raise InvalidRequest(
                    f"{url} answered HTTP {response.status_code}",
                    param="source",
                    code="labels_unreachable",
                )
            parts, size = [], 0
            for part in response.iter_bytes():
                size += len(part)
                if size > MAX_FETCHED_BYTES:
                    raise InvalidRequest(
                        f"{url} is larger than {MAX_FETCHED_BYTES // 2**20} MiB",
                        param="source",
                        code="document_too_large",
                    )
                parts.append(part)
    except httpx.HTTPError as exc:
        raise InvalidRequest(
            f"could not fetch {url} ({describe(exc)})", param="source", code="labels_unreachable"
        ) from None
    return b"".join(parts)


def read_file(path: Path) -> bytes:
    """A labels file's bytes (at most MAX_FETCHED_BYTES)."""
    if not path.is_file():
        raise InvalidRequest(f"no labels file at {path}", param="source")
    if path.stat().st_size > MAX_FETCHED_BYTES:
        raise InvalidRequest(
            f"{path} is larger than {MAX_FETCHED_BYTES // 2**20} MiB",
            param="source",
            code="document_too_large",
        )
    return path.read_bytes()


def as_document(raw: bytes) -> bytes:
    """Gunzipped, and JSON Lines joined into one JSON list; anything else as it came."""
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InvalidRequest(
                f"the labels file is not valid gzip: {exc}", param="source"
            ) from None
    lines = raw.strip().splitlines()
    if len(lines) > 1 and lines[0].lstrip().startswith(b"{") and lines[0].rstrip().endswith(b"}"):
        try:
            return json.dumps([json.loads(line) for line in lines if line.strip()]).encode()
        except ValueError:
            return raw  # not JSON Lines after all: read_document says what it is
    return raw


def import_document(
    book: LabelBook,
    info: SAEInfo,
    raw: bytes,
    content_type: str | None,
    fmt: str | None,
    replace: bool,
) -> tuple[LabelDocument, ImportCounts]:
    """Read a labels document (any accepted format), check it against the SAE's width, and replace
    the SAE's set with it or merge it in; all or nothing."""
    document = read_document(raw, content_type, fmt)
    check_width(document, info.d_sae)
    counts = book.replace(info.id, document) if replace else book.merge(info.id, document)
    return document, counts


def import_source(
    book: LabelBook,
    info: SAEInfo,
    source: str,
    neuronpedia_base: str,
    replace: bool,
    confine: Callable[[str], Path] = Path,
) -> tuple[LabelDocument, ImportCounts]:
    """Import `source` ('neuronpedia', a URL, or a file that `confine` lets through) as the SAE's
    labels."""
    if source == NEURONPEDIA:
        raw = fetch(neuronpedia_url(neuronpedia_base, info))
    elif is_url(source):
        raw = fetch(source)
    else:
        raw = read_file(confine(source))
    return import_document(book, info, as_document(raw), None, None, replace)
