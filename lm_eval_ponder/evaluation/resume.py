"""Sampled answers kept as they come, so an interrupted sampled run resumes mid-dataset.

lm-eval's ``--use_cache`` refuses every request with ``do_sample``: its key (prompt and
generation kwargs) is the same for the N repeats of a Best-of-N question. Best-of-5 on GSM8K is
6,595 sampled requests, hours of a CPU, and without a cache a stopped run started from zero.
Here each sampled answer is keyed by the request's lm-eval key plus its occurrence ``k`` among
identical requests (0..N-1), in lm-eval's own cache file (stamped with the model's fingerprint,
``PonderLM.set_cache_hook``). Samples of one request are exchangeable, so kept and new answers
together are a valid sample, though not the one an uninterrupted run with the same seed draws
(the random stream and the batches differ); the model logs how many were kept
(docs/design/lm-eval.md, ``--use_cache``).
"""

from __future__ import annotations

import gzip
import json
import logging
import sqlite3
from collections import defaultdict, deque
from collections.abc import Callable, MutableMapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from lm_eval.api.model import hash_args

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import atomic_write
from lm_eval_ponder.generation.accounting import GenerationText

LOGGER = logging.getLogger(__name__)

PREFIX = "lm_eval_ponder/sampled"
# the key under which PonderLM stamps a --use_cache file with its settings' fingerprint
CACHE_MARKER = "__lm_eval_ponder_fingerprint__"
# beside ``answers_rank0.db``: the kept answers as text (``export_kept``), small enough to commit
KEPT_SUFFIX = ".kept.jsonl.gz"


def is_sampled(gen_kwargs: Any) -> bool:
    """lm-eval's own test for a request its cache will not keep (``CachingLM``)."""
    return isinstance(gen_kwargs, dict) and bool(gen_kwargs.get("do_sample", False))


def stamp_store(db: MutableMapping[str, Any], fingerprint: str) -> None:
    """Refuse to share an lm-eval ``--use_cache`` file between different model settings, and
    stamp it with this model's ``fingerprint``.

    lm-eval keys cached generations by prompt and generation kwargs only, so a cache written
    without pondering would silently answer a run with pondering. Each file is stamped with the
    model's fingerprint, and a file stamped differently or written by another model refused.
    """
    stamped = db.get(CACHE_MARKER)
    if stamped is None and len(db) > 0:
        raise PonderError(
            "the --use_cache file already holds results that lm-eval-ponder did not write "
            "(another model or settings unknown). Use a fresh --use_cache path for each model "
            "and ponder setting.")
    if stamped is not None and stamped != fingerprint:
        raise PonderError(
            f"the --use_cache file was written with other model/ponder settings ({stamped}, "
            f"this run is {fingerprint}). Cached generations would be returned for the wrong "
            "settings: use a separate --use_cache path per setting.")
    db[CACHE_MARKER] = fingerprint
    LOGGER.info("--use_cache: sampled answers are kept too, each repeat under its own key "
                "(lm_eval_ponder.evaluation.resume); lm-eval's warning that it will not cache "
                "them is about its own keys")


def answer_keys(path: str | Path) -> list[str]:
    """The keys of the answers an interrupted run left in its ``--use_cache`` file (greedy and
    sampled; none when there is no file). lm-eval also writes each sampled answer under the
    request's plain key (and ignores it on reading): those duplicates are not answers."""
    path = Path(path)
    if not path.is_file():
        return []
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        keys = [k for table in tables  # SqliteDict's table: "unnamed" unless lm-eval names one
                for (k,) in db.execute(f'SELECT key FROM "{table}"')]
    sampled = [k for k in keys if k.startswith(PREFIX + "/")]
    sampled_hashes = {k[len(PREFIX) + 1:].rsplit("/", 1)[0] for k in sampled}
    greedy = [k for k in keys
              if k != CACHE_MARKER and not k.startswith(PREFIX + "/") and k not in sampled_hashes]
    return sampled + greedy


def kept_answers(path: str | Path) -> int:
    """How many answers an interrupted run left in its ``--use_cache`` file (0 when there is
    none). The suite records it, so a resumed run's wall time is not read as the time of all
    its answers."""
    return len(answer_keys(path))


def kept_path(db_path: str | Path) -> Path:
    """Where ``export_kept`` writes the text twin of a ``--use_cache`` file."""
    db_path = Path(db_path)
    return db_path.with_name(db_path.stem + KEPT_SUFFIX)


def export_kept(db_path: str | Path) -> tuple[Path, int]:
    """Write the answers of a ``--use_cache`` file, with their accounting and the file's
    fingerprint stamp, as gzipped JSON lines beside it; return (path, answers).

    The store is a machine-local SQLite file of pickles (lm-eval's ``SqliteDict``): git-ignored,
    and gone with the machine when a session is cut off, which once lost 2,560 sampled GSM8K
    answers (about two CPU-hours). This twin is text, about 1.6 MB for GSM8K Best-of-5, and can
    be committed while a run is unfinished; ``restore_kept`` turns it back into the store."""
    from sqlitedict import SqliteDict

    db_path = Path(db_path)
    keys = answer_keys(db_path)
    out = kept_path(db_path)

    def write(tmp: str) -> None:
        with closing(SqliteDict(str(db_path), flag="r")) as db, \
                gzip.open(tmp, "wt", encoding="utf-8") as f:
            stamp = db.get(CACHE_MARKER)
            if stamp is None:
                raise PonderError(f"{db_path} carries no lm-eval-ponder fingerprint; it was not "
                                  "written by --model ponder and is not exported")
            f.write(json.dumps({"key": CACHE_MARKER, "value": stamp}) + "\n")
            for key in keys:
                value = db[key]
                f.write(json.dumps({"key": key, "text": str(value),
                                    "stats": getattr(value, "stats", None)}) + "\n")

    atomic_write(out, write)
    return out, len(keys)


def restore_kept(db_path: str | Path) -> int:
    """Rebuild a missing ``--use_cache`` file from its ``export_kept`` twin; return the answers
    restored (0 when there is no twin, or when the file exists: it is at least as recent)."""
    from sqlitedict import SqliteDict

    db_path = Path(db_path)
    twin = kept_path(db_path)
    if db_path.exists() or not twin.is_file():
        return 0
    rows = []
    with gzip.open(twin, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise PonderError(f"{twin}, line {n}: not JSON ({e}); delete the file to run "
                                  "from scratch") from e
    if not rows or rows[0].get("key") != CACHE_MARKER:
        raise PonderError(f"{twin} does not start with the fingerprint stamp; delete it to run "
                          "from scratch")

    def write(tmp: str) -> None:
        with closing(SqliteDict(tmp, autocommit=False)) as db:
            db[CACHE_MARKER] = rows[0]["value"]
            for row in rows[1:]:
                stats = row.get("stats")
                db[row["key"]] = row["text"] if stats is None \
                    else GenerationText(row["text"], stats)
            db.commit()

    atomic_write(db_path, write)
    return len(rows) - 1


class SampledAnswers:
    """The answers of one run in a dict-like store (lm-eval's ``SqliteDict``), kept as rows end.

    ``split`` sorts a request list into sampled answers already kept and requests still to
    generate and reserves, per distinct sampled request, the free occurrence numbers; each
    sampled answer is then stored under one of those numbers as its row ends in the generation
    loop (``keep_early``, called by ``PonderLM``), once: when HFLM hands it over after its call
    (``hook``) the same text is not written again; an answer no row kept (another caller) is
    stored then. A killed run loses only the rows in flight.

    Greedy answers are lm-eval's to keep and to read back (its ``CachingLM`` answers them before
    ``generate_until`` sees them), but they are handed over only when a call returns, and the
    loop takes a whole run in one call: ``keep_early`` also stores each greedy answer under
    lm-eval's own key as its row ends, where the hand-over then overwrites it.
    """

    def __init__(self, store: MutableMapping[str, Any]) -> None:
        self.store = store
        self.free: dict[str, deque[int]] = defaultdict(deque)
        # the request of each context still to generate (None: two requests share the context
        # with different kwargs, so a finished row cannot say which it answers)
        self.by_context: dict[str, str | None] = {}  # context -> its request's hash
        self.greedy: set[str] = set()  # the hashes in by_context that are greedy requests
        # answers kept as their rows ended (``keep_early``), by request and text: the slot
        # HFLM's own hand-over of the same answer then overwrites
        self.early: dict[str, dict[str, deque[int]]] = defaultdict(lambda: defaultdict(deque))

    @staticmethod
    def key(request_hash: str, k: int) -> str:
        return f"{PREFIX}/{request_hash}/{k}"

    def split(self, requests: Sequence[Any]) -> tuple[dict[int, Any], list[int]]:
        """(kept answers by request index, indices of requests to generate)."""
        self.free.clear()
        self.by_context.clear()
        self.greedy.clear()
        self.early.clear()
        seen: dict[str, int] = defaultdict(int)
        kept: dict[int, Any] = {}
        todo: list[int] = []
        for i, req in enumerate(requests):
            h = hash_args("generate_until", req.args)
            if is_sampled(req.args[1]):
                k = seen[h]
                seen[h] += 1
                answer = self.store.get(self.key(h, k))
                if answer is not None:
                    kept[i] = answer
                    continue
                self.free[h].append(k)
            else:  # lm-eval's CachingLM has answered the kept ones
                self.greedy.add(h)
            todo.append(i)
            if self.by_context.setdefault(req.args[0], h) != h:
                self.by_context[req.args[0]] = None
        return kept, todo

    def hook(self, inner: Any) -> "SampledHook":
        return SampledHook(self, inner)

    def keep_early(self, context: str, res: Any) -> bool:
        """Keep the answer of a row that has just ended, before HFLM hands it over (only when
        its call returns: a whole call of answers was lost to a kill). ``context`` names the
        request; an answer whose context is ambiguous or unknown waits for ``keep``."""
        h = self.by_context.get(context)
        if h is None:
            return False
        if h in self.greedy:  # lm-eval's key: its hand-over after the call writes it again
            self._put(h, res)
            return True
        free = self.free.get(h)
        if not free:
            return False
        k = free.popleft()
        self._write(h, k, res)
        self.early[h][str(res)].append(k)
        return True

    def keep(self, req: Sequence[Any], res: Any) -> None:
        if not is_sampled(req[1]):
            return
        h = hash_args("generate_until", req)
        early = self.early.get(h)
        if early:  # kept as its row ended: the text handed over is that one, written once
            slots = early.get(str(res))
            same = bool(slots)
            if not same:  # made differently (never by the loop): the handed-over text wins
                LOGGER.warning("an answer kept as its row ended differs from lm-eval's text "
                               "of it; lm-eval's is kept")
                slots = next(iter(early.values()))
            k = slots.popleft()
            for text in [t for t, ks in early.items() if not ks]:
                del early[text]
            if not same:
                self._write(h, k, res)
            return
        free = self.free.get(h)
        if free:  # a request split() did not see (another caller) is not kept
            self._write(h, free.popleft(), res)

    def _write(self, h: str, k: int, res: Any) -> None:
        self._put(self.key(h, k), res)

    def _put(self, key: str, res: Any) -> None:
        self.store[key] = res
        commit = getattr(self.store, "commit", None)
        if commit is not None:
            commit()


class SampledHook:
    """A cache hook that stores sampled answers in ``SampledAnswers`` before passing every
    answer on to the hook it wraps (lm-eval's, which ignores sampled ones on reading)."""

    def __init__(self, answers: SampledAnswers, inner: Any) -> None:
        self.answers = answers
        self.inner = inner

    def add_partial(self, attr: str, req: Any, res: Any) -> None:
        if attr == "generate_until":
            self.answers.keep(req, res)
        self.inner.add_partial(attr, req, res)


class CallAnswers:
    """The answers of one ``generate_until`` call, in request order: those an interrupted run
    kept in lm-eval's ``--use_cache`` store (``SampledAnswers``), then each new one as its row
    ends (``keeper``) and as its generation call returns, handed to lm-eval's cache hook with
    its request (``add``). Without a store every request is generated and the hook is
    lm-eval's own."""

    def __init__(self, requests: Sequence[Any], store: MutableMapping[str, Any] | None,
                 cache_hook: Any) -> None:
        self.requests = requests
        self.store = SampledAnswers(store) if store is not None else None
        kept, self.todo = self.store.split(requests) if self.store else ({}, list(range(len(requests))))
        self.kept = len(kept)
        if kept:
            LOGGER.warning(
                "%d sampled answers come from the --use_cache file of an interrupted run; the "
                "other %d are drawn now. Together they are a valid sample at these settings, "
                "not the one an uninterrupted run with this seed would draw.", len(kept),
                sum(1 for i in self.todo if is_sampled(requests[i].args[1])))
        self.hand_over = self.store.hook(cache_hook) if self.store else cache_hook
        self.out: list[Any] = [kept.get(i) for i in range(len(requests))]

    def keeper(self, contexts: Sequence[str]) -> Callable[[int, Any], Any] | None:
        """``on_text(row, text)`` for a call over ``contexts``: keeps each answer as its row
        ends (None without a store)."""
        store = self.store
        return None if store is None else lambda row, text: store.keep_early(contexts[row], text)

    def add(self, indices: Sequence[int], texts: Sequence[Any]) -> None:
        for i, text in zip(indices, texts):
            self.out[i] = text
            self.hand_over.add_partial("generate_until", self.requests[i].args, text)
