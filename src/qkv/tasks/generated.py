"""Generated string-to-string tasks: copy, reverse, sort, addition, dates.

Each draws ``(source, target)`` pairs from a seeded ``random.Random`` (so a batch is a pure
function of ``(seed, split, step, rank)``), assigns a pair to train/valid/test by a hash of its
source (80/10/10, so the splits never share a source) and is scored by exact match of the greedy
output and teacher-forced token accuracy (:class:`qkv.tasks.base.Seq2SeqTask`).
"""

from __future__ import annotations

import datetime
import random
import string
from typing import Callable, List, Tuple

from qkv.registry import register
from qkv.tasks.base import GeneratedSeq2SeqTask
from qkv.tasks.vocab import CharVocab

__all__ = ["ALPHABETS", "CopyTask", "ReverseTask", "SortTask", "AdditionTask", "DatesTask", "DATE_FORMATS"]

#: Named alphabets for the string tasks; any other str of two or more distinct characters works too.
ALPHABETS = {
    "digits": string.digits,
    "letters": string.ascii_lowercase,
    "alnum": string.digits + string.ascii_lowercase,
}


def _check_lengths(min_len: int, max_len: int) -> None:
    for name, value in (("min_len", min_len), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if min_len < 1:
        raise ValueError(f"min_len must be >= 1, got {min_len}")
    if max_len < min_len:
        raise ValueError(f"max_len must be >= min_len = {min_len}, got {max_len}")


def _resolve_alphabet(alphabet: str) -> str:
    if not isinstance(alphabet, str):
        raise TypeError(f"alphabet must be a str, got {type(alphabet).__name__}")
    symbols = ALPHABETS.get(alphabet, alphabet)
    if len(set(symbols)) < 2 or len(set(symbols)) != len(symbols):
        raise ValueError(
            f"alphabet must be one of {sorted(ALPHABETS)} or a string of 2+ distinct characters, got {alphabet!r}"
        )
    return symbols


class _StringTask(GeneratedSeq2SeqTask):
    """A random string of ``min_len..max_len`` symbols mapped by :meth:`transform`."""

    def __init__(self, *, min_len: int = 1, max_len: int = 10, alphabet: str = "digits", eval_size: int = 1000) -> None:
        super().__init__(eval_size=eval_size)
        _check_lengths(min_len, max_len)
        self.min_len, self.max_len = min_len, max_len
        self.alphabet = _resolve_alphabet(alphabet)
        self.vocab = CharVocab(self.alphabet)

    def transform(self, source: str) -> str:
        raise NotImplementedError  # abstract: subclasses implement it

    @property
    def max_target_len(self) -> int:
        """A target is as long as its source: at most ``max_len`` symbols."""
        return self.max_len

    def sample(self, rng: random.Random) -> Tuple[str, str]:
        length = rng.randint(self.min_len, self.max_len)
        source = "".join(rng.choice(self.alphabet) for _ in range(length))
        return source, self.transform(source)


@register("task", "copy")
class CopyTask(_StringTask):
    """Copy a random string: ``"a7k2" -> "a7k2"``.

    Args:
        min_len, max_len: source length range (inclusive).
        alphabet: ``"digits"``, ``"letters"``, ``"alnum"`` or a literal string of symbols.
        eval_size: size of each fixed held-out set.
    """

    def transform(self, source: str) -> str:
        return source


@register("task", "reverse")
class ReverseTask(_StringTask):
    """Reverse a random string: ``"a7k2" -> "2k7a"``.

    Args:
        min_len, max_len: source length range (inclusive).
        alphabet: ``"digits"``, ``"letters"``, ``"alnum"`` or a literal string of symbols.
        eval_size: size of each fixed held-out set.
    """

    def transform(self, source: str) -> str:
        return source[::-1]


@register("task", "sort")
class SortTask(_StringTask):
    """Sort the symbols of a random string: ``"3141" -> "1134"`` (order of ``alphabet``).

    Args:
        min_len, max_len: source length range (inclusive).
        alphabet: ``"digits"``, ``"letters"``, ``"alnum"`` or a literal string of symbols.
        eval_size: size of each fixed held-out set.
    """

    def transform(self, source: str) -> str:
        rank = {c: i for i, c in enumerate(self.alphabet)}
        return "".join(sorted(source, key=rank.__getitem__))


@register("task", "addition")
class AdditionTask(GeneratedSeq2SeqTask):
    """Add two decimal numbers: ``"123+45" -> "168"``.

    Args:
        min_len, max_len: digit count range of each operand (no leading zeros).
        eval_size: size of each fixed held-out set.
    """

    def __init__(self, *, min_len: int = 1, max_len: int = 5, eval_size: int = 1000) -> None:
        super().__init__(eval_size=eval_size)
        _check_lengths(min_len, max_len)
        self.min_len, self.max_len = min_len, max_len
        self.vocab = CharVocab(string.digits + "+")

    @property
    def max_target_len(self) -> int:
        """The sum of two ``max_len``-digit numbers has at most ``max_len + 1`` digits."""
        return self.max_len + 1

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_len, self.max_len)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def sample(self, rng: random.Random) -> Tuple[str, str]:
        a, b = self._operand(rng), self._operand(rng)
        return f"{a}+{b}", str(a + b)


# --------------------------------------------------------------------------- dates

_MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _parts(d: datetime.date) -> dict:
    month = _MONTHS[d.month - 1]
    weekday = _WEEKDAYS[d.weekday()]
    return {"Y": d.year, "M": month, "Mon": month[:3], "mm": f"{d.month:02d}", "d": d.day,
            "dd": f"{d.day:02d}", "W": weekday, "Wd": weekday[:3], "th": _ordinal(d.day)}


#: The human formats (English month and weekday names, written by hand so no locale applies).
#: Day-first and month-first numeric forms use different separators, so every source is
#: unambiguous.
DATE_FORMATS: List[Tuple[str, Callable[[dict], str]]] = [
    ("March 14, 1987", lambda p: f"{p['M']} {p['d']}, {p['Y']}"),
    ("Mar 14, 1987", lambda p: f"{p['Mon']} {p['d']}, {p['Y']}"),
    ("14 March 1987", lambda p: f"{p['d']} {p['M']} {p['Y']}"),
    ("14 Mar 1987", lambda p: f"{p['d']} {p['Mon']} {p['Y']}"),
    ("14-Mar-1987", lambda p: f"{p['dd']}-{p['Mon']}-{p['Y']}"),
    ("14.03.1987", lambda p: f"{p['dd']}.{p['mm']}.{p['Y']}"),
    ("03/14/1987", lambda p: f"{p['mm']}/{p['dd']}/{p['Y']}"),
    ("19870314", lambda p: f"{p['Y']}{p['mm']}{p['dd']}"),
    ("Saturday, March 14, 1987", lambda p: f"{p['W']}, {p['M']} {p['d']}, {p['Y']}"),
    ("Sat 14 Mar 1987", lambda p: f"{p['Wd']} {p['d']} {p['Mon']} {p['Y']}"),
    ("the 14th of March, 1987", lambda p: f"the {p['th']} of {p['M']}, {p['Y']}"),
    ("March 14th, 1987", lambda p: f"{p['M']} {p['th']}, {p['Y']}"),
    ("march 14 1987", lambda p: f"{p['M'].lower()} {p['d']} {p['Y']}"),
    ("14 MAR 1987", lambda p: f"{p['d']} {p['Mon'].upper()} {p['Y']}"),
]


@register("task", "dates")
class DatesTask(GeneratedSeq2SeqTask):
    """Normalise a human-written date to ISO 8601: ``"the 14th of March, 1987" -> "1987-03-14"``.

    A uniform date in ``[min_year-01-01, max_year-12-31]`` is written in one of
    :data:`DATE_FORMATS` (14 formats: month names, abbreviations, ordinals, numeric forms).

    Args:
        min_year, max_year: year range (inclusive), 1-9999.
        eval_size: size of each fixed held-out set.
    """

    def __init__(self, *, min_year: int = 1900, max_year: int = 2099, eval_size: int = 1000) -> None:
        super().__init__(eval_size=eval_size)
        for name, value in (("min_year", min_year), ("max_year", max_year)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= min_year <= max_year <= 9999:
            raise ValueError(f"need 1 <= min_year <= max_year <= 9999, got min_year={min_year}, max_year={max_year}")
        self.min_year, self.max_year = min_year, max_year
        self._first = datetime.date(min_year, 1, 1).toordinal()
        self._last = datetime.date(max_year, 12, 31).toordinal()
        names = "".join(_MONTHS + _WEEKDAYS)
        self.vocab = CharVocab(names + names.lower() + names.upper() + string.digits + " ,./-" + "thstndrdof")

    #: ``YYYY-MM-DD`` (``date.isoformat`` writes every year 1-9999 with four digits).
    max_target_len = 10

    def sample(self, rng: random.Random) -> Tuple[str, str]:
        d = datetime.date.fromordinal(rng.randint(self._first, self._last))
        _, render = rng.choice(DATE_FORMATS)
        return render(_parts(d)), d.isoformat()
