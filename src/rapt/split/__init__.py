"""Split-and-Privatize (SAP, Shen et al. 2023): split learning with dχ-privatized releases.

The provider cuts its backbone after n blocks (:func:`split_backbone`), keeps and tunes the top
(LoRA by default), and hands the bottom (embedding layer + n blocks) to the customer.

What each party sees and keeps private:

* **Customer** keeps its text, token ids, labels, the contributing tokens (CTI, computed from
  its labelled rows), its output layer (g -> classes, with the label names) and, when
  trained, its bottom's updated weights. It sees the bottom's weights (part of the model),
  the top's output g for its own batches and, with an unfrozen bottom, ∂l/∂hidden.
* **Provider** keeps the top's weights and its tuned adapter. It sees, per training step,
  :class:`Activations` (the bottom's output on *privatized* token ids: dχ noise on each token
  embedding, then the nearest vocabulary token, then the bottom; plus the padding mask, hence
  the row lengths) and :class:`OutputGrad` (∂l/∂g). It never receives labels, but ∂l/∂g
  gives them away: each batch's gradients span C − 1 dimensions (it learns the number of
  classes) and cluster by label (it learns which rows share a label, and with a few known
  labels which label: :mod:`rapt.attacks.label_inference`, 100 % on Financial PhraseBank).
  SAP does not address this; ``SplitConfig.label_dp_epsilon`` (randomized response) bounds
  it by ε-label-DP. With a frozen bottom every example is released once; with an unfrozen
  bottom it is released afresh every epoch, so an attacker gets E looks.

Privacy statement (``SplitConfig.privatize="tokens"``, the default): each released token
position is ηdχ-private given the (private) choice of contributing tokens; see
:mod:`rapt.privacy.cti` for what CTI weakens. The blocks after the mechanism are post-processing,
so splitting deeper
never weakens the guarantee; on MiniLM it did not make inversion harder either (the attack
recovers the privatized ids). With ``privatize="output"`` (split >= 1, the placement SAP
§4.1/§4.3 describes) the noise is on the bottom's output states instead: the statement is
then metric privacy in the bottom's output space, with no per-token form
(:class:`SplitConfig`). Noise comes from :class:`rapt.noise.NoiseSource` (OS entropy unless
``SplitConfig.noise_seed`` is set).

In-process use::

    customer, provider = setup_split(bb, SplitConfig(split_layer=2, eta=60.0, cti=True), C, N)
    customer.fit_cti(rows, labels); customer.load(rows, labels)
    train_split(customer, provider)
    probs = predict_split(customer, provider, test_rows)

Over HTTP (the provider's service, ``/v1/sap/...``): :class:`rapt.split.remote.RemoteProvider`
has ProviderSession's interface, so the same ``train_split`` / ``predict_split`` run against
a session on the server; messages travel as safetensors (:mod:`rapt.split.wire`).
"""

from rapt.split.config import PRIVATIZE_MODES, PROVIDER_FIELDS, SPLIT_METHODS, SplitConfig
from rapt.split.customer import (
    SplitCustomer,
    SplitStep,
    encode_texts,
    make_customer,
    predict_split,
    setup_split,
    total_steps,
    train_split,
)
from rapt.split.model import Bottom, Top, split_backbone
from rapt.split.protocol import (
    ActivationGrad,
    Activations,
    BatchRef,
    OutputGrad,
    Release,
    SplitProtocolError,
    TopOutput,
)
from rapt.split.provider import ProviderSession, load_top, tune_top

__all__ = [
    "PRIVATIZE_MODES",
    "PROVIDER_FIELDS",
    "SPLIT_METHODS",
    "ActivationGrad",
    "Activations",
    "BatchRef",
    "Bottom",
    "OutputGrad",
    "ProviderSession",
    "Release",
    "SplitConfig",
    "SplitCustomer",
    "SplitProtocolError",
    "SplitStep",
    "Top",
    "TopOutput",
    "encode_texts",
    "load_top",
    "make_customer",
    "predict_split",
    "setup_split",
    "split_backbone",
    "total_steps",
    "train_split",
    "tune_top",
]
