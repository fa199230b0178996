"""The channel model's interface: what a customization asks of the provider's model of the
privatization channel, whichever remedy it is, and the one way to load one.

A :class:`ChannelModel` may rewrite the text of privatized rows
(:meth:`ChannelModel.prepare_rows`: the denoiser reads each token back) and may change the model
that reads them (:meth:`ChannelModel.reader`: the channel adapter's adapted backbone);
:class:`rapt.pipeline.Customization` calls both, whatever the model.
:func:`rapt.channel.load.load_channel_model` rebuilds either from the folder ``rapt adapt``
saved, through :meth:`ChannelModel.load` and its one backbone rule (:func:`check_backbone`): a
channel model serves the backbone it was built on, by name (or the same weights folder) and by
width, and a folder that records no backbone serves none.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rapt.artifacts import CONFIG_FILE, ArtifactError, Kind, load_artifact

if TYPE_CHECKING:
    from torch import Tensor

    from rapt.models import Backbone

__all__ = ["BackboneMismatch", "ChannelModel", "channel_fingerprint", "check_backbone",
           "check_built_on", "same_backbone"]

Rows = Sequence[Sequence[int]]


class BackboneMismatch(ArtifactError):
    """A channel model folder built on another backbone than the one it is loaded for (the
    message names the file and says how to build one for it)."""


class ChannelModel(ABC):
    """A trained model of the privatization channel, built by the provider on public text.

    Subclasses set ``KIND`` (the artifact folder they save), ``config_class`` (the config
    dataclass in ``config.json``), ``remedy`` (its name in reports) and ``attacker`` (the name
    the privacy report gives it as an attacker on a release; None when it outputs no tokens to
    score), and carry ``config`` and ``meta`` (provenance: backbone, corpus, η band, ...)."""

    KIND: ClassVar[Kind]
    config_class: ClassVar[type]
    remedy: ClassVar[str]
    attacker: ClassVar[str | None] = None
    config: Any
    meta: dict

    def prepare_rows(self, texts: Rows) -> list[list[int]]:
        """The text positions of privatized rows -> the rows :meth:`reader` tunes and predicts
        on, of the same lengths. Here: as released."""
        return [[int(t) for t in r] for r in texts]

    def reader(self, backbone: Backbone) -> Backbone:
        """The backbone that tunes and predicts on the prepared rows. Here: ``backbone``. The
        privatizer stays ``backbone``'s whatever this returns: the mechanism is the customer's,
        on the public backbone."""
        return backbone

    @abstractmethod
    def trained_tensors(self) -> dict[str, Tensor]:
        """What is saved and fingerprinted."""

    @abstractmethod
    def save(self, folder: str | Path) -> Path:
        """``KIND``'s tensors file and ``config.json`` (format, config, meta); -> the folder."""

    @classmethod
    @abstractmethod
    def _rebuild(cls, folder: Path, config: Any, state: dict[str, Tensor], meta: dict,
                 backbone: Backbone) -> ChannelModel:
        """The model of a saved folder, its config parsed and its backbone checked."""

    @classmethod
    def load(cls, folder: str | Path, backbone: Backbone, *, name: str | None = None
             ) -> ChannelModel:
        """The model saved in ``folder``, rebuilt on ``backbone`` (known to the caller as
        ``name``, default its own name) after :func:`check_backbone`; raises
        :class:`rapt.artifacts.ArtifactError` naming the file."""
        folder = Path(folder)
        state, raw_config, meta = load_artifact(folder, kind=cls.KIND)
        check_backbone(folder, cls.KIND, meta, backbone, name)
        try:
            config = cls.config_class(**raw_config)
        except (TypeError, ValueError) as e:
            raise ArtifactError(f"{folder / CONFIG_FILE}: field 'config': {e}") from e
        return cls._rebuild(folder, config, state, meta, backbone)


def _source(name: str) -> str:
    """Where a backbone name loads from, so that 'minilm' and its folder compare equal."""
    from rapt.models import resolve

    try:
        src = resolve(name)[0]
    except Exception:  # a built-in whose package is missing: compare the names
        src = name
    p = Path(src)
    return str(p.resolve()) if p.exists() else src


def same_backbone(recorded: str | None, name: str) -> bool:
    """Whether a channel model built on backbone ``recorded`` (its provenance) is one for the
    backbone ``name`` (same name, or the same weights folder)."""
    return recorded is not None and (recorded == name or _source(recorded) == _source(name))


def check_built_on(folder: str | Path, meta: dict, name: str) -> None:
    """The name half of :func:`check_backbone`, read from ``config.json`` alone (what
    ``rapt serve`` checks before it loads a backbone); :class:`BackboneMismatch` naming it."""
    recorded = meta.get("backbone")
    if not same_backbone(recorded, name):
        what = (f"was built on backbone {recorded!r}" if recorded is not None
                else "records no backbone")
        raise BackboneMismatch(f"{Path(folder) / CONFIG_FILE}: this channel model {what}, not "
                               f"on {name!r}; build one for it with `rapt adapt --backbone "
                               f"{name}`")


def check_backbone(folder: str | Path, kind: Kind, meta: dict, backbone: Backbone,
                   name: str | None = None) -> None:
    """The one rule for the backbone a channel model serves: the one it was built on. Its
    tensors must fit ``backbone`` (the width recorded), and the backbone recorded must be
    ``name`` (default ``backbone.name``) or load from the same folder; otherwise
    :class:`BackboneMismatch` naming the file."""
    width = meta.get("hidden_size", backbone.hidden_size)
    if width != backbone.hidden_size:
        raise BackboneMismatch(f"{Path(folder) / kind.tensors_file}: built on backbone "
                               f"{meta.get('backbone')!r} (width {width}), which does not fit "
                               f"{backbone.name!r} (width {backbone.hidden_size})")
    check_built_on(folder, meta, name or backbone.name)


def channel_fingerprint(channel: ChannelModel) -> str:
    """sha256 of a channel model's config and trained tensors (names, dtypes, shapes, bytes):
    what an artifact records to recognise the channel it was tuned with."""
    import torch

    h = hashlib.sha256(repr(sorted(asdict(channel.config).items())).encode())
    for name, t in sorted(channel.trained_tensors().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{t.numel()}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
