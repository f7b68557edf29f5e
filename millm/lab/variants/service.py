"""/api/variants and the MCP tools over them: create, read, change and delete steered variants.

Every refusal names the field: an unknown base (or a variant as base), a name some model has, a
profile that does not exist, a steering that does not parse or (while the base is loaded) does
not fit the attached SAEs. A variant's base is stored by its registered name (a bare repository
name becomes its one repo:QUANT).
"""

from __future__ import annotations

from millm.errors import InvalidRequest, MillmError
from millm.kernel.variants.book import parsed, variant_document
from millm.lab.variants.parts import VariantParts
from millm.lab.variants.protocol import (
    VariantBody,
    VariantDeleted,
    VariantList,
    VariantPatch,
    VariantView,
)


class VariantManagement:
    """Variants as the API presents them."""

    def __init__(self, state: VariantParts):
        self.state = state
        self.book = state.variants.book

    def list(self) -> VariantList:
        """Every variant, by name, each saying whether it fits now."""
        return VariantList(data=[self._view(row) for row in self.book.all()])

    def get(self, key: str) -> VariantView:
        """One variant by name or id (404 variant_not_found)."""
        return self._view(self.book.find(key))

    def create(self, body: VariantBody) -> VariantView:
        """Store a new variant after every check its fields allow now."""
        fields = body.model_dump()
        name, base, document = self._checked(fields, current=None)
        return self._view(self.book.create(name, base, document))

    def update(self, key: str, patch: VariantPatch) -> VariantView:
        """Change the fields sent; `profile` and `steering` each replace the other."""
        row = self.book.find(key)
        sent = patch.model_dump(exclude_unset=True)
        fields = {"name": row["name"], "base": row["base"], **row["document"]}
        if "profile" in sent or "steering" in sent:
            fields.pop("profile", None), fields.pop("steering", None)
        fields.update({key: value for key, value in sent.items() if value is not None})
        for cleared in ("steering_intensity", "description"):  # null clears these two
            if cleared in sent and sent[cleared] is None:
                fields[cleared] = None
        name, base, document = self._checked(fields, current=row["name"])
        return self._view(self.book.update(row["id"], name, base, document))

    def delete(self, key: str) -> VariantDeleted:
        """Forget a variant: requests naming it get 404 model_not_found from now on."""
        row = self.book.delete(key)
        return VariantDeleted(id=row["id"], name=row["name"])

    # checks ---------------------------------------------------------------------------------------
    def _checked(self, fields: dict, current: str | None) -> tuple[str, str, dict]:
        name = fields["name"]
        models = self.state.models
        if name != current and models.find(name) is not None:
            raise InvalidRequest(
                f"{name!r} is a registered model's name, and clients name models and variants "
                "alike; choose another",
                param="name",
                code="variant_name_taken",
            )
        base = self._base(fields["base"])
        document = variant_document(fields)
        if document.get("profile") is not None:
            try:
                self.state.profiles.find(document["profile"])
            except MillmError as exc:
                raise InvalidRequest(
                    exc.message, param="profile", code="profile_not_found"
                ) from None
        problem = self._problem({"id": "", "name": name, "base": base, "document": document})
        if problem is not None:
            field = "profile" if document.get("profile") is not None else "steering"
            raise InvalidRequest(
                f"the steering does not fit {base!r} as loaded now: {problem}",
                param=field,
                code="variant_unfit",
            )
        return name, base, document

    def _base(self, base: str) -> str:
        """The registered model `base` names; 400 naming `base` otherwise."""
        if self.book.named(base) is not None:
            raise InvalidRequest(
                f"{base!r} is a variant; a variant's base is a registered model",
                param="base",
                code="unknown_base",
            )
        try:
            return self.state.models.get(self.state.models.canonical(base)).name
        except MillmError as exc:
            raise InvalidRequest(exc.message, param="base", code="unknown_base") from None

    def _problem(self, row: dict) -> str | None:
        """Why the variant does not fit the loaded model's SAEs now; None when it fits or its
        base is not loaded."""
        lm = self.state.switch.lm
        if lm is None or lm.name != row["base"]:
            return None
        return self.state.variants.problem(parsed(row))

    def _view(self, row: dict) -> VariantView:
        doc = row["document"]
        lm = self.state.switch.lm
        loaded = lm is not None and lm.name == row["base"]
        try:
            problem = self._problem(row)
        except MillmError as exc:  # a stored document that no longer reads
            problem = exc.message
        return VariantView(
            id=row["id"],
            name=row["name"],
            base=row["base"],
            description=doc.get("description", ""),
            profile=doc.get("profile"),
            steering=doc.get("steering"),
            steering_intensity=doc.get("steering_intensity"),
            scoring=doc.get("scoring", "unsteered"),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            fits=(problem is None) if loaded else None,
            problem=problem,
        )
