"""End-to-end on the embedded SmolLM2-135M-Instruct (real weights, CPU): equivalence with
``--model hf``, frozen weights, and the shipped steering vector (the converted-weights cache is
tests/test_backbone.py)."""

from __future__ import annotations

import pytest
from conftest import needs_embedded

from lm_eval_ponder import backbone as bb

pytestmark = pytest.mark.slow


GEN = "max_gen_toks=40"
LIMIT = 6


def run(model, model_args: dict, tasks=("arith_ponder",), limit=LIMIT):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_ponder.resources import tasks_dir

    return simple_evaluate(
        model=model, model_args=model_args, tasks=list(tasks), limit=limit, gen_kwargs=GEN,
        apply_chat_template=True, log_samples=True, batch_size=8, device="cpu",
        task_manager=TaskManager(include_path=tasks_dir()),
    )


@needs_embedded
def test_ponder_matches_hf_token_for_token(embedded_dir):
    # One dtype for both: ponder's default follows the CPU (bf16 where it is native), hf's is
    # the checkpoint's; the claim is identical tokens at the same precision.
    hf = run("hf", {"pretrained": embedded_dir, "dtype": "float32"})
    ponder = run("ponder", {"controller": "none", "dtype": "float32"})
    hf_resps = [s["resps"] for s in hf["samples"]["arith_ponder"]]
    ponder_resps = [s["resps"] for s in ponder["samples"]["arith_ponder"]]
    assert hf_resps == ponder_resps
    assert hf["results"]["arith_ponder"]["exact_match,none"] == \
        ponder["results"]["arith_ponder"]["exact_match,none"]
    # --model hf carries no accounting: reported as NaN, never invented
    assert hf["results"]["arith_ponder"]["flops,none"] != hf["results"]["arith_ponder"]["flops,none"]
    for sample in ponder["samples"]["arith_ponder"]:
        assert 0 < sample["gen_tokens"] <= 40
        assert sample["flops"] >= 2 * 106e6 * sample["gen_tokens"]


@needs_embedded
def test_embedded_weights_unchanged_after_a_run(embedded_dir):
    import hashlib

    from lm_eval_ponder.evaluation.lm import PonderLM

    lm = PonderLM(batch_size=8)

    def digest():
        h = hashlib.sha256()
        for name, tensor in sorted(lm.model.state_dict().items()):
            h.update(name.encode() + tensor.float().numpy().tobytes())  # bf16 -> fp32 is exact
        return h.hexdigest()

    before = digest()
    run(lm, {})
    assert digest() == before


@needs_embedded
def test_shipped_vector_fixed_alpha_and_controller_run(tmp_path):
    """The shipped steering vector loads against the embedded backbone; a fixed alpha and a
    (constant, always-K_max) controller both run through lm-eval with per-sample accounting."""
    import torch

    from lm_eval_ponder.pondering.controller import PonderController, save_controller

    controller = PonderController(576)
    with torch.no_grad():
        [m for m in controller.modules() if isinstance(m, torch.nn.Linear)][-1].bias.fill_(20.0)
    save_controller(controller, tmp_path / "always")
    fixed = run("ponder", {"alpha": -0.2}, limit=3)
    pondered = run("ponder", {"controller": str(tmp_path / "always"), "alpha_start": -0.2}, limit=3)
    for sample in pondered["samples"]["arith_ponder"]:
        assert sample["ponder_steps"] == 8.0
    for a, b in zip(fixed["samples"]["arith_ponder"], pondered["samples"]["arith_ponder"]):
        if a["gen_tokens"] == b["gen_tokens"]:
            assert b["flops"] > a["flops"]  # the controller's 9 evaluations are charged


@needs_embedded
def test_default_model_uses_the_shipped_controller():
    """`--model ponder` with no args on the embedded backbone is FP with the shipped controller
    and the ponder settings it was trained with; controller=none is the plain baseline."""
    import json

    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.resources import shipped_controller_dir

    shipped = shipped_controller_dir(bb.EMBEDDED_NAME)
    config = json.loads((shipped / "config.json").read_text())
    lm = PonderLM(batch_size=4)
    assert lm.controller is not None and lm.ponder.controller_dir == shipped
    assert vars(lm.ponder_config) == config["ponder"]
    assert lm.generator.steering.layer == config["layer"]
    assert not PonderLM(batch_size=4, controller="none").pondering


@needs_embedded
def test_recount_from_text_matches_ponder_count_to_eos():
    """The report's estimate for models without accounting (accounting.count_text_tokens)
    counts what ponder counts: a short answer that ends in EOS gets the same number."""
    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.generation.accounting import count_text_tokens

    lm = PonderLM(controller="none", dtype="float32", batch_size=2)
    prompts = [lm.apply_chat_template([{"role": "user", "content": q}]) for q in
               ("What is 2 + 2? Reply with the number only.", "What is the capital of France?",
                "Answer yes or no: is 5 > 3?")]
    texts = lm.generator.generate_texts(prompts, {"until": [], "max_gen_toks": 40, "do_sample": False})
    for text in texts:
        assert text.stats["gen_tokens"] < 40, "expected an answer that ends in EOS"
        assert count_text_tokens(lm.tokenizer, text, 40) == text.stats["gen_tokens"]
