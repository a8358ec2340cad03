"""Gazette's wire protocol in Python: generated stubs (`pb`) and the model around them.

`errors` maps broker statuses to exceptions, `validation` holds Gazette's
input rules, `labels` and `selector` the label algebra and selector grammar,
and `fragment_name` the content-addressed fragment naming.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pygazette.protocol.pb import protocol_pb2 as pb

if TYPE_CHECKING:
    from pygazette.protocol.errors import (
        BrokerError,
        GazetteError,
        ValidationError,
        error_for_status,
        raise_for_status,
    )
    from pygazette.protocol.fragment_name import (
        fragment_content_path,
        fragment_file_name,
        parse_fragment_path,
    )
    from pygazette.protocol.labels import label_set, label_value, label_values
    from pygazette.protocol.selector import (
        format_selector,
        journal_selected,
        parse_selector,
        selector_matches,
    )

__all__ = [
    "BrokerError",
    "GazetteError",
    "ValidationError",
    "error_for_status",
    "format_selector",
    "fragment_content_path",
    "fragment_file_name",
    "journal_selected",
    "label_set",
    "label_value",
    "label_values",
    "parse_fragment_path",
    "parse_selector",
    "pb",
    "raise_for_status",
    "selector_matches",
]

# Where each exported name is defined. A name's module is imported when the name is first
# used (PEP 562), so importing one module of the package imports no other.
_EXPORTS: dict[str, str] = {
    "BrokerError": "pygazette.protocol.errors",
    "GazetteError": "pygazette.protocol.errors",
    "ValidationError": "pygazette.protocol.errors",
    "error_for_status": "pygazette.protocol.errors",
    "raise_for_status": "pygazette.protocol.errors",
    "fragment_content_path": "pygazette.protocol.fragment_name",
    "fragment_file_name": "pygazette.protocol.fragment_name",
    "parse_fragment_path": "pygazette.protocol.fragment_name",
    "label_set": "pygazette.protocol.labels",
    "label_value": "pygazette.protocol.labels",
    "label_values": "pygazette.protocol.labels",
    "format_selector": "pygazette.protocol.selector",
    "journal_selected": "pygazette.protocol.selector",
    "parse_selector": "pygazette.protocol.selector",
    "selector_matches": "pygazette.protocol.selector",
}

if not TYPE_CHECKING:  # Type checkers see the imports above instead.

    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
