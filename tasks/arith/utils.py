"""arith_ponder tasks: bindings of lm_eval_ponder.scoring.tasklib to arith's row of
lm_eval_ponder.registry, whose answer kind picks the prompt's answer format and the grader."""

from lm_eval_ponder import registry
from lm_eval_ponder.scoring import tasklib

DATASET = registry.dataset("arith")
load = tasklib.arith_dataset
doc_to_text_plain = tasklib.dataset_prompt(tasklib.PLAIN_PROMPT, DATASET)
doc_to_text_cot = tasklib.dataset_prompt(tasklib.COT_PROMPT, DATASET)
keep_all = tasklib.keep_all
FewshotSampler = tasklib.fewshot_sampler(DATASET)


def doc_to_target(doc: dict) -> str:
    return doc["answer"]


def process_results(doc: dict, results: list) -> dict:
    return tasklib.score(DATASET.answer, doc, results, doc["answer"])
