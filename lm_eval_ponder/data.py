"""Where benchmark data comes from, and the offline arithmetic difficulty ladder.

Two sources, chosen once and never mixed: if ``LM_EVAL_PONDER_DATA`` names a directory laid
out like the project's shared data folder, the gzipped JSON-lines files there are read as they
are (offline runs, CI); otherwise the same sets come from the Hugging Face Hub. Every failure
becomes one ``PonderDataError`` that names both ways to get the data and what was missing, so
a user never has to read a ``datasets`` traceback to learn that GPQA is gated.

The arithmetic ladder needs no download at all: five difficulty levels generated from fixed
seeds, so the "easy questions need less thinking" analysis can run anywhere.

``datasets`` is imported inside functions: this module is imported by task configs, and the
package must stay cheap to import.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lm_eval_ponder.errors import PonderDataError

if TYPE_CHECKING:  # pragma: no cover
    import datasets

DATA_ENV = "LM_EVAL_PONDER_DATA"
ARITH_LEVELS = (1, 2, 3, 4, 5)

_LAYOUT = "gsm8k/train.jsonl.gz, gsm8k/test.jsonl.gz, math500/test.jsonl.gz, gpqa/diamond.jsonl.gz"
_GSM8K_SPLITS = ("train", "test")
_GPQA_HUB = "Idavidrein/gpqa"
_GPQA_TEXT_KEYS = ("correct answer", *(f"incorrect answer {i}" for i in (1, 2, 3)))
_GPQA_KEEP = ("high-level domain", "subdomain")
_LETTERS = "ABCD"


# --------------------------------------------------------------------------- sources


def _fail(what: str, hub_id: str, detail: str) -> PonderDataError:
    """The single user-facing error: what failed, why, and the two ways to get the data."""
    return PonderDataError(
        f"could not load {what}: {detail}. To fix: set {DATA_ENV}=<dir> to a directory laid out "
        f"like the project's shared data folder ({_LAYOUT}), or allow access to the Hugging Face "
        f"Hub dataset {hub_id} (network, and for GPQA an accepted licence / HF token).")


def _short(exc: BaseException, limit: int = 300) -> str:
    """Hub errors can be pages long; the user needs the type and the first line or so."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_jsonl_gz(path: Path) -> list[tuple[int, Any]]:
    """Read gzipped JSON lines as (line number, row), skipping blank lines (a trailing newline
    is not a row). A line that is not JSON is reported with its line number in the file
    (``json.loads`` of one line alone would say "line 1" whatever line it was)."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line.strip())))
            except json.JSONDecodeError as error:
                raise ValueError(f"line {number} is not JSON: {error.msg} (column "
                                 f"{error.colno})") from None
    return rows


# --------------------------------------------------------------------------- schemas


@dataclass(frozen=True)
class Schema:
    """The fields every row of a dataset must carry, with their types (names compared in lower
    case: the Hub capitalises GPQA's), and what else a row of it must hold. Checked on read,
    row by row: a row without ``answer`` ended in ``KeyError: 'answer'`` from the task, and a
    MATH-500 file placed where GSM8K's belongs was prompted and graded as GSM8K (targets
    ``2`` and "")."""

    fields: tuple[str, ...]
    types: tuple[type, ...]
    also: Callable[[dict], str | None] | None = None

    def problem(self, row: Any) -> str | None:
        """What is wrong with one row, or None."""
        if not isinstance(row, dict):
            return f"a JSON {type(row).__name__}, not an object"
        low = {str(k).lower(): v for k, v in row.items()}
        missing = [f for f in self.fields if f not in low]
        if missing:
            return f"no field {', '.join(map(repr, missing))}"
        wrong = [f"{f!r} is {type(low[f]).__name__}, not {t.__name__}"
                 for f, t in zip(self.fields, self.types) if not isinstance(low[f], t)]
        if wrong:
            return "; ".join(wrong)
        return self.also(low) if self.also else None

    def shape(self) -> str:
        return ", ".join(f"{f} ({t.__name__})" for f, t in zip(self.fields, self.types))


def _gsm8k_answer(row: dict) -> str | None:
    if "####" not in row["answer"]:
        return "'answer' has no final '#### <number>' (every GSM8K answer ends in one)"
    return None


SCHEMAS = {
    "GSM8K": Schema(("question", "answer"), (str, str), _gsm8k_answer),
    "MATH-500": Schema(("problem", "answer"), (str, str)),
    "GPQA Diamond": Schema(("question", *_GPQA_TEXT_KEYS), (str,) * 5),
}


def _check_rows(what: str, rows: Iterable[tuple[int, Any]], where: str) -> None:
    """Refuse the first row that does not fit ``what``'s schema, naming ``where`` (the file
    and its line, or the Hub dataset and its row) and the fields the dataset's rows carry."""
    name = what.split(" (")[0]
    schema = SCHEMAS[name]
    for number, row in rows:
        problem = schema.problem(row)
        if problem is not None:
            raise PonderDataError(
                f"could not load {what}: {where} {number}: {problem}. A {name} row has "
                f"{schema.shape()}: is this {name}'s file, and whole? Restore it, or point "
                f"{DATA_ENV} at a folder laid out like the project's shared data folder "
                f"({_LAYOUT})")


def _load_local(what: str, raw: str, rel_path: str, hub_id: str) -> datasets.Dataset:
    """Read one file under the directory named by the environment variable, fields unchanged,
    each row checked against the dataset's schema."""
    root = Path(raw).expanduser()
    if not root.is_dir():
        raise _fail(what, hub_id, f"{DATA_ENV}={raw} is not a directory (looked at {root.resolve()})")
    path = root / rel_path
    if not path.is_file():
        raise _fail(what, hub_id, f"{DATA_ENV}={raw} is set but has no {rel_path} ({path.resolve()} "
                                  "does not exist)")
    try:
        rows = _read_jsonl_gz(path)
        if not rows:
            raise ValueError("the file has no rows")
    except Exception as exc:  # corrupt gzip, bad JSON, ...
        raise _fail(what, hub_id, f"could not read {path.resolve()} ({_short(exc)})") from exc
    _check_rows(what, rows, f"{path.resolve()}, line")
    import datasets

    return datasets.Dataset.from_list([row for _, row in rows])


def _load(
    what: str, rel_path: str, hub_id: str, from_hub: Callable[[Any], datasets.Dataset]
) -> datasets.Dataset:
    """Local directory if the env var is set, else the Hub; never silently fall back."""
    raw = os.environ.get(DATA_ENV, "").strip()
    if raw:
        return _load_local(what, raw, rel_path, hub_id)
    try:
        import datasets

        loaded = from_hub(datasets)
    except Exception as exc:  # offline, gated, renamed, datasets missing: all the same to users
        detail = f"{DATA_ENV} is not set and the Hugging Face Hub load failed ({_short(exc)})"
        raise _fail(what, hub_id, detail) from exc
    _check_rows(what, enumerate(loaded, 1), f"the Hub dataset {hub_id}, row")
    return loaded


def load_gsm8k(split: str = "test") -> datasets.Dataset:
    """GSM8K ("question", "answer" ending in "#### <number>"), split "train" or "test"."""
    if split not in _GSM8K_SPLITS:
        raise PonderDataError(f"unknown GSM8K split {split!r}; use one of {_GSM8K_SPLITS}")
    hub = "openai/gsm8k"
    return _load(f"GSM8K ({split})", f"gsm8k/{split}.jsonl.gz", hub,
                 lambda ds: ds.load_dataset(hub, "main", split=split))


def load_math500() -> datasets.Dataset:
    """MATH-500 (problem, solution, answer, subject, level, unique_id)."""
    hub = "HuggingFaceH4/MATH-500"
    return _load("MATH-500", "math500/test.jsonl.gz", hub, lambda ds: ds.load_dataset(hub, split="test"))


def load_gpqa_diamond() -> datasets.Dataset:
    """GPQA Diamond (198 rows) with lower-case column names, whichever source it came from (the
    Hub capitalises them, the local file does not)."""
    dataset = _load("GPQA Diamond", "gpqa/diamond.jsonl.gz", _GPQA_HUB,
                    lambda ds: ds.load_dataset(_GPQA_HUB, "gpqa_diamond", split="train"))
    mapping = {c: c.lower() for c in dataset.column_names
               if c != c.lower() and c.lower() not in dataset.column_names}
    return dataset.rename_columns(mapping) if mapping else dataset


# --------------------------------------------------------------------------- GPQA choices


def gpqa_multiple_choice(row: dict) -> dict:
    """Turn a GPQA row into a four-choice question with a reproducible answer position.

    The correct answer is always first in the raw data, so the choices must be shuffled; the
    shuffle is seeded per question (sha256 of the record id, else of the question text) so the
    letter is the same across runs, processes and machines, and independent of global RNG state.
    """
    low = {str(k).lower(): v for k, v in row.items()}
    missing = [k for k in ("question", *_GPQA_TEXT_KEYS) if not isinstance(low.get(k), str)]
    if missing:
        raise PonderDataError(
            f"GPQA row lacks text field(s) {missing}; expected the columns of {_GPQA_HUB} "
            "(question, correct answer, incorrect answer 1..3)"
        )
    question = low["question"].strip()
    record_id = str(low.get("record id") or "").strip()
    if not record_id:
        record_id = "gpqa-" + hashlib.sha256(question.encode("utf-8")).hexdigest()[:12]
    options = [low[k].strip() for k in _GPQA_TEXT_KEYS]
    order = list(range(4))
    # sha256, not hash(): Python's hash() is salted per process
    seed = hashlib.sha256(f"lm_eval_ponder/gpqa/{record_id}".encode("utf-8")).digest()[:8]
    random.Random(int.from_bytes(seed, "big")).shuffle(order)
    return {
        "question": question,
        "choices": [options[i] for i in order],
        "answer": _LETTERS[order.index(0)],
        "record_id": record_id,
    }


def process_gpqa(dataset: Any) -> datasets.Dataset:
    """Map gpqa_multiple_choice over a GPQA dataset, keeping the domain fields for breakdowns."""
    import datasets

    if not isinstance(dataset, datasets.Dataset):
        dataset = datasets.Dataset.from_list(list(dataset))
    columns = dataset.column_names
    keep = {k: c for c in columns for k in _GPQA_KEEP if c.lower() == k}

    def convert(row: dict) -> dict:
        out = gpqa_multiple_choice(row)
        out.update({k: row[c] for k, c in keep.items()})
        return out

    return dataset.map(convert, remove_columns=columns)


# --------------------------------------------------------------------------- arithmetic ladder

_SPLIT_SEEDS = {"test": 20_240_917, "train": 7_031}
_EXCLUDE_AT_LEAST = 100  # train always avoids the default-size test set, whatever per_level
_FORMS = (
    "What is {e}?", "Compute {e}.", "Calculate {e}.", "Work out {e}.",
    "Find the value of {e}.", "What is the value of {e}?", "Evaluate {e}.", "{e} = ?",
)  # fmt: skip
_NAMES = ("Tom", "Maya", "Ali", "Sofia", "Ken", "Priya", "Lena", "Omar")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "shells")

Problem = tuple[str, str, int]  # question text, Python expression, exact answer


def _bare(rng: random.Random, expr: str, answer: int) -> Problem:
    """Levels 1-3 ask the bare sum; the question shows the expression with a × sign."""
    text = rng.choice(_FORMS).format(e=expr.replace("*", "×"))
    return text, expr, answer


def _level1(rng: random.Random) -> Problem:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return _bare(rng, f"{a} + {b}", a + b)


def _level2(rng: random.Random) -> Problem:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        return _bare(rng, f"{a} + {b}", a + b)
    a, b = max(a, b), min(a, b)
    return _bare(rng, f"{a} - {b}", a - b)


def _level3(rng: random.Random) -> Problem:
    if rng.random() < 0.5:
        a, b = rng.randint(10, 99), rng.randint(2, 9)
        return _bare(rng, f"{a} * {b}", a * b)
    while True:  # three-digit add/sub mix, at least one minus, no negative step: else redraw
        a, b, c = (rng.randint(100, 999) for _ in range(3))
        op1, op2 = rng.choice((("+", "-"), ("-", "+"), ("-", "-")))
        first = a + b if op1 == "+" else a - b
        value = first + c if op2 == "+" else first - c
        if first >= 0 and value >= 0:
            return _bare(rng, f"{a} {op1} {b} {op2} {c}", value)


def _level4(rng: random.Random) -> Problem:
    """Two-step word problems: two operations in a one-sentence story."""
    n, item, kind = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randrange(5)
    if kind == 0:
        a, b, c = rng.randint(5, 40), rng.randint(2, 9), rng.randint(2, 12)
        q = (f"{n} has {a} {item} and buys {b} bags with {c} {item} in each bag. "
             f"How many {item} does {n} have now?")
        return q, f"{a} + {b} * {c}", a + b * c
    if kind == 1:
        a, c = rng.randint(2, 9), rng.randint(6, 24)
        b = rng.randint(1, a * c - 1)
        q = (f"{n} bakes {a} trays of {c} cookies and gives {b} cookies to the neighbours. "
             f"How many cookies does {n} have left?")
        return q, f"{a} * {c} - {b}", a * c - b
    if kind == 2:
        a = rng.randint(20, 90)
        b, c = rng.randint(1, a), rng.randint(5, 40)
        q = (f"{n} has {a} dollars, spends {b} dollars on a book, "
             f"and then earns {c} dollars washing cars. How many dollars does {n} have now?")
        return q, f"{a} - {b} + {c}", a - b + c
    if kind == 3:
        b, k, c = rng.randint(2, 9), rng.randint(2, 15), rng.randint(1, 20)
        q = (f"{n} shares {b * k} {item} equally among {b} friends. "
             f"Each friend already had {c} {item}. How many {item} does each friend have now?")
        return q, f"{b * k} / {b} + {c}", k + c
    a, b, c = rng.randint(5, 30), rng.randint(2, 9), rng.randint(1, 40)
    q = (f"{n} reads {a} pages every day for {b} days and then {c} more pages on Sunday. "
         f"How many pages did {n} read in total?")
    return q, f"{a} * {b} + {c}", a * b + c


def _level5(rng: random.Random) -> Problem:
    """Multi-step stories with three or more operations, divisions always exact."""
    n, item, kind = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randrange(5)
    if kind == 0:
        a, b, d = rng.randint(2, 8), rng.randint(5, 12), rng.randint(2, 6)
        q_each = rng.randint(1, (a * b - 1) // d)
        c = a * b - d * q_each
        q = (f"{n} buys {a} packs of {b} cards, gives {c} cards to a friend, "
             f"and splits the rest equally into {d} piles. How many cards are in each pile?")
        return q, f"({a} * {b} - {c}) / {d}", q_each
    if kind == 1:
        a, b = rng.randint(20, 90), rng.randint(3, 9)
        c = rng.randint(1, a * b // 2)
        d = rng.randint(1, a * b - c)
        q = (f"{n} earns {a} dollars a day for {b} days, then pays {c} dollars for rent "
             f"and {d} dollars for food. How many dollars does {n} have left?")
        return q, f"{a} * {b} - {c} - {d}", a * b - c - d
    if kind == 2:
        a, b, c, e = rng.randint(2, 6), rng.randint(3, 9), rng.randint(5, 20), rng.randint(2, 9)
        total = a * b * c
        d = total % e + e * rng.randint(0, min(3, total // e - 1)) or e  # >= 1 box left
        q = (f"An orchard has {a} rows of {b} trees, and each tree gives {c} apples. The farmer "
             f"keeps {d} apples and packs the rest into boxes of {e}. How many boxes are filled?")
        return q, f"({a} * {b} * {c} - {d}) / {e}", (total - d) // e
    if kind == 3:
        d, each = rng.randint(2, 6), rng.randint(5, 20)
        total = d * each
        b, c = rng.randint(2, min(20, total - 1)), rng.randint(1, 20)
        a = total - b + c
        q = (f"{n} has {a} {item}, wins {b} more in a game, and then loses {c}. "
             f"{n} puts the rest into {d} equal bags. How many {item} are in each bag?")
        return q, f"({a} + {b} - {c}) / {d}", each
    if kind == 4:
        groups, size, c = rng.randint(3, 9), rng.randint(2, 6), rng.randint(2, 8)
        d = rng.randint(1, groups * c - 1)
        q = (f"A class of {groups * size} students splits into groups of {size}. Each group "
             f"needs {c} markers, and the teacher has {d} markers. How many more are needed?")
        return q, f"{groups * size} / {size} * {c} - {d}", groups * c - d
    a, b, c, d = rng.randint(2, 6), rng.randint(2, 9), rng.randint(2, 6), rng.randint(1, 5)
    cost = a * b + c * d
    e = 50 if cost <= 50 and rng.random() < 0.5 else 100
    q = (f"{n} buys {a} notebooks at {b} dollars each and {c} pens at {d} dollars each, "
         f"and pays with a {e}-dollar bill. How many dollars of change does {n} get?")
    return q, f"{e} - ({a} * {b} + {c} * {d})", e - cost


_GENERATORS: dict[int, Callable[[random.Random], Problem]] = dict(
    zip(ARITH_LEVELS, (_level1, _level2, _level3, _level4, _level5))
)


def _generate(split: str, level: int, count: int, exclude: set[str]) -> list[dict]:
    """Draw ``count`` distinct questions for one level; the prefix of a longer run is the same."""
    rng = random.Random(_SPLIT_SEEDS[split] * 10 + level)
    seen, docs, misses = set(exclude), [], 0
    while len(docs) < count:
        if misses > 5000:  # only the small levels run dry; fail fast instead of spinning
            raise PonderDataError(
                f"arith level {level} ran out of distinct questions at {len(docs)} of {count}; "
                "level 1 has 648 in all, shared by train and test: use per_level <= 300"
            )
        question, expr, answer = _GENERATORS[level](rng)
        if question in seen:
            misses += 1
            continue
        seen.add(question)
        misses = 0
        doc_id = f"arith-{split}-L{level}-{len(docs):04d}"
        docs.append({"id": doc_id, "level": level, "question": question, "answer": str(answer),
                     "n_ops": sum(expr.count(sign) for sign in "+-*/"),  # binary operators
                     "expression": expr})  # fmt: skip
    return docs


def arith_ladder(split: str = "test", per_level: int = 100) -> list[dict]:
    """Five levels x ``per_level`` arithmetic questions, the same on every call and machine,
    interleaved by level.

    Train and test use different seeds, and every train question whose text appears in the
    test set (of size max(per_level, 100)) is skipped, so few-shot examples never leak answers.
    Level 1 has only 648 distinct questions, so per_level is capped at about 300.
    """
    if split not in _SPLIT_SEEDS:
        raise PonderDataError(f"unknown arith split {split!r}; use 'train' or 'test'")
    if isinstance(per_level, bool) or not isinstance(per_level, int) or per_level < 1:
        raise PonderDataError(f"arith per_level must be a positive integer, got {per_level!r}")
    exclude: set[str] = set()
    if split == "train":
        exclude = {d["question"] for d in arith_ladder("test", max(per_level, _EXCLUDE_AT_LEAST))}
    per = [_generate(split, level, per_level, exclude) for level in ARITH_LEVELS]
    # Interleaved (L1, L2, ..., L5, L1, ...) so that `--limit N` covers every level evenly.
    return [docs[i] for i in range(per_level) for docs in per]


def load_arith(split: str = "test", per_level: int = 100) -> datasets.Dataset:
    """The arith ladder as a ``datasets.Dataset``, for lm-eval task configs."""
    import datasets

    return datasets.Dataset.from_list(arith_ladder(split, per_level))
