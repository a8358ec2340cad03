"""The Spark connector against an mTLS broker: the tlsCAFile, tlsCertFile and tlsKeyFile
options reach every client it opens, on the driver and on executors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from pygazette.auth.tls import ClientTLS
from pygazette.client import SyncJournalClient
from pygazette.spark.options import OptionError, parse_read_options, parse_write_options
from pygazette.spark.runtime import BrokerTarget
from tests.support.broker_process import BrokerProcess
from tests.support.spark_session import create_journals, journal_spec
from tests.support.tls_material import TLSMaterial, generate_tls_material


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    return generate_tls_material(tmp_path_factory.mktemp("spark-tls"))


@pytest.fixture(scope="module")
def mtls_broker(
    tmp_path_factory: pytest.TempPathFactory, material: TLSMaterial
) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        tmp_path_factory.mktemp("spark-mtls-broker") / "data",
        extra_args=[
            "--server-cert-file",
            str(material.server_cert),
            "--server-cert-key-file",
            str(material.server_key),
            "--server-ca-file",
            str(material.ca),
        ],
        tls=ClientTLS(material.ca, material.client_cert, material.client_key),
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def tls_options(m: TLSMaterial) -> dict[str, str]:
    return {
        "tlsCAFile": str(m.ca),
        "tlsCertFile": str(m.client_cert),
        "tlsKeyFile": str(m.client_key),
    }


def test_options_parse_and_check_tls_files(material: TLSMaterial, tmp_path: Path) -> None:
    opts = parse_read_options(
        {"broker": "https://127.0.0.1:1", "journals": "tls/j", **tls_options(material)},
        streaming=False,
    )
    tls = ClientTLS(str(material.ca), str(material.client_cert), str(material.client_key))
    assert opts.tls == tls
    assert opts.target == BrokerTarget("https://127.0.0.1:1", tls)
    w = parse_write_options(
        {"broker": "https://127.0.0.1:1", "journal": "tls/j", "tlscafile": str(material.ca)}
    )
    assert w.tls == ClientTLS(str(material.ca))
    assert parse_write_options({"broker": "http://127.0.0.1:1", "journal": "tls/j"}).tls is None

    with pytest.raises(OptionError, match="need an https:// broker"):
        parse_read_options(
            {"broker": "http://127.0.0.1:1", "journals": "tls/j", "tlsCAFile": str(material.ca)},
            streaming=False,
        )
    with pytest.raises(OptionError, match=r"TLS options: cannot read CA file .*missing\.pem"):
        parse_write_options(
            {
                "broker": "https://127.0.0.1:1",
                "journal": "tls/j",
                "tlsCAFile": str(tmp_path / "missing.pem"),
            }
        )
    with pytest.raises(OptionError, match="the key file is missing"):
        parse_write_options(
            {
                "broker": "https://127.0.0.1:1",
                "journal": "tls/j",
                "tlsCertFile": str(material.client_cert),
            }
        )


def test_write_and_read_over_mtls(
    spark: SparkSession, mtls_broker: BrokerProcess, material: TLSMaterial, prefix: str
) -> None:
    journal = prefix + "tls"
    client_tls = ClientTLS(material.ca, material.client_cert, material.client_key)
    with SyncJournalClient(mtls_broker.url, tls=client_tls) as gz:
        create_journals(gz, journal_spec(journal))

    df = spark.createDataFrame([(f"line {i}",) for i in range(40)], "value STRING")
    writer = df.repartition(2).write.format("gazette").mode("append")
    writer = writer.option("broker", mtls_broker.url).option("journal", journal)
    for k, v in tls_options(material).items():
        writer = writer.option(k, v)
    writer.save()

    reader = spark.read.format("gazette").option("broker", mtls_broker.url)
    reader = reader.option("journals", journal).option("framing", "lines")
    for k, v in tls_options(material).items():
        reader = reader.option(k, v)
    rows = reader.load().repartition(2).collect()
    assert sorted(r.value for r in rows) == sorted(f"line {i}".encode() for i in range(40))

    # Without the client certificate the broker refuses the connection.
    with pytest.raises(PySparkException):
        spark.read.format("gazette").option("broker", mtls_broker.url).option(
            "journals", journal
        ).option("tlsCAFile", str(material.ca)).load().collect()
