"""arith_ponder tasks: bindings of lm_eval_ponder.evaluation.tasklib for numeric answers."""

from lm_eval_ponder.evaluation import tasklib

load = tasklib.arith_dataset
doc_to_text_plain = tasklib.make_prompt(tasklib.PLAIN_PROMPT, "", with_choices=False)
doc_to_text_cot = tasklib.make_prompt(tasklib.COT_PROMPT, "", with_choices=False)
keep_all = tasklib.keep_all


def doc_to_target(doc: dict) -> str:
    return doc["answer"]


def process_results(doc: dict, results: list) -> dict:
    return tasklib.score("numeric", doc, results, doc["answer"])
