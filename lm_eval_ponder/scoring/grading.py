"""Answer extraction and equivalence: the single place where a response becomes a grade.

GSM8K-style numeric tasks, MATH500, multiple choice and Best-of-N voting all go through here, so
"what counts as the same answer" is decided once. Symbolic comparison uses math-verify (its own
latex2sympy2_extended parser; ``sympy.parsing.latex`` fails in this environment) under a hard
time limit, because one pathological answer must never stall a whole run.

Time limit: math-verify's ``timeout_seconds``/``parsing_timeout`` use ``signal.alarm`` with whole
seconds (0.5 silently grades False), raise ``ValueError`` off the main thread, and their
``alarm(0)`` cancels any enclosing timer. So they are switched off, and ``_symbolic_equal_limited``
enforces the limit itself: with ``setitimer`` on the main thread, elsewhere through ``_Worker``,
a helper process that is killed when it overruns. A timeout grades False and never raises.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from fractions import Fraction
from typing import Any, Callable

logger = logging.getLogger(__name__)

KINDS = ("numeric", "math", "choice")
_MAX_DIGITS = 400  # longer "numbers" are garbage, and str(int) stops at 4300 digits anyway
_RETRY_S = 0.1  # the alarm re-fires at this period in case library code swallows it
_SPACING = r"(?<!\\)\\[!,;: ]"  # LaTeX thin spaces, but not the "\\ " of a matrix row break


def _balanced_end(s: str, open_idx: int) -> int | None:
    """Index of the brace closing ``s[open_idx]``; escaped braces (``\\{``) do not count."""
    depth, i = 0, open_idx
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return i
        i += 1
    return None


def _unwrap(s: str, commands: str) -> str:
    """Replace ``\\cmd{x}`` by ``x`` with balanced braces, which a regex cannot match."""
    pattern = re.compile(r"\\(?:%s)\s*\{" % commands)
    while (m := pattern.search(s)) is not None:
        end = _balanced_end(s, m.end() - 1)
        if end is None:
            return s[: m.start()] + s[m.end():]
        s = s[: m.start()] + s[m.end(): end] + s[end + 1:]
    return s


def extract_boxed(text: str) -> str | None:
    """The last box is the final answer; earlier ones are drafts. Truncated boxes give None."""
    if not isinstance(text, str):
        return None
    matches = list(re.finditer(r"\\(?:boxed|fbox)(?![a-zA-Z])", text))
    if not matches:
        return None
    rest = text[matches[-1].end():]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        start = len(rest) - len(stripped)
        end = _balanced_end(rest, start)
        content = rest[start + 1: end] if end is not None else ""
    else:
        token = re.match(r"[^\s$]+", stripped)
        content = token.group(0).rstrip(".") if token else ""
    return content.strip() or None


# Numbers ---------------------------------------------------------------------------------------

_SIGN = r"(?:(?<![\w)\]}])-)?"  # "5-3" holds a 3, not a -3
_NUMBER = _SIGN + r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<!\d)\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_FRACTION_RE = re.compile(rf"(?<![\d.,])({_NUMBER}) ?/ ?(\d+(?:\.\d+)?)")  # linear on digit runs
_ANSWER_PHRASE_RE = re.compile(r"(?i)\banswer[\s*]*(?:is\b|was\b|[:=])[\s*:]*")


def _clean_numeric_text(text: str) -> str:
    """Drop LaTeX spacing, currency and percent marks so that only the digits carry meaning."""
    text = re.sub(_SPACING, "", text.replace("\u2212", "-").replace("{,}", ","))
    text = re.sub(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*([\d.,]+)\s*\}", r"\1/\2", text)
    return re.sub(r"\\?[$%€£¥]|\\text\{|\\mathrm\{", "", text)


def _to_fraction(number: str) -> Fraction | None:
    """Plain decimals only: exponents or giant digit strings could stall ``Fraction``."""
    number = number.strip()
    plain = r"-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)"  # commas only as in 1,234,567
    if len(number) > _MAX_DIGITS or not re.fullmatch(plain, number):
        return None
    return Fraction(number.replace(",", ""))


def _format_number(value: Fraction) -> str:
    """Exact decimals print exactly ("0.75", "72"); others print 12 digits, stable for voting."""
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:
        try:
            return f"{float(value):.12g}"
        except OverflowError:
            return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    body = digits if places == 0 else f"{digits[:-places]}.{digits[-places:]}".rstrip("0")
    return ("-" if value < 0 else "") + body


def parse_number(text: str | None) -> Fraction | None:
    """A number or a simple fraction such as 3/4, after currency and LaTeX are cleaned away."""
    if text is None:
        return None
    text = _clean_numeric_text(str(text)).strip().rstrip(".")
    if (frac := re.fullmatch(r"(-?[\d.,]+)\s*/\s*([\d.,]+)", text)) is not None:
        num, den = _to_fraction(frac.group(1)), _to_fraction(frac.group(2))
        return num / den if num is not None and den else None
    return _to_fraction(text)


def _first_number(segment: str) -> str | None:
    """First number of a short answer segment; a fraction such as 3/4 counts as one number."""
    segment = _clean_numeric_text(segment)
    number, fraction = _NUMBER_RE.search(segment), _FRACTION_RE.search(segment)
    if fraction and (number is None or fraction.start() <= number.start()):
        value = parse_number(f"{fraction.group(1)}/{fraction.group(2)}")
    else:
        value = _to_fraction(number.group(0)) if number else None
    return _format_number(value) if value is not None else None


def extract_numeric(text: str) -> str | None:
    """Gold marker, answer phrase, box, last number: from most to least deliberate."""
    if not isinstance(text, str) or not text.strip():
        return None
    if "####" in text and (found := _first_number(text.rsplit("####", 1)[1][:200].split("\n")[0])):
        return found
    for phrase in reversed(list(_ANSWER_PHRASE_RE.finditer(text))):
        if found := _first_number(text[phrase.end(): phrase.end() + 200].split("\n")[0]):
            return found
    boxed = extract_boxed(text)
    if boxed is not None and (found := _first_number(boxed)):
        return found
    numbers = _NUMBER_RE.findall(_clean_numeric_text(text))
    value = _to_fraction(numbers[-1]) if numbers else None
    return _format_number(value) if value is not None else None


def numeric_equal(pred: str | None, gold: str | None, rel_tol: float = 1e-6) -> bool:
    """Integers compare exactly (a tolerance would take 1000001 for 1000000); others relatively."""
    a, b = parse_number(pred), parse_number(gold)
    if a is None or b is None:
        return False
    if a == b or (a.denominator == 1 and b.denominator == 1):
        return a == b
    return abs(a - b) <= Fraction(str(rel_tol)) * max(abs(a), abs(b))


# LaTeX (MATH500) -------------------------------------------------------------------------------

_ASSIGNMENT_RE = re.compile(r"([a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+)=([^=]+)")
_UNIT = r"(?<=[\d}])\s*\\(?:text|mbox|mathrm)\{\s*[a-zA-Z][a-zA-Z\s.]*\}(?:\^\{?\d\}?)?\s*$"


def _normalize_math(s: str) -> str:
    """Remove presentation-only differences so that most equal answers match as plain strings."""
    s = re.sub(r"\s+", " ", s).strip().replace("\u2212", "-").replace("{,}", ",")
    s = re.sub(r"\\(?:left|right)\.", "", s)
    s = re.sub(r"\\(?:left|right|displaystyle|q?quad)(?![a-zA-Z])|~|" + _SPACING, "", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s).replace("\\$", "").replace("$", "")
    s = re.sub(_UNIT, "", s)  # "5\text{ cm}" -> "5"
    s = re.sub(r"\^\s*\{?\\circ\}?|\\circ(?![a-zA-Z])|\u00b0", "", s)
    s = _unwrap(s, "text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname")
    s = re.sub(r"(?i)\s*\b(?:degrees?|percent)\b|\\?%", "", s)
    s = re.sub(r"(?<![a-zA-Z]) | (?![a-zA-Z])", "", s)  # keep "\pi r" apart, join the rest
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):  # 10,080 -> 10080
        s = s.replace(",", "")
    s = re.sub(r"\\sqrt(?![a-zA-Z{\[])\s*(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac([^{\\\s])([^{\\\s])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac([^{\\\s])(?=\{)", r"\\frac{\1}", s)
    s = re.sub(r"\\frac(\{[^{}]*\})([^{\\\s])", r"\\frac\1{\2}", s)
    s = re.sub(r"^(-?\d+)/(\d+)$", r"\\frac{\1}{\2}", s)
    s = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", s)
    s = s if s.endswith("..") else s.rstrip(".")
    return re.sub(r"^\(([A-Za-z])\)$", r"\1", s).strip()  # "(C)" -> "C"


def _strip_assignment(s: str) -> str:
    m = _ASSIGNMENT_RE.fullmatch(s)
    return m.group(2) if m else s


def _latex_number(s: str) -> Fraction | None:
    """Plain numbers and integer fractions are decided without sympy: faster and unambiguous."""
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m is None:
        return _to_fraction(s) if "," not in s and not s.endswith(".") else None
    if int(m.group(3)) == 0 or len(s) > _MAX_DIGITS:
        return None
    return Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1)


def math_equal(pred: str | None, gold: str | None, timeout: float = 5.0) -> bool:
    """Cheap string and number checks first, so sympy (slow, sometimes pathological) runs rarely."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    p, g = _normalize_math(pred), _normalize_math(gold)
    if not p or not g:
        return False
    if bool(_ASSIGNMENT_RE.fullmatch(p)) != bool(_ASSIGNMENT_RE.fullmatch(g)):
        p, g = _strip_assignment(p), _strip_assignment(g)  # "x=5" vs "5": the name adds nothing
    if p == g:
        return True
    pn, gn = _latex_number(p), _latex_number(g)
    if pn is not None and gn is not None:  # a rounded decimal (0.333333 for 1/3) may match
        return pn == gn or ("." in p + g and abs(pn - gn) <= Fraction(1, 10**6) * abs(gn))
    return _symbolic_equal_limited(p, g, float(timeout))


@functools.lru_cache(maxsize=1)
def _math_verify() -> Any:
    """Imported lazily (about a second) and outside any time limit, so no alarm hits an import."""
    import math_verify

    class _DropOwnTimeoutWarning(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.getMessage().startswith("Timeout is disabled")

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropOwnTimeoutWarning())
    return math_verify


def _symbolic_equal(pred: str, gold: str) -> bool:
    """Unbounded math-verify comparison; only ever called under a time limit."""
    mv = _math_verify()
    gold_parsed = mv.parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = mv.parse(f"${pred}$", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(mv.verify(gold_parsed, pred_parsed, timeout_seconds=None))


class _Deadline(BaseException):
    """BaseException so that library code's ``except Exception`` cannot swallow the alarm."""


@functools.lru_cache(maxsize=8192)
def _symbolic_equal_limited(pred: str, gold: str, timeout: float) -> bool:
    """Cached because Best-of-N grades the same answers many times. Signals only work on the main
    thread; elsewhere the comparison goes to a helper process that can be killed."""
    if timeout <= 0:
        return False
    on_main = threading.current_thread() is threading.main_thread()
    if on_main and hasattr(signal, "setitimer") and signal.getsignal(signal.SIGALRM) is not None:
        _math_verify()
        return _run_with_alarm(_symbolic_equal, (pred, gold), timeout)
    return _WORKER.compare(pred, gold, timeout)


def _run_with_alarm(fn: Callable[..., bool], args: tuple, timeout: float) -> bool:
    """SIGALRM interrupts even long big-integer arithmetic; the caller's own timer is restored."""
    armed = [True]

    def on_alarm(signum: int, frame: Any) -> None:
        if armed[0]:
            raise _Deadline()

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.getitimer(signal.ITIMER_REAL)
    started, result = time.monotonic(), False
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout, _RETRY_S)
        result = bool(fn(*args))
    except _Deadline:
        logger.warning("symbolic comparison exceeded %.1fs; graded as not equal", timeout)
    except Exception:  # noqa: BLE001 - a parser failure simply means "not shown equal"
        logger.debug("symbolic comparison failed", exc_info=True)
    finally:
        while True:  # a late alarm may land inside this cleanup: retry until disarmed
            try:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                break
            except _Deadline:
                continue
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            left = max(old_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)
    return result


class _Worker:
    """Helper process for comparisons off the main thread, killed when it overruns. A fresh
    interpreter that loads this very file by path: multiprocessing would re-run the caller's
    ``__main__`` script in each child, and ``fork`` would copy a process that holds a model and
    other threads' locks. Starts once (1-2 s, not charged to the timeout) and again only after
    a kill. Threads take turns, so a waiting thread can wait longer than its own timeout."""

    _BOOT = (
        "import importlib.util as u, sys; s = u.spec_from_file_location('_grading_worker', "
        "sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m); m._worker_loop()"
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.buffer = b""

    def _readline(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def compare(self, pred: str, gold: str, timeout: float) -> bool:
        with self.lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self.buffer = b""
                    self.proc = subprocess.Popen(
                        [sys.executable, "-c", self._BOOT, __file__],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                    )
                    if self._readline(120.0) != b"ready":
                        raise RuntimeError("grading worker did not start")
                request = {"pred": pred, "gold": gold, "timeout": timeout}
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                reply = self._readline(timeout + 1.0)  # the worker enforces timeout itself
                if reply is not None:
                    return reply == b"1"
                logger.warning("symbolic comparison exceeded %.1fs; graded as not equal", timeout)
            except Exception:  # noqa: BLE001 - no helper process possible: grade as not equal
                logger.warning("symbolic comparison worker failed", exc_info=True)
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
            return False


_WORKER = _Worker()


def _worker_loop() -> None:
    """Helper process main: one JSON request per line in, one 0/1 per line out. Whatever a
    library prints goes to stderr, so it cannot corrupt the replies."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _math_verify()
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        equal = _symbolic_equal_limited(request["pred"], request["gold"], request["timeout"])
        replies.write("1\n" if equal else "0\n")
        replies.flush()


# Multiple choice -------------------------------------------------------------------------------

# Each filler character can be consumed in exactly one way: adjacent optional "\s*" groups would
# backtrack exponentially on a long run of spaces (degenerate generations do produce those).
_CHOICE_PHRASE_RE = re.compile(
    r"(?i:\b(?:final\s+answer|answer|(?:correct|right|best)\s+(?:answer|option|choice)))"
    r"[\s*]*(?:(?i:is|was|would\s+be|should\s+be|will\s+be)\b|[:=])"
    r"(?:[\s*:$(\[]|\\boxed\{|\\text(?:bf)?\{|(?i:option|choice)\b)*"
    r"([A-D])(?![A-Za-z0-9_'])"  # upper case only: "the answer is a bit..." names no option
)
_CHOICE_CLAIM_RE = re.compile(
    r"(?<![A-Za-z0-9])\(?([A-D])\)?\s+(?i:is\s+(?:the\s+)?(?:correct|right|best)\b)"
)


def _bare_letter(s: str) -> str | None:
    """A string that is nothing but a choice letter, however wrapped, names that choice."""
    s = _unwrap(s, "text|textbf|mathrm|mathbf").strip().strip("*$ ").rstrip(".:").strip()
    m = re.fullmatch(r"[(\[]?\s*([A-Da-d])\s*[)\]]?", s)
    return m.group(1).upper() if m else None


def extract_choice(text: str) -> str | None:
    """Explicit answer statements win (the last one); stray letters only as a last resort."""
    if not isinstance(text, str) or not text.strip():
        return None
    found = [(m.start(1), m.group(1)) for m in _CHOICE_PHRASE_RE.finditer(text)]
    found += [(m.start(1), m.group(1)) for m in _CHOICE_CLAIM_RE.finditer(text)]
    boxed = extract_boxed(text)
    if boxed is not None and (letter := _bare_letter(boxed)) is not None:
        found.append((text.rfind("\\boxed"), letter))
    if found:
        return max(found)[1]
    if (letter := _bare_letter(text)) is not None:
        return letter
    if (end := re.search(r"(?<![A-Za-z0-9])\(?([A-D])\)[\s.*]*$", text)) is not None:
        return end.group(1)
    parenthesised = re.findall(r"\(([A-D])\)", text)
    return parenthesised[-1] if parenthesised else None


# Grading API -----------------------------------------------------------------------------------


def _extract_math(response: str, is_gold: bool = False) -> str | None:
    """A box is the instructed format, then an answer phrase; a short bare string is an answer."""
    boxed = extract_boxed(response)
    if boxed is not None or is_gold:
        return boxed if boxed is not None else (response.strip() or None)
    for phrase in reversed(list(_ANSWER_PHRASE_RE.finditer(response))):
        segment = response[phrase.end(): phrase.end() + 500].lstrip()
        inline = re.match(r"\$+([^$]+)\$", segment)
        answer = inline.group(1) if inline else re.split(r"\.\s|\.$|\n", segment)[0]
        if answer.strip(" *."):
            return answer.strip(" *")
    bare = response.strip().strip("$").strip()
    return bare if bare and len(bare) <= 64 and "\n" not in bare else None


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown grading kind {kind!r}; expected one of {', '.join(KINDS)}")


def _extract(kind: str, response: str) -> str | None:
    if not isinstance(response, str):
        return None
    if kind == "numeric":
        return extract_numeric(response)
    return _extract_math(response) if kind == "math" else extract_choice(response)


def grade(kind: str, response: str, gold: str) -> tuple[bool, str | None]:
    """Never raises on model output: one odd response must not lose a whole evaluation run."""
    _check_kind(kind)
    pred = None
    try:
        pred = _extract(kind, response)
        gold = gold if isinstance(gold, str) else "" if gold is None else str(gold)
        if pred is None:
            return False, None
        if kind == "numeric":
            return numeric_equal(pred, extract_numeric(gold)), pred
        if kind == "math":
            return math_equal(pred, _extract_math(gold, is_gold=True)), pred
        return pred == (_bare_letter(gold) or extract_choice(gold)), pred
    except Exception:  # noqa: BLE001 - defensive: log and grade as wrong
        logger.warning("grading failed for kind=%s", kind, exc_info=True)
    return False, pred


def canonical_answer(kind: str, response: str) -> str | None:
    """One cheap string per equivalence class, so that votes can simply be counted."""
    _check_kind(kind)
    answer = _extract(kind, response)
    if answer is None or kind != "math":
        return answer
    normalized = _strip_assignment(_normalize_math(answer))
    number = _latex_number(normalized)
    return _format_number(number) if number is not None else (normalized or None)


def majority_vote(kind: str, responses: list[str]) -> str | None:
    """Self-consistency vote; ties go to the earliest answer so that results are deterministic."""
    _check_kind(kind)
    answers = [canonical_answer(kind, r) for r in responses]
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)
