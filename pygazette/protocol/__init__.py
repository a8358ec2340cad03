"""Gazette's wire protocol in Python: generated stubs (`pb`) and the model around them.

`errors` maps broker statuses to exceptions, `validation` holds Gazette's
input rules, `labels` and `selector` the label algebra and selector grammar,
and `fragment_name` the content-addressed fragment naming.
"""

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
from pygazette.protocol.pb import protocol_pb2 as pb
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
