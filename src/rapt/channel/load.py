"""The one way to load a channel model: the folder ``rapt adapt`` saved, a denoiser or a
channel adapter told apart by its ``format``, rebuilt through
:meth:`rapt.channel.model.ChannelModel.load` (and so its one backbone rule)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rapt.artifacts import Kind, read_config
from rapt.channel.adapter import ChannelAdapter
from rapt.channel.denoiser import Denoiser
from rapt.channel.model import ChannelModel

if TYPE_CHECKING:
    from rapt.models import Backbone

__all__ = ["CHANNEL_MODELS", "load_channel_model", "read_channel_config"]

# {artifact format: class} of the channel models `rapt adapt` saves.
CHANNEL_MODELS: dict[str, type[ChannelModel]] = {
    cls.KIND.format: cls for cls in (Denoiser, ChannelAdapter)}


def read_channel_config(folder: str | Path) -> tuple[Kind, dict]:
    """(its artifact kind, its ``config.json``) for the channel model that ``rapt adapt``
    saved in ``folder``, checked without reading a tensor. Raises ArtifactError naming the
    file."""
    return read_config(folder, tuple(cls.KIND for cls in CHANNEL_MODELS.values()))


def load_channel_model(folder: str | Path, backbone: Backbone, *, name: str | None = None
                       ) -> ChannelModel:
    """The channel model that ``rapt adapt`` saved in ``folder`` (a denoiser or a channel
    adapter, told apart by the folder's ``format``), rebuilt on ``backbone`` (known to the
    caller as ``name``) by :meth:`ChannelModel.load`. Raises ArtifactError naming the file."""
    kind = read_channel_config(folder)[0]
    return CHANNEL_MODELS[kind.format].load(folder, backbone, name=name)
