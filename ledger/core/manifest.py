"""The manifest: items and policy of a run, validated by pydantic, and its input version."""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from ledger.core.errors import InvalidInput, ManifestInvalid
from ledger.core.validation import (  # noqa: F401  (re-exported: part of this module's surface)
    _CONTROL,
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_MANIFEST_BYTES,
    MAX_PAYLOAD_BYTES,
    canonical_json,
    check_identifier,
    check_unicode,
    input_version_of,
    json_depth_ok,
    plain_json,
    strict_loads,
)

_PERCENT = re.compile(r"^(\d{1,3})%$")


def _id_rule(value: str) -> str:
    """The ledger's id rule (validation.check_identifier) as a pydantic validator: the
    NFC form, or a ValueError pydantic reports with the field's path."""
    try:
        return check_identifier(value, "the id")
    except InvalidInput as e:
        raise ValueError(e.message.removeprefix("the id ")) from None


def _value_error(message: str) -> ValueError:
    return ValueError(message.removeprefix("payload "))


_DAY = 86_400


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Review(_Strict):
    """A review gate: the decision required before `complete`."""

    decision: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    survives_amendment: bool = False

    @field_validator("decision")
    @classmethod
    def _decision(cls, v: str) -> str:
        return _id_rule(v)


class Acceptance(_Strict):
    """What an item's acceptance must carry (rule 16 of the rule book)."""

    evidence: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("evidence")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        for key in v:
            if not key or len(key) > MAX_ID_CHARS or _CONTROL.search(key):
                raise ValueError(f"evidence key {key!r} must be 1-{MAX_ID_CHARS} characters")
        return list(dict.fromkeys(v))


class Policy(_Strict):
    """How a run decides retries, leases, deadlines, review and success."""

    partial_delivery: bool = False
    tolerated_failures: int | str | None = None
    max_attempts: int = Field(default=3, ge=1, le=100)
    backoff_seconds: float = Field(default=0.0, ge=0, le=7 * _DAY)
    lease_seconds: float = Field(default=60.0, gt=0, le=_DAY)
    item_deadline_seconds: float | None = Field(default=None, gt=0, le=365 * _DAY)
    run_deadline_seconds: float | None = Field(default=None, gt=0, le=365 * _DAY)
    review: Review | None = None
    # How long a run waiting on workers may go without a run or item transition before it
    # is flagged stalled (ledger/reads/signals.py); None means the default, 900 s.
    stall_seconds: float | None = Field(default=None, gt=0, le=30 * _DAY)
    acceptance: Acceptance = Acceptance()

    @model_serializer(mode="wrap")
    def _without_defaults_added_later(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        # the fields added after the first manifests (stall_seconds, acceptance) are left
        # out while unset, so a manifest that does not set them keeps its content digest
        data: dict[str, Any] = handler(self)
        if data.get("stall_seconds") is None:
            data.pop("stall_seconds", None)
        if data.get("acceptance") == {"evidence": []}:
            data.pop("acceptance", None)
        return data

    @field_validator(
        "backoff_seconds",
        "lease_seconds",
        "item_deadline_seconds",
        "run_deadline_seconds",
        "stall_seconds",
        mode="before",
    )
    @classmethod
    def _number(cls, v: Any) -> Any:
        # strict mode refuses ints for floats; accept both but never strings or bools
        if isinstance(v, bool):
            raise ValueError("must be a number, not a boolean")
        if isinstance(v, int):
            return float(v)
        return v

    @field_validator("tolerated_failures")
    @classmethod
    def _tolerated(cls, v: int | str | None) -> int | str | None:
        if v is None:
            return v
        if isinstance(v, bool):
            raise ValueError("must be null, an integer or a string like '5%'")
        if isinstance(v, int):
            if v < 0 or v > 10_000_000:
                raise ValueError("must be between 0 and 10000000")
            return v
        m = _PERCENT.match(v)
        if not m or int(m.group(1)) > 100:
            raise ValueError("must be null, an integer or a string like '5%' (0-100%)")
        return v

    @model_validator(mode="after")
    def _partial(self) -> Policy:
        if self.tolerated_failures is not None and not self.partial_delivery:
            raise ValueError("tolerated_failures is only allowed with partial_delivery=true")
        return self

    def tolerated(self, required_count: int) -> int:
        """How many required items may end not accepted under partial delivery."""
        if not self.partial_delivery:
            return 0
        if self.tolerated_failures is None:
            return required_count
        if isinstance(self.tolerated_failures, int):
            return self.tolerated_failures
        pct = int(self.tolerated_failures.rstrip("%"))
        return required_count * pct // 100


class ManifestItem(_Strict):
    """One unit of work in a manifest."""

    item_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    required: bool = True
    payload: Any = None

    @field_validator("item_id")
    @classmethod
    def _id(cls, v: str) -> str:
        return _id_rule(v)

    @field_validator("payload")
    @classmethod
    def _payload(cls, v: Any) -> Any:
        # strict JSON (no NaN: pydantic would store it as null), returned as plain data
        return plain_json(v, "payload", MAX_PAYLOAD_BYTES, error=_value_error)[0]


class Manifest(_Strict):
    """Why a set of items is processed, and under which settings."""

    source_version: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    config_version: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    scope: str = Field(default="", max_length=2000)
    items: list[ManifestItem] = Field(min_length=1)
    policy: Policy = Policy()

    @field_validator("source_version", "config_version")
    @classmethod
    def _version(cls, v: str) -> str:
        return _id_rule(v)

    @field_validator("scope")
    @classmethod
    def _scope(cls, v: str) -> str:
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("is not valid Unicode text (it contains a lone surrogate)") from None
        return v

    @field_validator("items")
    @classmethod
    def _unique(cls, items: list[ManifestItem]) -> list[ManifestItem]:
        # a field validator, so the error's path is `items` (a model validator has none)
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item.item_id in seen:
                raise ValueError(
                    f"items.{i}.item_id {item.item_id!r} is a duplicate; item ids are unique within a run"
                )
            seen.add(item.item_id)
        return items

    def to_json_dict(self) -> dict[str, Any]:
        """The manifest as plain JSON data (every default filled in)."""
        return self.model_dump(mode="json")

    def input_version(self) -> str:
        """Content digest of the manifest: the run's input version."""
        return input_version_of(self.to_json_dict())


def _format_error(err: ValidationError) -> ManifestInvalid:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "manifest"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key; allowed keys are those of the manifest reference (docs/reference/manifest.md)"
    if first["type"] == "missing":
        msg = "is required"
    msg = msg.removeprefix("Value error, ")
    detail = f"manifest field {loc}: {msg}"
    errors: list[dict[str, object]] = [
        {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]}
        for e in err.errors()[:20]
    ]
    return ManifestInvalid(detail, field=loc, errors=errors)


def _load_json(data: str | bytes | bytearray) -> Any:
    return strict_loads(
        data, "manifest", MAX_MANIFEST_BYTES, error=lambda m: ManifestInvalid(m, field="manifest")
    )


def parse_manifest(data: Manifest | dict[str, Any] | str | bytes) -> Manifest:
    """Validate a manifest given as a model, a dict or JSON text; raise ManifestInvalid."""
    return parse_manifest_json(data)[0]


def parse_manifest_json(
    data: Manifest | dict[str, Any] | str | bytes,
) -> tuple[Manifest, dict[str, Any], str]:
    """`parse_manifest`, with the manifest's JSON data and canonical JSON text (the text its
    size limit and its input version are computed from: encoded once)."""
    if isinstance(data, Manifest):
        plain = data.to_json_dict()
        return data, plain, canonical_json(plain)
    if isinstance(data, (str, bytes, bytearray)):
        data = _load_json(data)
    if not isinstance(data, dict):
        raise ManifestInvalid(
            f"manifest must be a JSON object, got {type(data).__name__}", field="manifest"
        )
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as e:
        raise _format_error(e) from None
    except RecursionError:
        raise ManifestInvalid(
            f"manifest nests too deeply; at most {MAX_JSON_DEPTH} levels", field="manifest"
        ) from None
    # a dict never passed through _load_json's size check: measure it as JSON too
    plain = manifest.to_json_dict()
    text = canonical_json(plain)
    try:
        size = len(text.encode())
    except UnicodeEncodeError:  # every string field is checked; this is the last guard
        raise ManifestInvalid(
            "manifest is not valid Unicode text (it contains a lone surrogate)", field="manifest"
        ) from None
    if size > MAX_MANIFEST_BYTES:
        raise ManifestInvalid(
            f"manifest is {size} bytes as JSON; at most {MAX_MANIFEST_BYTES} bytes allowed",
            field="manifest",
        )
    return manifest, plain, text


def parse_items(data: Any, field: str = "items") -> list[ManifestItem]:
    """Validate a list of manifest items (for amend and repair corrections)."""
    if not isinstance(data, list):
        raise ManifestInvalid(f"{field} must be a list of items", field=field)
    out = []
    for i, raw in enumerate(data):
        if isinstance(raw, ManifestItem):
            out.append(raw)
            continue
        if not isinstance(raw, dict):
            raise ManifestInvalid(f"{field}.{i} must be an object", field=f"{field}.{i}")
        try:
            out.append(ManifestItem.model_validate(raw))
        except ValidationError as e:
            inner = _format_error(e)
            path = f"{field}.{i}.{inner.field}"
            raise ManifestInvalid(
                inner.message.replace(f"field {inner.field}", f"field {path}"), field=path
            ) from None
    seen: set[str] = set()
    for i, item in enumerate(out):
        if item.item_id in seen:
            raise ManifestInvalid(
                f"manifest field {field}.{i}.item_id: {item.item_id!r} is a duplicate",
                field=f"{field}.{i}.item_id",
            )
        seen.add(item.item_id)
    return out


def parse_policy(data: Any, base: Policy | None = None) -> Policy:
    """Validate a policy change: given fields override `base` (or the defaults)."""
    if isinstance(data, Policy):
        return data
    if not isinstance(data, dict):
        raise ManifestInvalid("policy must be an object", field="policy")
    merged = (base.model_dump(mode="json") if base else {}) | data
    try:
        return Policy.model_validate(merged)
    except ValidationError as e:
        inner = _format_error(e)
        path = f"policy.{inner.field}"
        raise ManifestInvalid(
            inner.message.replace(f"field {inner.field}", f"field {path}"), field=path
        ) from None
