"""gpqa_ponder tasks: bindings of lm_eval_ponder.evaluation.tasklib for choice answers."""

from lm_eval_ponder.evaluation import tasklib

load = tasklib.gpqa_dataset
doc_to_text_plain = tasklib.make_prompt(tasklib.PLAIN_PROMPT, tasklib.CHOICE_SUFFIX, with_choices=True)
doc_to_text_cot = tasklib.make_prompt(tasklib.COT_PROMPT, tasklib.CHOICE_SUFFIX, with_choices=True)
keep_all = tasklib.keep_all


def doc_to_target(doc: dict) -> str:
    return doc["answer"]


def process_results(doc: dict, results: list) -> dict:
    return tasklib.score("choice", doc, results, doc["answer"])
