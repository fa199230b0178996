"""Small privacy and security bugs, planted one at a time, that the rest of the suite let through:
each test here fails with its bug in place (the docstrings name the bug) and passes without."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from _service import open_store
from _tiny import stub_channel_model
from safetensors.torch import save

from rapt.split import wire
from rapt.split.protocol import (
    ActivationGrad,
    Activations,
    BatchRef,
    OutputGrad,
    Release,
    SplitProtocolError,
    TopOutput,
)


def test_store_revoke_flags_running_jobs_for_their_worker(tmp_path, backend):
    """Bug: ``Store._revoke`` no longer sets ``cancel_requested`` on the key's *running* jobs.
    The service hid it (``ServiceState.revoke_key`` cancels them itself), but `rapt serve keys
    revoke` calls the store alone: the running job must be flagged there, where its worker
    (any process) reads it with its next heartbeat."""
    st = open_store(tmp_path)
    try:
        a = st.add_key("a", "ha")
        d = st.create_dataset(a, "tiny", [[2, 5, 3]], [0], 2, {}, None)
        running, queued = st.create_job(a, d, "tiny", {}), st.create_job(a, d, "tiny", {})
        assert st.claim_next("w")["id"] == running
        assert st.heartbeat(running, "w") == (True, False)
        out = st.revoke_key("a")
        assert out["stopping"] == [running] and out["cancelled"] == [queued], out
        assert st.get_job(running, a)["cancel_requested"] is not None
        assert st.heartbeat(running, "w") == (True, True)  # what the worker sees next
        assert st.get_job(queued, a)["state"] == "cancelled"
    finally:
        st.close()


def test_erase_file_overwrites_the_bytes_before_unlinking(tmp_path):
    """Bug: ``erase_file`` unlinks without overwriting first. A hard link keeps the inode
    alive after the unlink, so it shows what erase_file left in the blocks: zeros, not the
    tenant's bytes."""
    from rapt.service.store import erase_file

    secret = os.urandom(64) + b"tenant rows 41,17,33" * 200
    path, witness = tmp_path / "ck.pt", tmp_path / "witness"
    path.write_bytes(secret)
    os.link(path, witness)
    erase_file(path)
    assert not path.exists()
    assert witness.read_bytes() == b"\0" * len(secret)
    erase_file(path)  # a missing file is fine


# Messages whose tensors carry a dtype the wire refuses, with the field it is refused on. Later
# checks (shapes, finiteness, the message's own __post_init__) would refuse most of these too,
# with other words: the refusal asserted here is decode's, from the header, before any tensor.
LENS = torch.full((2,), 3, dtype=torch.int32)
BAD_DTYPES = [
    ("Activations", {"hidden": torch.ones(6, 4, dtype=torch.int32), "lengths": LENS},
     {"width": "3"}, "hidden"),
    ("Activations", {"hidden": torch.randn(6, 4), "lengths": LENS.double()}, {"width": "3"},
     "lengths"),
    ("ActivationGrad", {"grad": torch.ones(6, 4, dtype=torch.uint8), "lengths": LENS},
     {"width": "3"}, "grad"),
    ("OutputGrad", {"grad": torch.ones(2, 4, dtype=torch.int64)}, {}, "grad"),
    ("TopOutput", {"output": torch.ones(2, 4, dtype=torch.bool)}, {}, "output"),
    ("Release", {"hidden": torch.randn(6, 4), "lengths": LENS.float()}, {"offset": "0"},
     "lengths"),
    ("BatchRef", {"rows": torch.tensor([0.0, 1.0])}, {}, "rows"),
    ("BatchRef", {"rows": torch.tensor([0, 1], dtype=torch.int16)}, {}, "rows"),
]
CLASSES = {c.__name__: c for c in (Activations, ActivationGrad, OutputGrad, TopOutput, Release,
                                   BatchRef)}


@pytest.mark.parametrize("kind,tensors,meta,field", BAD_DTYPES)
def test_wire_refuses_a_bad_dtype_from_the_header(monkeypatch, kind, tensors, meta, field):
    """Bug: ``split/wire.decode`` skips its dtype check. The only test that noticed matched
    the error's words, and a later check refused the tensor anyway. Here the refusal must be
    decode's own, from the header: a SplitProtocolError naming the message and the field, with
    no tensor ever built from the body."""
    import safetensors.torch

    def no_tensors(*args, **kwargs):
        raise AssertionError(f"decode built the tensors of a {kind} whose {field} dtype the "
                             "wire refuses")

    data = save(tensors, metadata={"message": kind, **({"step": "0"} if "offset" not in meta
                                                         else {}), **meta})
    monkeypatch.setattr(safetensors.torch, "load", no_tensors)
    with pytest.raises(SplitProtocolError) as err:
        wire.decode(data, CLASSES[kind], max_bytes=1 << 20)
    assert (err.value.message_type, err.value.field) == (kind, field)


def test_wire_accepts_the_same_messages_with_allowed_dtypes():
    """The counterpart of the test above: each message decodes once its dtype is an allowed
    one (so the refusals above are about the dtype, nothing else)."""
    msgs = [Activations(0, torch.randn(2, 3, 4), torch.ones(2, 3, dtype=torch.long)),
            OutputGrad(0, torch.randn(2, 4)), TopOutput(0, torch.randn(2, 4)),
            Release(0, torch.randn(6, 4), torch.full((2,), 3)),
            BatchRef(0, torch.tensor([0, 1]))]
    for m in msgs:
        assert type(wire.decode(wire.encode(m), type(m), max_bytes=1 << 20)) is type(m)
    grad = ActivationGrad(0, torch.randn(2, 3, 4))
    data = wire.encode(grad, lengths=torch.full((2,), 3))
    assert torch.equal(wire.decode(data, ActivationGrad, max_bytes=1 << 20).grad, grad.grad)


class _Adapter(stub_channel_model()):
    """A channel model whose reader (an adapted backbone) has *other* input embeddings than
    the public one: today's LoRA targets leave them equal, which hid the bug below."""

    def __init__(self, adapted):
        self.adapted, self.meta = adapted, {}

    def reader(self, backbone):
        return self.adapted


def test_privatizer_reads_the_public_embedding_table_under_a_channel_adapter(tiny_bert):
    """Bug: ``Customization.create`` builds the privatizer on the channel adapter's adapted
    backbone instead of the public one. The mechanism is the customer's, run on the public
    backbone's embedding table (the one the attack table and every η calibration are for):
    with an adapter whose embeddings differ, the privatizer must still hold the public table,
    and calibrate η on it."""
    import copy

    from rapt.pipeline import Customization

    model = copy.deepcopy(tiny_bert.model)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.copy_(emb.flip(0) * 3.0 + 0.5)
    adapted = dataclasses.replace(tiny_bert, name="tiny+channel-adapter", model=model)
    public = tiny_bert.embeddings.detach().float()
    assert not torch.equal(adapted.embeddings.detach().float(), public)
    custom = Customization.create(tiny_bert, eta=50.0, channel=_Adapter(adapted))
    assert custom.reader is adapted  # the adapter does read the rows
    assert torch.equal(custom.privatizer.embeddings.cpu(), public)
    calibrated = Customization.create(tiny_bert, target_p=0.5, channel=_Adapter(adapted))
    assert calibrated.eta == Customization.create(tiny_bert, target_p=0.5).eta
    assert torch.equal(calibrated.privatizer.embeddings.cpu(), public)
