"""lm-eval's ``generate_until`` requests as the engine takes them, read exactly as HFLM reads them.

``PonderLM`` owns ``generate_until`` end to end (as lm-eval's vLLM backend does), so the pieces
of HFLM's that decide what a run generates are repeated here with lm-eval's own helpers:
the order and grouping of requests (``Collator``: by generation kwargs, longest context
first), the kwargs (``normalize_gen_kwargs``, ``handle_stop_sequences``), the reading of
``temperature``/``do_sample`` (``generation.batch.hf_sampling_kwargs``) and the answer's
text (``answer_text``: after the last think-end token, decoded, cut at the first stop
string). The tests that check
``--model ponder`` token for token and text for text against ``--model hf`` hold them to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.generation.generator import Generation


def read_generation(gen_kwargs: dict, default_max_gen_toks: int, eos_text: str) -> Generation:
    """A request group's generation kwargs as HFLM reads them (``normalize_gen_kwargs``,
    ``handle_stop_sequences``: the EOS text is a stop string too). The model hands this, with
    its defaults, to its ``SteeredGenerator``, so the trainer's calls are read the same way."""
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

    kwargs = normalize_gen_kwargs(dict(gen_kwargs), default_max_gen_toks)
    until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
    max_gen_toks = checked_max_gen_toks(kwargs.pop("max_gen_toks"))
    kwargs.pop("max_length", None)  # HFLM warns and prefers max_gen_toks; so do we
    return Generation(until, max_gen_toks, kwargs)


def checked_max_gen_toks(value: Any) -> int:
    """``max_gen_toks`` as a positive integer, or one line naming the value (``abc`` ended in
    ``int()``'s traceback after the model had loaded)."""
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number = float(value)
        if not number.is_integer() or number < 1:
            raise ValueError(value)
    except (TypeError, ValueError, OverflowError):
        raise PonderError(f"max_gen_toks={value!r} is not a positive integer: pass e.g. "
                          "--gen_kwargs max_gen_toks=256") from None
    return int(number)


def request_groups(requests: Sequence[Any], indices: Sequence[int],
                   length: Callable[[str], int]) -> Iterator[tuple[dict, list[int]]]:
    """(generation kwargs, request indices) per group, in HFLM's order: requests grouped by
    their kwargs (so greedy and sampled requests never share a batch), each group longest
    context first (``length``: tokens of a context), ties by context."""
    from lm_eval.models.utils import Collator

    order = Collator([(requests[i].args[0], requests[i].args[1], i) for i in indices],
                     sort_fn=lambda req: (-length(req[0]), req[0]),
                     group_by="gen_kwargs", group_fn=lambda req: req[1])
    for chunk in order.get_batched(n=0):
        yield chunk[0][1], [i for _, _, i in chunk]


def answer_text(tokens: list[int], until: list[str], think_end_token: Any,
                decode: Callable[[list[int]], str]) -> str:
    """A row's answer from its generated tokens, made as HFLM's ``generate_until`` makes it
    (after the last think-end token, decoded, cut at the first stop string)."""
    from lm_eval.models.utils import postprocess_generated_text

    if isinstance(think_end_token, int) and think_end_token in tokens:  # after the last one
        tokens = tokens[len(tokens) - tokens[::-1].index(think_end_token):]
    text = decode(tokens)
    return postprocess_generated_text(
        generation=text.lstrip() if isinstance(think_end_token, int) else text, stop=until,
        think_end_token=think_end_token if isinstance(think_end_token, str) else None)
