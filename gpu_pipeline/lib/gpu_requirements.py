"""Which device class a job can use, read from its ClassAd requirements (DESIGN 5.6).

An HTCondor job names the GPUs it can use in ``RequireGPUs`` (``require_gpus``: a constraint on each
GPU's properties, e.g. ``DeviceName == "NVIDIA A100-SXM4-80GB"`` or ``regexp("A100", DeviceName)``)
or, in older pools, in ``Requirements`` (a test on the machine's ``GPUs_DeviceName`` or
``CUDADeviceName``). :func:`device_class_of` evaluates each part of them joined by ``&&`` at the top
level (a text with ``||`` or a conditional at its top level is one part) with the ClassAd library,
against each device model of the window's pool and against a name no pool has, one at a time, every
attribute but the device's name undefined -- ``DeviceName`` for RequireGPUs (a GPU's property ad),
``GPUs_DeviceName`` and ``CUDADeviceName`` for Requirements (the machine ad):

* a part decides the device when it is **false** for some of these names and not for all
  (``DeviceName == "Tesla T4"``, ``regexp("A100", DeviceName)``, ``DeviceName != "Tesla T4"``); it then
  excludes the models it is false for. A part false for every name (``HAS_SINGULARITY is true``: ``is``
  reads an undefined attribute as not true) or for none (``Capability >= 8.0``, ``TARGET.Memory >=
  RequestMemory``: undefined) decides nothing -- which is why the parts are read one by one;
* one model left: the job's class is that model;
* none excluded, or several left (``regexp("A100", DeviceName)`` in a pool of two A100 models), or none
  left: ``ANY``, counted in the pool's ``ALL`` row only -- a class is one device model here. A job that
  names a model the window's pool does not have is ``ANY`` too: its test is false for every name.

A Requirements text condor_adstash cut (longer than 256 characters: its first 253 and ``...``) that
starts as condor_submit writes one, ``(the user's requirements) && ...``, is read by its complete
parts joined by ``&&`` at the top level before the cut, as that conjunction; a cut text with ``||``
or a conditional at its top level, another cut Requirements, and a cut RequireGPUs (the user's own
text, whose rest may be an alternative) say nothing.

A requirement that names a device attribute but that the ClassAd parser cannot read raises
:class:`UnreadableExpression` (the caller counts it and reads the job as ``ANY``); one that names no
device attribute is ``ANY`` without being parsed: with every other attribute undefined its value
cannot depend on the device.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import classad2

ANY_DEVICE = "ANY"
#: A device name no pool has, evaluated beside the pool's.
_NO_SUCH_DEVICE = "gpu_pipeline: a device name no pool has"  # printable: ClassAd strings end at a NUL
#: The attribute a GPU's name goes by in its property ad, which RequireGPUs is evaluated against.
GPU_NAME_ATTRS = ("DeviceName",)
#: ... and in the machine ad, which Requirements is evaluated against: of a pool with GPU discovery
#: (``GPUs_DeviceName``) and of older pools (``CUDADeviceName``).
MACHINE_NAME_ATTRS = ("GPUs_DeviceName", "CUDADeviceName")
DEVICE_WORD = "devicename"  # in each of them (ClassAd attribute names are case-insensitive)


class UnreadableExpression(ValueError):
    """A requirement the ClassAd parser cannot read."""


@lru_cache(maxsize=1 << 12)
def _expr(text: str) -> classad2.ExprTree:
    try:
        return classad2.ExprTree(text)
    except Exception as exc:  # classad2.ClassAdException (the library's only parse error)
        raise UnreadableExpression(f"unreadable ClassAd expression {text[:120]!r}: {exc}") from None


def _scan(text: str) -> tuple[list[tuple[int, str]], int] | None:
    """The operator characters of ``text`` outside parentheses and string literals, with their
    positions: ``&`` and ``|`` of ``&&`` / ``||``, ``?`` of the conditional (not of ``=?=``), and ``)``
    where a parenthesis opened at the start closes; and the parentheses still open at the end. None
    when a parenthesis closes that did not open."""
    out, depth, i, n = [], 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':  # a string literal, with backslash escapes
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return None
            if depth == 0:
                out.append((i, ")"))
        elif depth == 0 and ch in "&|" and text.startswith(ch * 2, i):
            out.append((i, ch))
            i += 1
        elif depth == 0 and ch == "?" and not (text[i - 1:i] == "=" and text[i + 1:i + 2] == "="):
            out.append((i, "?"))
        i += 1
    return out, depth


def _top_level(text: str) -> list[tuple[int, str]] | None:
    """:func:`_scan`'s operators of a text whose parentheses balance, else None."""
    scanned = _scan(text)
    return scanned[0] if scanned is not None and scanned[1] == 0 else None


def _conjuncts(text: str) -> list[str]:
    """The parts of ``text`` joined by ``&&`` at its top level (outside parentheses and string
    literals), a part in parentheses split again: ``(A && (B)) && C`` -> ``A``, ``B``, ``C``. A text
    with ``||`` or a conditional at its top level is one part (``A && B || C`` is ``(A && B) || C``,
    whose parts are not ``A`` and ``B || C``), as is an unbalanced one (the parser then reads or refuses
    it whole)."""
    text = text.strip()
    ops = _top_level(text)
    if ops is None or any(op in "|?" for _, op in ops):
        return [text]
    if text.startswith("(") and ops and ops[0] == (len(text) - 1, ")"):  # (...) around the whole
        inner = text[1:-1]
        return _conjuncts(inner) if inner.strip() else [text]
    cuts = [i for i, op in ops if op == "&"]
    if not cuts:
        return [text]
    bounds = zip([0, *(i + 2 for i in cuts)], [*cuts, len(text)], strict=True)
    return [part for lo, hi in bounds for part in _conjuncts(text[lo:hi])]


#: condor_adstash cuts a string longer than 256 characters to its first 253 and this (a GPU job's
#: Requirements often is longer).
ADSTASH_CUT = "..."


def _cut_prefix(text: str) -> str | None:
    """The complete top-level parts of a text adstash cut: the text before the last ``&&`` at its top
    level (outside parentheses and string literals) ahead of the cut, taken as a conjunction, as
    condor_submit writes Requirements (``(the user's) && (TARGET.Arch == ...) && ...``); None when
    there is no such part, or the text has ``||`` or a conditional at its top level before the cut."""
    body = text[:-len(ADSTASH_CUT)]
    scanned = _scan(body)  # the parentheses of a cut text may still be open
    if scanned is None or any(op in "|?" for _, op in scanned[0]):
        return None
    cuts = [i for i, op in scanned[0] if op == "&"]
    return (body[:cuts[-1]].strip() or None) if cuts else None


def _false_for(text: str, device: str, attrs: tuple[str, ...]) -> bool:
    """Whether the expression is false for a GPU named ``device`` under the attribute names ``attrs``
    (every other attribute undefined). The names are in MY, where unscoped references resolve, and
    in TARGET, each its own ad: the library resolves neither scope when both are one object."""
    named = {attr: device for attr in attrs}
    return _expr(text).eval(classad2.ClassAd(named), classad2.ClassAd(named)) is False


@lru_cache(maxsize=1 << 14)
def _false_per_name(text: str, names: tuple[str, ...], attrs: tuple[str, ...]) -> tuple[bool, ...]:
    """:func:`_false_for` of each of ``names`` and of a name no pool has (a pool's jobs repeat the same
    device tests in otherwise different requirements: each is evaluated once)."""
    return tuple(_false_for(text, d, attrs) for d in (*names, _NO_SUCH_DEVICE))


def device_class_of(require_gpus: str | None, requirements: str | None, devices: Iterable[str]) -> str:
    """The device class of a job with these requirement expressions (text, either may be None) among
    the device models ``devices`` (see the module's rules). Raises :class:`UnreadableExpression`."""
    # with every other attribute undefined, only a text that names a device attribute can depend on
    # the device: the others are not parsed or evaluated at all (most Requirements of a pool)
    texts = []
    for text, attrs in ((require_gpus, GPU_NAME_ATTRS), (requirements, MACHINE_NAME_ATTRS)):
        if text is not None and text.rstrip().endswith(ADSTASH_CUT):
            # a text adstash cut: a Requirements as condor_submit writes it ("(the user's) && ..."), by
            # its complete parts before the cut; a cut RequireGPUs (the user's own text) says nothing
            cut = attrs == MACHINE_NAME_ATTRS and text.lstrip().startswith("(")
            text = _cut_prefix(text) if cut else None
        if text is not None and DEVICE_WORD in text.lower():
            texts.append((text, attrs))
    if not texts:
        return ANY_DEVICE
    for text, _ in texts:
        _expr(text)  # the whole must parse
    names = tuple(dict.fromkeys(devices))
    kept, decided = set(names), False
    for text, attrs in texts:
        for part in _conjuncts(text):
            if DEVICE_WORD not in part.lower():
                continue
            try:
                false = _false_per_name(part, names, attrs)
            except UnreadableExpression:  # a part the splitter cut wrongly: read the whole instead
                false = _false_per_name(text, names, attrs)
            if any(false) and not all(false):  # the device name decides this part
                decided = True
                kept -= {d for d, out in zip(names, false, strict=False) if out}
    return next(iter(kept)) if decided and len(kept) == 1 else ANY_DEVICE


def expression_text(value: object) -> str | None:
    """The ClassAd expression a job document holds for an attribute, as text: ``"/Expr(X)/"`` (how
    ``condor_q -json`` and ``condor_history -json`` write an expression) is ``X``; a string as it is (how
    condor_adstash keeps an expression it does not evaluate); a boolean or number as its ClassAd
    literal; None for none, an empty string or ``undefined``. Other values raise ``ValueError``."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if not isinstance(value, str):
        raise ValueError(f"{type(value).__name__} is not a ClassAd expression")
    text = value.strip()
    if text.startswith("/Expr(") and text.endswith(")/"):
        text = text[len("/Expr("):-len(")/")].strip()
    return None if not text or text.lower() in ("undefined", "null", "none") else text
