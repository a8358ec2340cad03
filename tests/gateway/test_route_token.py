"""The gateway's X-Route-Token: the route as Gazette's gateway writes it (gogo/protobuf's
proto.CompactTextString of the Route, its trailing space trimmed by Go's net/http)."""

from __future__ import annotations

from pygazette.gateway.journal_gateway import route_token
from pygazette.protocol.pb import protocol_pb2 as pb


def _route(primary: int, *members: tuple[str, str, str]) -> pb.Route:
    route = pb.Route(primary=primary)
    for zone, suffix, endpoint in members:
        route.members.add(zone=zone, suffix=suffix)
        if endpoint:
            route.endpoints.append(endpoint)
    return route


def test_route_tokens_are_gazettes() -> None:
    # Each expected string is what gogo's CompactTextString gives for the same Route (Go,
    # go.gazette.dev/core v0.103.0), less the trailing space net/http trims from a header.
    members = (("local", "pygazette-vm", "http://127.0.0.1:1"), ("b", 'x"y', "http://h:2"))
    assert route_token(_route(0, *members)) == (
        'members:<zone:"local" suffix:"pygazette-vm" > members:<zone:"b" suffix:"x\\"y" > '
        'endpoints:"http://127.0.0.1:1" endpoints:"http://h:2"'
    )
    assert route_token(_route(1, *members)) == (
        'members:<zone:"local" suffix:"pygazette-vm" > members:<zone:"b" suffix:"x\\"y" > '
        'primary:1 endpoints:"http://127.0.0.1:1" endpoints:"http://h:2"'
    )
    assert route_token(_route(-1, ("a", "b", ""))) == 'members:<zone:"a" suffix:"b" > primary:-1'
    # Strings escaped as Go's text marshaller escapes them: \n, \r, \t, \", \\ and octal for
    # other bytes that are not printable ASCII; a quote is left as it is.
    assert route_token(_route(0, ("z", "caf\u00e9'\\\n\t\x01", ""))) == (
        'members:<zone:"z" suffix:"caf\\303\\251\'\\\\\\n\\t\\001" >'
    )
