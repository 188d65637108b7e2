"""generation/batching.py: the batching model args, and the batch-invariant mode (issue 73
item 9): with ``batch_invariant=true`` each answer is computed alone, so it is the same
whatever ``max_rows``, ``max_cache_gib`` and the other requests of the call are."""

from __future__ import annotations

import pytest
import torch

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.generation.batching import Batching


def test_batch_invariant_runs_one_row_at_a_time_and_says_so():
    rule = Batching(None, None, "cpu", batch_invariant="true")
    assert rule.max_rows == 1 and rule.info()["batch_invariant"] is True
    assert Batching(1, None, "cpu", batch_invariant=True).max_rows == 1
    assert Batching(None, None, "cpu").info()["batch_invariant"] is False
    with pytest.raises(PonderError, match="batch_invariant=true runs one row at a time"):
        Batching(64, None, "cpu", batch_invariant=True)
    with pytest.raises(PonderError, match="batch_invariant='maybe' is not true or false"):
        Batching(None, None, "cpu", batch_invariant="maybe")


def wide_model(arch: str, vocab: int):
    """A tiny model wide enough (256) that bf16 answers move with the rows beside them: at 64
    in flight, 1 of 16 on a 2-core AMD EPYC with native bf16 (at width 64, none)."""
    import transformers

    torch.manual_seed(0)
    config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    config = config_cls(vocab_size=vocab, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                        max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                        pad_token_id=3, tie_word_embeddings=False)
    return model_cls(config).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_an_answer_is_the_same_alone_and_among_others_in_the_invariant_mode(arch, tmp_path):
    """64 prompts of different lengths answered in one call and 16 of them alone, in bf16,
    under two cache budgets: token for token the same in the mode. (Batched, the same check
    finds answers that differ on the CPU it was written on: the test can fail.)"""
    from conftest import build_tiny_tokenizer

    from lm_eval_ponder.evaluation.lm import PonderLM

    tokenizer = build_tiny_tokenizer()
    wide_model(arch, len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompts = [f"Question {i}: what is {i} + {i * 7 % 13}? " + "x" * (i % 17) for i in range(64)]
    gen = {"max_gen_toks": 24, "do_sample": False, "until": []}
    for cache_gib in ("none", "0.001"):
        lm = PonderLM(pretrained=str(tmp_path), controller="none", dtype="bfloat16",
                      device="cpu", batch_invariant=True, max_cache_gib=cache_gib)
        together = [str(t) for t in lm.generator.generate_texts(prompts, gen)]
        alone = [str(lm.generator.generate_texts([p], gen)[0]) for p in prompts[:16]]
        assert alone == together[:16]
        assert lm.get_model_info()["ponder_batching"]["batch_invariant"] is True
