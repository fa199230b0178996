"""The console's forms that act: upload a privatized dataset, start a tuning job on one, and
predict with a tuned prompt. Each builds the API's own request model and calls the API's own
route function, so the checks, limits and errors are the API's; an error is shown on the page
that holds the form.

The service never privatizes: it never sees clean text. The upload form takes the file that
the user's own ``rapt privatize`` wrote (the input's CSV / TSV / JSONL / text format, texts
replaced by their privatized version) with the η it used, and the predict box takes rows of
the same kind. Neither page offers to take clean text."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from rapt.service.deps import Svc, owned
from rapt.service.errors import ServiceError, loc_text
from rapt.service.routes import datasets, jobs, predict, prompts
from rapt.service.routes.console import (
    PATH,
    Form,
    Me,
    _page,
    check_csrf,
    datasets_view,
    redirect,
)
from rapt.service.schemas import DatasetUpload, JobCreate, PredictRequest

router = APIRouter(prefix=PATH, include_in_schema=False)

# What `rapt privatize` writes: the input's own format (read by rapt.data, as the CLI reads it).
FILE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".txt")
MAX_FORM_FILES, MAX_FORM_FIELDS = 1, 20


async def _multipart(request: Request) -> tuple[dict[str, str], dict[str, tuple[str, bytes]]]:
    """The fields and files of a multipart console form whose CSRF token matches (the request
    gate has bounded the body's size)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "multipart/form-data":
        raise ServiceError(415, "unsupported_media_type",
                           "this console form is sent as multipart/form-data")
    form = await request.form(max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS)
    fields: dict[str, str] = {}
    files: dict[str, tuple[str, bytes]] = {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            data = await value.read()
            if value.filename or data:  # a file input left empty sends an unnamed empty part
                files[name] = (value.filename or "upload", data)
        else:
            fields[name] = value
    check_csrf(request, fields.get("csrf"))
    return fields, files


Multipart = Annotated[tuple, Depends(_multipart)]


def _validation_text(e: ValidationError) -> str:
    return "; ".join(f"{loc_text(tuple(x['loc']))}: {x['msg']}" if x["loc"] else x["msg"]
                     for x in e.errors()[:5])


def _number(fields: dict[str, str], name: str, kind: type = float) -> Any:
    """A form field as a number (the API's models take JSON numbers, never strings); None
    when blank; 422 naming the field otherwise."""
    text = fields.get(name, "").strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ServiceError(422, "validation_error", f"{name}: {text!r} is not {what}") from None


def read_privatized(filename: str, data: bytes, *, labelled: bool) -> Any:
    """The rows of a file ``rapt privatize`` wrote (a ``rapt.data.Dataset``), read in the
    format its extension names; 422 naming the file, line and problem otherwise."""
    from rapt.data import DataError, load_dataset

    name = Path(filename).name or "upload"
    suffix = Path(name).suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ServiceError(422, "unsupported_format",
                           f"{name}: give the .csv, .tsv, .jsonl or .txt file that "
                           "`rapt privatize` wrote (it keeps the input's format)")
    with tempfile.TemporaryDirectory(prefix="rapt-console-") as tmp:
        path = Path(tmp) / f"rows{suffix}"
        path.write_bytes(data)
        try:
            ds = load_dataset(path)
            if labelled:
                ds.labels  # noqa: B018 (raises DataError naming an unlabelled row)
        except DataError as e:
            where = name + (f", line {e.line}" if e.line is not None else "") + (
                f", field '{e.field}'" if e.field is not None else "")
            raise ServiceError(422, "invalid_file", f"{where}: {e.problem}") from None
    if not len(ds):
        raise ServiceError(422, "invalid_file", f"{name}: no rows")
    return ds


def _pairs(ds: Any) -> list[str] | None:
    pairs = ds.text_pairs
    return [p or "" for p in pairs] if any(p is not None for p in pairs) else None


@router.post("/datasets")
def upload(request: Request, svc: Svc, me: Me, form: Multipart) -> Response:
    """Store the rows of a privatized file, declared as privatized at the η the user gives."""
    fields, files = form
    try:
        if "file" not in files:
            raise ServiceError(422, "validation_error", "choose the privatized file to upload")
        ds = read_privatized(*files["file"], labelled=True)
        backbone = fields.get("backbone", "")
        body = DatasetUpload(
            backbone=backbone, texts=ds.texts, text_pairs=_pairs(ds), labels=ds.labels,
            num_labels=max(len(ds.label_names), 2),
            privacy={"mechanism": "dchi-text2text", "eta": _number(fields, "eta"),
                     "embedding": backbone})
        info = datasets.upload_dataset(body, svc, me)
    except ValidationError as e:
        return datasets_view(request, svc, me, 422, upload_error=_validation_text(e),
                             form=fields)
    except ServiceError as e:
        return datasets_view(request, svc, me, e.status, upload_error=e.detail, form=fields)
    names = ", ".join(f"{i} = {n}" for i, n in enumerate(ds.label_names))
    return datasets_view(request, svc, me, 201, uploaded=info, label_names=names)


def _job_body(fields: dict[str, str]) -> JobCreate:
    """The job form's main options; a blank field takes the API's default."""
    body: dict[str, Any] = {"dataset_id": fields.get("dataset_id", "")}
    if fields.get("method", "").strip():
        body["method"] = fields["method"].strip()
    for name, kind in (("epochs", int), ("batch_size", int), ("lr", float)):
        if (value := _number(fields, name, kind)) is not None:
            body[name] = value
    if (eps := _number(fields, "dp_epsilon")) is not None:
        body["dp"] = {"target_epsilon": eps}
    return JobCreate.model_validate(body)


@router.post("/jobs")
def start_job(request: Request, svc: Svc, me: Me, form: Form) -> Response:
    """Start a tuning job through the API's job creation; errors on the datasets page."""
    try:
        job = jobs.create_job(_job_body(form), svc, me)
    except ValidationError as e:
        return datasets_view(request, svc, me, 422, job_error=_validation_text(e), form=form)
    except ServiceError as e:
        return datasets_view(request, svc, me, e.status, job_error=e.detail, form=form)
    return redirect(f"/jobs/{job.id}")


def _prompt_view(request: Request, svc: Any, me: str, prompt_id: str, status: int = 200,
                 **ctx: Any) -> Response:
    info = prompts._info(owned(svc, "prompt", prompt_id, me))
    return _page(request, svc, me, "prompt.html", status=status, p=info, **ctx)


@router.get("/prompts/{prompt_id}")
def prompt_page(prompt_id: str, request: Request, svc: Svc, me: Me) -> Response:
    return _prompt_view(request, svc, me, prompt_id)


def _query_rows(fields: dict[str, str], files: dict) -> tuple[list[str], list[str] | None]:
    """Privatized texts (and pair texts) from the pasted lines or the uploaded file."""
    pasted = [t.strip() for t in fields.get("rows", "").splitlines() if t.strip()]
    if pasted and "file" in files:
        raise ServiceError(422, "validation_error", "paste rows or choose a file, not both")
    if pasted:
        return pasted, None
    if "file" not in files:
        raise ServiceError(422, "validation_error", "paste privatized rows (one per line) "
                           "or choose a file that `rapt privatize` wrote")
    ds = read_privatized(*files["file"], labelled=False)
    return ds.texts, _pairs(ds)


def _label_names(text: str, n: int) -> list[str]:
    given = [s.strip() for s in text.split(",") if s.strip()]
    if given and len(given) != n:
        raise ServiceError(422, "validation_error", f"label names: {len(given)} given, the "
                           f"prompt has {n} labels (leave the box empty for label ids)")
    return given or [f"label {i}" for i in range(n)]


@router.post("/prompts/{prompt_id}/predict")
def predict_rows(prompt_id: str, request: Request, svc: Svc, me: Me,
                 form: Multipart) -> Response:
    """Class probabilities of a few privatized rows, through the API's predict."""
    fields, files = form
    row = owned(svc, "prompt", prompt_id, me)  # another tenant's prompt: 404, before the rows
    try:
        texts, pairs = _query_rows(fields, files)
        names = _label_names(fields.get("label_names", ""), row["num_labels"])
        res = predict.predict(PredictRequest(prompt_id=prompt_id, texts=texts,
                                             text_pairs=pairs), svc, me)
    except ValidationError as e:
        return _prompt_view(request, svc, me, prompt_id, 422,
                            predict_error=_validation_text(e), form=fields)
    except ServiceError as e:
        return _prompt_view(request, svc, me, prompt_id, e.status, predict_error=e.detail,
                            form=fields)
    rows = [{"text": t, "label": names[y], "probs": list(zip(names, p, strict=True))}
            for t, y, p in zip(texts, res.labels, res.probabilities, strict=True)]
    return _prompt_view(request, svc, me, prompt_id, predictions=rows, form=fields)
