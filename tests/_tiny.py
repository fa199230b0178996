"""Tiny random backbones built in code, shared by the tests (conftest fixtures use them too)."""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The word list behind conftest's ``tiny_tokenizer`` and ``make_word_llama``.
WORDS = (
    "the a movie film good bad great awful boring fun plot actor actors story love hate "
    "is was not very really it this that and but of to in with funny sad dull brilliant "
    "terrible best worst ever one two time scene music long short fine nice poor weak"
).split()
TOY_WORDS = (
    "the a movie film good bad great awful boring fun plot actor story is was not very it "
    "this and but of music long fine").split()


def make_tokenizer(folder: Path, words: list[str], specials: list[str] = SPECIALS):
    """A BERT WordPiece tokenizer over ``specials + words``, written to and read from folder."""
    from transformers import BertTokenizerFast

    (folder / "vocab.txt").write_text("\n".join(specials + words) + "\n")
    # transformers 5 ignores `vocab_file=` in the constructor (every word becomes [UNK]);
    # loading the folder reads the vocabulary.
    tok = BertTokenizerFast.from_pretrained(str(folder), do_lower_case=True)
    assert len(tok) == len(specials) + len(words), "tiny vocabulary was not loaded"
    return tok


def make_bert(tok, seed: int = 0, name: str = "tiny-bert", max_positions: int = 64):
    """rapt Backbone around a random 2-layer, 32-dim BERT."""
    from transformers import BertConfig, BertModel

    from rapt.models import from_model

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=max_positions)
    return from_model(BertModel(cfg).eval(), tok, name=name, kind="encoder")


def make_llama(tok, seed: int = 0, name: str = "tiny-llama", max_positions: int = 64):
    """rapt Backbone around a random 2-layer, 32-dim Llama causal LM."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapt.models import from_model

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      max_position_embeddings=max_positions, pad_token_id=tok.pad_token_id)
    return from_model(LlamaForCausalLM(cfg).eval(), tok, name=name, kind="causal")


def make_word_llama(seed: int = 0):
    """A random tiny Llama over ``WORDS`` whose tokenizer knows every word (label words need
    real ids), built without touching the disk."""
    from transformers import BertTokenizerFast

    vocab = {t: i for i, t in enumerate([*SPECIALS, *WORDS])}
    tok = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    return make_llama(tok, seed=seed, name="word-llama", max_positions=512)


def save_backbone(bb, folder: Path) -> Path:
    """Write a tiny backbone's model and tokenizer to ``folder``: what ``--backbone PATH`` loads
    in CLI tests."""
    folder.mkdir(parents=True, exist_ok=True)
    bb.model.save_pretrained(folder)
    bb.tokenizer.save_pretrained(folder)
    return folder


TOY_ROWS = "good fun film,pos\nbad boring plot,neg\ngreat music,pos\nawful story,neg\n"


def toy_cli_inputs(folder: Path, repeats: int = 30) -> tuple[str, Path]:
    """(a saved tiny BERT over TOY_WORDS, a labelled CSV of TOY_ROWS × ``repeats``) under
    ``folder``: the inputs of a CLI test's `rapt tune`."""
    bb = str(save_backbone(make_bert(make_tokenizer(folder, TOY_WORDS)), folder / "bb"))
    data = folder / "d.csv"
    data.write_text("text,label\n" + TOY_ROWS * repeats)
    return bb, data


def make_bpe_tokenizer(folder: Path | None = None, merges: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer in the style of GPT-2 / SmolLM2: the 256 byte symbols plus
    ``merges`` ("Ġ p" -> "Ġp"). Without a merge, " 0" is "Ġ" + "0", so every label word with a
    leading space starts with the same token "Ġ" (SmolLM2's " 0" / " 1": [216, 32] / [216, 33]).
    Written to and read from ``folder`` when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    pairs = [tuple(m.split(" ")) for m in merges]
    for a, b in pairs:
        vocab.setdefault(a + b, len(vocab))
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", unk_token="<unk>",
                                  bos_token="<s>", eos_token="</s>")
    if folder is not None:
        tok.save_pretrained(folder)
        tok = PreTrainedTokenizerFast.from_pretrained(folder)
    return tok


def random_prompt(backbone, seed: int, num_labels: int = 2, *, plain_len: int = 0,
                  plain_offset: int = 0, scale: float = 0.3, **config):
    """A TunedPrompt with random weights instead of trained ones (``config``: TuneConfig
    fields): every tuned tensor N(0, scale²), LoRA's B divided by peft's scaling so the update
    stays O(scale²) whatever the rank. Prompts then differ visibly, and the mixed-pass tests
    need no training."""
    from rapt.tuning.tune import RaptModel, TuneConfig, TunedPrompt
    from rapt.tuning.tuners import lora_scaling

    cfg = TuneConfig(seed=seed, **config)
    model = RaptModel(backbone, cfg, num_labels, plain_len=plain_len, offset=plain_offset)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for k, v in model.trainable_tensors().items():
        t = torch.randn(v.shape, generator=g) * scale
        tensors[k] = t / lora_scaling(cfg.lora_r) if ".lora_B." in k else t
    meta = {"backbone": backbone.name, "hidden_size": backbone.hidden_size,
            "num_labels": num_labels, "plain_len": plain_len, "plain_offset": plain_offset}
    return TunedPrompt(cfg, tensors, meta)


def stub_channel_model():
    """A :class:`rapt.channel.model.ChannelModel` base for test fakes: nothing to save or load,
    no tensors (so no fingerprint); a fake overrides ``prepare_rows`` / ``reader``."""
    from rapt.channel.model import ChannelModel

    class StubChannel(ChannelModel):
        remedy = "stub"

        def trained_tensors(self):
            return {}

        def save(self, folder):
            raise NotImplementedError("a test fake is never saved")

        @classmethod
        def _rebuild(cls, folder, config, state, meta, backbone):
            raise NotImplementedError("a test fake is never loaded")

    return StubChannel
