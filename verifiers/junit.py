"""Parse JUnit XML (pytest --junitxml, Maven Surefire, Gradle, go-junit-report, ...).

XML is parsed with `defusedxml` and any DTD is refused, so entity expansion (billion laughs),
external entities and external DTDs are impossible: such documents raise `ReportParseError`.

Guarantees: returns a `junit` report with one assertion per `<testcase>`, in document order
(documents in the order given), or raises `ReportParseError`; nothing else for str/bytes input.
"""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

from collections.abc import Sequence
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from .report import Assertion, AssertionReport, ReportParseError

_ROOT_TAGS = ("testsuites", "testsuite")


def parse_junit(texts: Sequence[str | bytes], source: str = "") -> AssertionReport:
    """Parse and aggregate one or more JUnit XML documents, in the given order.

    Each document's root must be `<testsuites>` or `<testsuite>`; suites may nest to any depth.
    A `<testcase>` with a `<failure>` or `<error>` child is failed (message: the child's
    `message` attribute, else its text), one with a `<skipped>` child is skipped, any other
    is passed. The name is `classname::name` when `classname` is present, else `name`.
    A document may be given as bytes, in which case its XML encoding declaration is honoured.
    Raises ReportParseError for an empty sequence or any malformed or unsafe document.
    """
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    if len(texts) == 0:
        raise ReportParseError("no JUnit documents given")
    assertions: list[Assertion] = []
    for index, text in enumerate(texts):
        root = _parse_document(text, index if len(texts) > 1 else None)
        assertions.extend(_testcase(case) for case in root.iter("testcase"))
    return AssertionReport(format="junit", assertions=tuple(assertions), binary=False, source=source)


def _parse_document(text: str | bytes, index: int | None) -> Element:
    where = "" if index is None else f"document {index}: "
    if not isinstance(text, (str, bytes)):
        raise ReportParseError(f"{where}expected text, got {type(text).__name__}")
    try:
        root = fromstring(text, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException as exc:
        raise ReportParseError(f"{where}unsafe XML refused: {type(exc).__name__}") from None
    except ParseError as exc:
        raise ReportParseError(f"{where}invalid XML: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ReportParseError(f"{where}invalid XML: {exc}") from None
    if root.tag not in _ROOT_TAGS:
        raise ReportParseError(f"{where}root element is <{root.tag}>, expected <testsuites> or <testsuite>")
    return root


def _testcase(case: Element) -> Assertion:
    name = case.get("name") or ""
    classname = case.get("classname")
    if classname:
        name = f"{classname}::{name}"
    for child in case:
        if child.tag in ("failure", "error"):
            return Assertion(name=name, status="failed", message=_message(child))
    for child in case:
        if child.tag == "skipped":
            return Assertion(name=name, status="skipped", message=_message(child))
    return Assertion(name=name, status="passed")


def _message(element: Element) -> str:
    message = element.get("message")
    if message:
        return message
    return (element.text or "").strip()
