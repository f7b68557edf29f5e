"""The file objects of /v1/files, in OpenAI's shape."""

from __future__ import annotations

from typing import Literal

from millm.v1.objects import WireModel

Purpose = Literal["batch", "batch_output"]
PURPOSES = ("batch",)  # what a client may upload


class FileObject(WireModel):
    """A stored file: never where its bytes are."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: str  # processed, deleted, expired
    status_details: None = None


class FileList(WireModel):
    """GET /v1/files: a page of files, with the cursor's ends."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeletedBody(WireModel):
    """DELETE /v1/files/{id}."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
