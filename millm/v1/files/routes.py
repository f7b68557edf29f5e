"""POST/GET /v1/files, GET/DELETE /v1/files/{id}, GET /v1/files/{id}/content: OpenAI's files API
for batches (the SDK's client.files.create(..., purpose="batch") and client.files.content)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import StreamingResponse

from millm.v1.files.protocol import FileDeletedBody, FileList, FileObject
from millm.v1.files.service import Files
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post("/v1/files", summary="Upload a JSONL file for a batch")
def upload_file(
    request: Request,
    file: Annotated[UploadFile | None, File()] = None,
    purpose: Annotated[str | None, Form()] = None,
) -> FileObject:
    """Store the file whole (multipart `file` and `purpose: batch`), or nothing past the caps."""
    source = file.file if file is not None else None
    filename = file.filename if file is not None else None
    return part(request, Files).upload(source, filename, purpose)


@router.get("/v1/files", summary="List files")
def list_files(
    request: Request,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    """A page of files, newest first (`order=asc` for oldest), after the file `after`."""
    return part(request, Files).listed(purpose, after, limit, order)


@router.get("/v1/files/{file_id}", summary="One file")
def get_file(file_id: str, request: Request) -> FileObject:
    """The file's record: its size, purpose, status and expiry (never where its bytes are)."""
    return part(request, Files).get(file_id)


@router.get("/v1/files/{file_id}/content", summary="A file's bytes")
def file_content(file_id: str, request: Request) -> StreamingResponse:
    """The stored bytes, streamed as application/jsonl (404 file_expired or file_deleted once
    they are gone)."""
    chunks, size = part(request, Files).content(file_id)
    return StreamingResponse(
        chunks, media_type="application/jsonl", headers={"Content-Length": str(size)}
    )


@router.delete("/v1/files/{file_id}", summary="Delete a file")
def delete_file(file_id: str, request: Request) -> FileDeletedBody:
    """Drop the file's bytes; its record stays, saying it was deleted."""
    return part(request, Files).delete(file_id)
