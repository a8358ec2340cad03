"""Status → exception mapping."""

from __future__ import annotations

import pickle

import pytest

from pygazette.protocol import errors
from pygazette.protocol.errors import (
    BrokerError,
    FragmentStoreUnhealthy,
    GazetteError,
    JournalNotFound,
    Suspended,
    ValidationError,
    WrongAppendOffset,
    error_for_status,
    raise_for_status,
)
from pygazette.protocol.pb import protocol_pb2 as pb

EXPECTED = {
    "JOURNAL_NOT_FOUND": errors.JournalNotFound,
    "NO_JOURNAL_PRIMARY_BROKER": errors.NoJournalPrimaryBroker,
    "NOT_JOURNAL_PRIMARY_BROKER": errors.NotJournalPrimaryBroker,
    "INSUFFICIENT_JOURNAL_BROKERS": errors.InsufficientJournalBrokers,
    "NOT_JOURNAL_BROKER": errors.NotJournalBroker,
    "OFFSET_NOT_YET_AVAILABLE": errors.OffsetNotYetAvailable,
    "WRONG_ROUTE": errors.WrongRoute,
    "PROPOSAL_MISMATCH": errors.ProposalMismatch,
    "ETCD_TRANSACTION_FAILED": errors.EtcdTransactionFailed,
    "NOT_ALLOWED": errors.NotAllowed,
    "WRONG_APPEND_OFFSET": errors.WrongAppendOffset,
    "INDEX_HAS_GREATER_OFFSET": errors.IndexHasGreaterOffset,
    "REGISTER_MISMATCH": errors.RegisterMismatch,
    "SUSPENDED": errors.Suspended,
    "FRAGMENT_STORE_UNHEALTHY": errors.FragmentStoreUnhealthy,
}


def test_every_non_ok_status_has_a_class() -> None:
    names = [n for n in pb.Status.keys() if n != "OK"]
    assert sorted(names) == sorted(EXPECTED)
    for name, cls in EXPECTED.items():
        err = error_for_status(pb.Status.Value(name))
        assert type(err) is cls
        assert isinstance(err, BrokerError) and isinstance(err, GazetteError)
        assert err.status == pb.Status.Value(name)
        assert err.status_name == name
        assert str(err) == name


def test_detail_and_header() -> None:
    header = pb.Header(etcd=pb.Header.Etcd(revision=7))
    err = error_for_status(pb.WRONG_APPEND_OFFSET, "at 12", header)
    assert str(err) == "WRONG_APPEND_OFFSET: at 12"
    assert err.detail == "at 12"
    assert err.header is not None and err.header.etcd.revision == 7
    assert WrongAppendOffset().status == pb.WRONG_APPEND_OFFSET
    assert str(JournalNotFound(detail="a/b")) == "JOURNAL_NOT_FOUND: a/b"


def test_unknown_status_is_plain_broker_error() -> None:
    err = error_for_status(9101, "huh")
    assert type(err) is BrokerError
    assert err.status_name == "Status(9101)"
    assert str(err) == "Status(9101): huh"


def test_raise_for_status() -> None:
    raise_for_status(pb.AppendResponse(status=pb.OK))
    resp = pb.ReadResponse(status=pb.SUSPENDED, header=pb.Header(etcd=pb.Header.Etcd(revision=3)))
    with pytest.raises(Suspended) as info:
        raise_for_status(resp)
    assert info.value.header is not None and info.value.header.etcd.revision == 3
    # Without a header field set, header is None.
    with pytest.raises(JournalNotFound) as info2:
        raise_for_status(pb.ApplyResponse(status=pb.JOURNAL_NOT_FOUND), "x/y")
    assert info2.value.header is None and info2.value.detail == "x/y"
    # The store's error travels as the detail.
    unhealthy = pb.AppendResponse(status=pb.FRAGMENT_STORE_UNHEALTHY, store_health_error="boom")
    with pytest.raises(FragmentStoreUnhealthy, match="FRAGMENT_STORE_UNHEALTHY: boom"):
        raise_for_status(unhealthy)


def test_broker_errors_pickle() -> None:
    err = error_for_status(pb.NOT_ALLOWED, "flags", pb.Header())
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.NotAllowed and str(back) == str(err)


def test_validation_error() -> None:
    err = ValidationError("cannot begin with '/' (/foo)")
    assert isinstance(err, ValueError) and isinstance(err, GazetteError)
    assert str(err.extend("Name")) == "Name: cannot begin with '/' (/foo)"
    assert str(err.extend("Spec")) == "Spec.Name: cannot begin with '/' (/foo)"
    assert err.context == ["Spec", "Name"]
