"""What leaves the process: no secret, whatever message carries it; no control character; and the
job log, one line per event, as text or as JSON (`configure_logging`).

Two nets: the known secret values (the settings' keys and tokens, configured once by the CLI, in
every form a library may print them: as is, stripped, `repr`-escaped, JSON-escaped, base64, and
the Langfuse key pair as HTTP Basic sends it) and patterns
that look like credentials whatever their origin (a bearer token, an OpenAI or Langfuse key, an
`api_key=` pair). Applied to every line the job logs, every reason it lists or reports, and every
error it prints.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MASK = "***"
MIN_SECRET = 4  # shorter values would mask ordinary words

_PATTERNS = [
    # "Bearer <token>" / "Basic <b64>", also inside a repr'd header value
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}"),
    # OpenAI-style and Langfuse keys
    re.compile(r"\b(?:sk|pk|rk)-(?:lf-|proj-|ant-)?[A-Za-z0-9_\-]{8,}"),
    # key=value and "key": "value" pairs whose key names a credential
    re.compile(
        r"(?i)([\"']?\b(?:api[_-]?key|secret[_-]?key|access[_-]?token|auth[_-]?token|token|password|secret)"
        r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]{6,}"
    ),
]


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            for value in (secret, secret.strip()):
                if len(value) < MIN_SECRET:
                    continue
                forms.add(value)
                forms.add(repr(value)[1:-1])  # "tok\n" printed inside a repr: tok\\n
                forms.add(json.dumps(value)[1:-1])
                forms.add(repr(value.encode())[2:-1])  # inside a bytes repr: b'Bearer tok\n'
                # base64, as a proxy echoes an Authorization: Basic header (pk:sk) or a library
                # prints a key it encoded: padded and not, standard and URL-safe alphabets
                for encoded in (base64.b64encode(value.encode()), base64.urlsafe_b64encode(value.encode())):
                    text = encoded.decode()
                    forms.update({text, text.rstrip("=")})
        # longest first, so a value is masked whole before any shorter form inside it
        self.values = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        for pattern in _PATTERNS:
            text = pattern.sub(_mask_match, text)
        return text


def _mask_match(match: re.Match[str]) -> str:
    # keep the label ("Bearer", "api_key=") so the message still says what was there
    if match.re is _PATTERNS[0]:
        return f"{match.group(1)} {MASK}"
    if match.re is _PATTERNS[2]:
        return f"{match.group(1)}{MASK}"
    return MASK


_current = Redactor()


def configure(secrets: Iterable[str]) -> None:
    """Known secret values, set once by the CLI from the settings."""
    global _current
    _current = Redactor(secrets)


def redact(text: str) -> str:
    """`text` with every known secret and every credential-looking string masked."""
    return _current(text)


# -- what no public tracker may carry ------------------------------------------------------

#: what a public page never shows, beyond `redact`'s secrets: each kind masked with its name, so a
#: reader still sees that something was there
_PRIVATE: list[tuple[str, re.Pattern[str]]] = [
    # user:password@ in a URL (any scheme), before the e-mail rule reads it as an address
    ("credentials", re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]*@")),
    ("email", re.compile(r"(?i)\b[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b")),
    # GitHub tokens (classic, fine-grained, app), AWS access key ids, JSON web tokens
    ("token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})\b")),
    ("key", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
]


def mask_private(text: str) -> str:
    """`text` fit for a public tracker: `redact`'s secrets, and e-mail addresses, credentials in
    URLs, GitHub tokens, cloud keys and JSON web tokens, each masked with its kind."""
    text = redact(text)
    for kind, pattern in _PRIVATE:
        if kind == "credentials":
            text = pattern.sub(lambda m: f"{m.group(1)}[credentials]@", text)
        else:
            text = pattern.sub(f"[{kind}]", text)
    return text


# C0/C1 controls (ESC, BEL, NUL, BS, ...) and the invisible format characters that reorder or hide
# text (bidi overrides and isolates, zero-width characters, the BOM): a terminal or a Markdown
# viewer would act on them
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)


def printable(text: str, limit: int | None = None) -> str:
    """`text` without control and invisible format characters (tabs and newlines become spaces),
    cut to `limit` characters with an ellipsis."""
    cleaned = _INVISIBLE.sub("", text.replace("\t", " ").replace("\n", " ").replace("\r", " "))
    if not cleaned.isascii():
        cleaned = "".join(ch for ch in cleaned if unicodedata.category(ch) not in ("Cc", "Cf", "Co", "Cs"))
    if limit is not None and len(cleaned) > limit:
        cleaned = cleaned[: limit - 1].rstrip() + "…"
    return cleaned


# -- the job log ------------------------------------------------------------------------------

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _Redact(logging.Filter):
    """Masks secrets in the message, the traceback and string extras of every record."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redactor(record.getMessage()), None
        if record.exc_info:
            record.exc_text = self.redactor(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, self.redactor(value))
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["error"] = record.exc_text
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # one line per record, nothing a terminal would act on (JSON lines escape these themselves)
        return f"{stamp} {record.levelname.lower():7} {printable(record.getMessage())}"


#: the format `configure_logging` set last; the CLI reports a fatal error as a log line when it is "json"
current_format = "text"


def configure_logging(fmt: str = "text", secrets: Sequence[str] = (), level: int = logging.INFO) -> None:
    """Send triage's log lines to stderr (stdout is the report's)."""
    global current_format
    current_format = fmt
    logger = logging.getLogger("triage")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    configure(secrets)
    handler.addFilter(_Redact(Redactor(secrets)))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


@contextmanager
def logging_to_file(path: Path) -> Iterator[None]:
    """For the span: triage's log lines go to `path` (in the format configured, secrets redacted)
    instead of standard error. `triage eval` keeps each judge's run log so."""
    logger = logging.getLogger("triage")
    saved, level, propagate = list(logger.handlers), logger.level, logger.propagate
    with open(path, "w", encoding="utf-8") as stream:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter() if current_format == "json" else TextFormatter())
        handler.addFilter(_Redact(_current))
        for old in saved:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(handler)
            for old in saved:
                logger.addHandler(old)
            logger.setLevel(level)
            logger.propagate = propagate


# -- what a command writes besides its log --------------------------------------------------------

#: past this depth a structure is no longer walked: its value is replaced, never a RecursionError
MASK_DEPTH = 64


def masked_data(value: Any, redactor: Redactor | None = None, depth: int = 0) -> Any:
    """`value` (JSON-like: dicts, lists, strings, numbers) with every string, keys included, masked by
    `redactor` (None: the one `configure` set). Deeper than `MASK_DEPTH`, a part is replaced by a
    note: it is not walked, so nothing in it leaks and nothing overflows the stack."""
    mask = redactor or _current
    if isinstance(value, str):
        return mask(value)
    if depth >= MASK_DEPTH and isinstance(value, dict | list | tuple):
        return "(nested too deep to show)"
    if isinstance(value, dict):
        return {mask(str(k)): masked_data(v, mask, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked_data(v, mask, depth + 1) for v in value]
    return value
