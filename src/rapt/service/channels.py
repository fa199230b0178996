"""The provider's channel models in the service (the channel adapter, denoise-then-tune).

One channel model (a :class:`rapt.channel.denoiser.Denoiser` or a
:class:`rapt.channel.adapter.ChannelAdapter`, saved by ``rapt adapt``) per backbone, loaded at
start-up (``rapt serve --channel BACKBONE=FOLDER``, ``ServiceConfig.channels``) and refused then
if the folder is not a channel model or was built on another backbone. Jobs on privatized rows
are read back through a denoiser, and so are predict's queries for a prompt tuned that way, both
through :class:`rapt.pipeline.Customization` (text positions only; specials and RAPT's plain
tokens stay as uploaded). The channel model only ever sees what the customer uploaded
(privatized ids): post-processing of the release; the same model is also an attacker at that η,
counted wherever it recovers more than the others we ran (docs/THREAT_MODEL.md). A channel
adapter leaves the rows as uploaded: jobs tune, and predict runs, on the backbone with the
adapter merged in (its own copy, outside the micro-batcher).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapt.channel.model import ChannelModel

__all__ = ["Channel", "ChannelError", "check_channel_folder", "denoise_rows", "load_channels",
           "parse_channel_specs", "recorded_channel"]


class ChannelError(ValueError):
    """A channel model the service refuses to start with (the message names the folder)."""


@dataclass(frozen=True)
class Channel:
    """A loaded channel model and what responses say of it: ``info`` is
    :meth:`rapt.pipeline.Customization.channel_meta` (fingerprint, provenance, note)."""

    backbone: str
    folder: str
    model: ChannelModel  # a denoiser (eval mode, on the backbone's device) or an adapter
    info: dict

    @property
    def fingerprint(self) -> str:
        return self.info["fingerprint"]


def parse_channel_specs(specs: Iterable[str]) -> dict[str, str]:
    """``["BACKBONE=FOLDER", ...]`` -> {backbone: folder}; ChannelError on a malformed or
    repeated backbone."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise ChannelError(f"--channel {spec!r}: give BACKBONE=FOLDER (e.g. "
                               "minilm=runs/channel)")
        if name.strip() in out:
            raise ChannelError(f"--channel: backbone {name.strip()!r} given twice; one channel "
                               "model per backbone")
        out[name.strip()] = folder.strip()
    return out


def check_channel_folder(folder: str | Path, backbone: str) -> dict:
    """The provenance of the channel model in ``folder`` (read without building it), or a
    ChannelError when it is not a channel model or was built on another backbone than
    ``backbone`` (:func:`rapt.channel.model.check_built_on`): the cheap check ``rapt serve``
    makes before it loads anything."""
    from rapt.artifacts import ArtifactError
    from rapt.channel.load import read_channel_config
    from rapt.channel.model import BackboneMismatch, check_built_on

    try:
        meta = read_channel_config(folder)[1]["meta"]
    except ArtifactError as e:
        raise ChannelError(f"--channel {backbone}={folder}: not a channel model folder from "
                           f"`rapt adapt`: {e}") from None
    try:
        check_built_on(folder, meta, backbone)
    except BackboneMismatch as e:
        raise ChannelError(f"--channel {backbone}={folder}: {e}") from None
    return meta


def load_channels(specs: Mapping[str, str | Path], backbones: Mapping[str, Any]
                  ) -> dict[str, Channel]:
    """{backbone: Channel} for ``specs`` ({backbone: folder}), each rebuilt on its loaded
    backbone; ChannelError, naming the folder, for a backbone not loaded, a folder that is not
    a channel model, or one built on another backbone."""
    from rapt.artifacts import ArtifactError
    from rapt.channel.load import load_channel_model
    from rapt.pipeline import Customization

    out = {}
    for name, folder in specs.items():
        if name not in backbones:
            raise ChannelError(f"--channel {name}={folder}: backbone {name!r} is not loaded "
                               f"(loaded: {', '.join(backbones) or 'none'}); add --backbone "
                               f"{name}")
        bb = backbones[name]
        check_channel_folder(folder, name)
        try:
            model = load_channel_model(folder, bb, name=name)
        except (ArtifactError, ValueError) as e:
            raise ChannelError(f"--channel {name}={folder}: {e}") from None
        # Its reader now (an adapter merges a copy), before the micro-batchers hook the backbone.
        model.reader(bb)
        info = Customization(bb, channel=model).channel_meta()
        out[name] = Channel(name, str(folder), model, info)
    return out


def recorded_channel(channels: Mapping[str, Channel], backbone: str, recorded: dict | None,
                     what: str) -> Channel | None:
    """The loaded channel model that a job or prompt (``what``, for the message) recorded,
    None when it recorded none; LookupError when this process does not hold that one (none
    for the backbone, or another: a restart with another --channel)."""
    if not recorded:
        return None
    ch = channels.get(backbone)
    if ch is not None and ch.fingerprint == recorded.get("fingerprint"):
        return ch
    now = (f"it holds channel model {ch.fingerprint[:12]} for it" if ch is not None
           else "it holds none for it")
    raise LookupError(f"{what} uses the channel model {str(recorded.get('fingerprint'))[:12]} "
                      f"of backbone {backbone!r}, which this server does not hold ({now})")


def denoise_rows(channel: Channel, backbone: Any, rows: Sequence[Sequence[int]],
                 plain_ids: list[int] | None) -> list[list[int]]:
    """Privatized rows (laid out as a dataset's: specials, the plain tokens k when
    ``plain_ids``, text) read back by the channel model on their text positions."""
    from rapt.pipeline import Customization, Encoding

    custom = Customization(backbone, Encoding(None, plain_ids), channel=channel.model)
    return custom.denoise(rows)
