"""lm_eval_ponder.engine.stops: only tokens that can complete a stop string are candidates,
the table is sound on a real byte-level BPE tokenizer (no stop is missed), rows whose new
token cannot complete a stop string are never decoded, and a new stopping rule is one class."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import build_tiny_llama, build_tiny_tokenizer, needs_embedded

from lm_eval_ponder.engine import LoopConfig, StepView, generate_rows
from lm_eval_ponder.engine.stops import DeviceRule, StopStrings, candidate_table


def test_candidates_on_a_character_tokenizer():
    tok = build_tiny_tokenizer()

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    table = candidate_table(decode, ("###", "\n"), len(tok))
    found = {tok.convert_ids_to_tokens(i) for i in range(len(tok)) if table[i]}
    # the stops' last characters, and the special tokens (they decode to nothing)
    assert found == {"#", "\n", "<unk>", "<s>", "</s>", "<pad>"}
    assert candidate_table(decode, ("###", "\n"), len(tok)) is table  # built once per decoder


def test_no_stop_strings_check_nothing():
    stops = StopStrings([], None, 100, torch.device("cpu"))
    assert not stops and not stops.candidates(torch.tensor([1, 2, 3])).any()


@needs_embedded
def test_table_never_misses_a_stop_on_the_embedded_tokenizer(embedded_dir):
    """Sound by construction, checked on SmolLM2's byte-level BPE: for texts holding each stop
    string, every token at which the stop first appears in the decoded prefix is a candidate
    (multi-byte characters, spaces and special-token text included)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_dir)

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    stops = ("\n\n", "Question:", "<|im_end|>", "。", " ]", "ü")
    table = candidate_table(decode, stops, len(tok))
    assert table.sum() < 0.2 * len(tok)  # selective: most tokens can complete nothing
    rng = random.Random(0)
    words = ["the", " answer", " is", " 42", ".", "\n", "Q", "uestion", ":", "<", "|", "im",
             "_end", "|>", "。", "日本", " ", "]", "ü", "ber", "x"]
    checked = 0
    for _ in range(300):
        text = "".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        text += rng.choice(stops) + rng.choice(["", "tail", " more"])
        ids = tok(text, add_special_tokens=False).input_ids
        for stop in stops:
            for k in range(1, len(ids) + 1):
                if stop in decode(ids[:k]):
                    if stop not in decode(ids[: k - 1]):
                        assert table[ids[k - 1]], (stop, tok.convert_ids_to_tokens(ids[:k]))
                        checked += 1
                    break
    assert checked > 300


def test_rows_are_decoded_only_when_their_token_can_complete_a_stop():
    """Negative control on the loop: a generation whose tokens never hold a stop string's last
    character decodes nothing after the table is built."""
    from conftest import build_tiny_llama

    from lm_eval_ponder.engine.loop import generate_rows

    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_llama(len(tok), seed=0)
    enc = tok(["What is 2+2?", "Hello"], return_tensors="pt", padding=True,
              add_special_tokens=False)
    calls = []

    def decode(ids):
        calls.append(list(ids))
        return tok.decode(ids, skip_special_tokens=True)

    free = generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=12,
                         eos_token_ids=set(), pad_token_id=3)
    emitted = {t for row in free.sequences[:, enc.input_ids.shape[1]:].tolist() for t in row}
    absent = next(c for c in "#@~^`" if tok.convert_tokens_to_ids(c) not in emitted)
    candidate_table(decode, (absent,), model.get_output_embeddings().weight.shape[0])
    calls.clear()
    res = generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=12,
                        eos_token_ids=set(), pad_token_id=3, stop=[absent], decode=decode)
    assert torch.equal(res.sequences, free.sequences) and calls == []
    present = tok.convert_ids_to_tokens(free.sequences[0, -1].item())
    candidate_table(decode, (present,), model.get_output_embeddings().weight.shape[0])
    calls.clear()
    generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=12,
                  eos_token_ids=set(), pad_token_id=3, stop=[present], decode=decode)
    assert calls  # a token that can complete the stop is checked on the host


class EndsAt(DeviceRule):
    """A rule a user might add: end a row at a given token id (kept, or dropped)."""

    reason = "ends_at"

    def __init__(self, token: int, keeps_token: bool = True) -> None:
        self.token, self.keeps_token = token, keeps_token

    def flags(self, step: StepView) -> torch.Tensor:
        return step.tokens == self.token


@pytest.mark.parametrize("keeps", [True, False])
def test_a_new_stopping_rule_is_one_class(left_tokenizer, keeps):
    """A rule plugged in through ``LoopConfig.stops`` ends the rows it flags, with its reason,
    keeping or dropping its token, and leaves every other row as the loop alone leaves it; it
    is checked before the loop's own rules (its token here is also an end of text)."""
    tok = left_tokenizer
    model = build_tiny_llama(len(tok), seed=0)
    prompts = ["What is 3 + 5?", "Add 12 and 30.", "Hi", "Compute 7 times 8 please."]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    width = enc.input_ids.shape[1]

    def run(stops=(), eos=frozenset({999})):
        return generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=12,
                             eos_token_ids=set(eos), pad_token_id=3,
                             config=LoopConfig(max_rows=2, stops=stops))

    plain = run()
    rows = [plain.sequences[r, width:].tolist() for r in range(len(prompts))]
    token = rows[0][4]  # a token row 0 emits at its fifth step
    firsts = [row.index(token) if token in row else None for row in rows]
    assert any(f is None for f in firsts)  # some rows never see it: they must not change
    stopped = run((EndsAt(token, keeps),), eos={999, token})
    for r, first in enumerate(firsts):
        if first is None:
            assert stopped.finish_reason[r] == "length"
            assert stopped.sequences[r, width:].tolist() == rows[r]
            continue
        kept = first + 1 if keeps else first
        assert stopped.finish_reason[r] == "ends_at"  # before EOS, which the token also is
        assert stopped.gen_tokens[r] == kept
        assert stopped.sequences[r, width:width + kept].tolist() == rows[r][:kept]
        assert stopped.sequences[r, width + kept:].eq(3).all()


def test_stop_strings_on_a_model_without_an_output_embedding_getter(left_tokenizer):
    """The stop table's vocabulary comes from the config where the model has no
    ``get_output_embeddings`` (the loop read its config before setting it: AttributeError)."""
    tok = left_tokenizer
    model = build_tiny_llama(len(tok), seed=0)
    enc = tok(["What is 3 + 5?", "Hi"], return_tensors="pt", padding=True,
              add_special_tokens=False)

    def run():
        return generate_rows(model, enc.input_ids, enc.attention_mask, max_new_tokens=8,
                             eos_token_ids=set(), pad_token_id=3, stop=["#"],
                             decode=lambda ids: tok.decode(ids, skip_special_tokens=True))

    with_head = run()
    model.get_output_embeddings = lambda: None
    assert torch.equal(run().sequences, with_head.sequences)
