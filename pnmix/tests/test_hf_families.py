"""Every causal-LM family of the installed transformers that uses RoPE and builds from a small
random config offline: PNMixHFCache with the exact FP16 method generates what the model itself
generates (its own eager attention and cache), token for token, with and without an attention
window. A family PN-Mix cannot serve is refused with an error that says why: RoPE it cannot pair
(partial rotary embeddings, other rotations), layers that are not full or sliding-window
attention, attention arguments or masks it cannot honour."""

import dataclasses
import importlib
import warnings

import pytest
import torch
from transformers import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import pnmix.hf as hf
from reference.methods import METHODS

pytestmark = [pytest.mark.families, pytest.mark.long]  # ~400 small models: minutes on two cores
#: A small model of any family: the arguments its config takes are used, the others ignored.
TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MAX_PARAMETERS = 40_000_000  # larger defaults that TINY does not reach (nested configs, many experts)
WINDOW = 8


def small_model(model_type: str, **extra):
    """The family's causal LM from TINY, or a skip saying why it cannot be built small offline."""
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = CONFIG_MAPPING[model_type](**{**TINY, **extra})  # extra replaces a TINY value
            model_class = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
            module = importlib.import_module(model_class.__module__)
        except Exception as error:  # a config that needs more than TINY, a missing optional dependency
            pytest.skip(f"{model_type}: cannot build its config from small arguments ({type(error).__name__})")
        if not hasattr(module, "apply_rotary_pos_emb"):
            pytest.skip(f"{model_type}: no rotary embedding")
        try:
            with torch.device("meta"):
                n = sum(p.numel() for p in model_class(config).parameters())
        except Exception as error:
            pytest.skip(f"{model_type}: cannot build a model from small arguments ({type(error).__name__}: {error})")
        if n > MAX_PARAMETERS:
            pytest.skip(f"{model_type}: its small config still has {n:,} parameters")
        torch.manual_seed(0)
        try:
            model = model_class(config).eval()
            model.set_attn_implementation("eager")
        except Exception as error:
            pytest.skip(f"{model_type}: cannot build a model from small arguments ({type(error).__name__}: {error})")
    return model


def generate(model, ids, cache=None, **generation):
    kwargs = {} if cache is None else {hf.cache_argument(model): cache}
    return model.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, **kwargs, **generation)


@pytest.mark.parametrize("window", [None, WINDOW], ids=["global", f"window-{WINDOW}"])
@pytest.mark.parametrize("model_type", sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
def test_the_fp16_method_generates_what_the_model_generates(model_type, window):
    extra = {} if window is None else {"sliding_window": window, "use_sliding_window": True, "max_window_layers": 0}
    model = small_model(model_type, **extra)
    layout = hf.detect_pair_layout(model.config)
    if layout is None:
        with pytest.raises(ValueError, match="cannot tell the RoPE pair layout"):
            hf.PNMixHFCache(model.config, METHODS["FP16"]())
        print(f"{model_type}: refused: cannot tell the RoPE pair layout")
        return
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(1))
    try:
        expected = generate(model, ids)
    except Exception as error:  # the family needs inputs a plain causal LM call does not give
        pytest.skip(f"{model_type}: plain greedy generation fails ({type(error).__name__}: {error})"[:300])
    model.set_attn_implementation("pnmix")
    fp16 = dataclasses.replace(METHODS["FP16"](), pair_layout=layout)
    try:
        got = generate(model, ids, hf.PNMixHFCache(model.config, fp16, backend="reference"))
    except (ValueError, AttributeError, RuntimeError) as error:
        assert "PN-Mix" in str(error), f"{model_type}: failed without saying why: {type(error).__name__}: {error}"
        print(f"{model_type}: refused: {error}")
        return
    assert torch.equal(got, expected), f"{model_type} ({layout} RoPE): tokens differ from the model's own attention"
