"""The `pygazette` command: root options, logging, subcommand registration, and the one-line
error reporting every subcommand relies on.

Subcommands load lazily (`SUBCOMMANDS`, `pygazette/cli/lazy_group.py`): a command imports the
module of the subcommand it runs and nothing else, so client commands start without the
broker, the consumer framework or Spark, and `pygazette --help` imports no subcommand at all.

    pygazette [--broker URL] [--log-level LEVEL] journals {list,apply,append,read,fragments,
                                                            prune,store-health}
    pygazette serve --port P --data-dir D
    pygazette attach-uuids [--format csv|json] [FILE...]

Expected failures (bad input, broker statuses, an unreachable broker) print a single line,
`error: ...`, on stderr and exit non-zero; the Gazette status name is part of that line when
a broker answered with one. Logging goes to stderr in logfmt (the servers also write JSON
lines: `--log-format json`), at "warning" unless asked (`pygazette/cli/log_format.py`).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import Any

import click

# Before grpc loads (subcommands import it lazily): brokers and consumers are grpc.aio
# processes, which gRPC's fork support does not cover, and an application a consumer runs may
# fork children that exec (subprocess with preexec_fn). With fork support on, such a child
# can crash in gRPC's poller before it execs (tests/support/test_fork_safety.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from pygazette.auth.configured import AUTH_KEYS_ENV, AUTH_TOKEN_ENV, authorizer_from
from pygazette.cli.client_settings import CliState
from pygazette.cli.lazy_group import LazyCommand, LazyGroup
from pygazette.cli.log_format import (
    DEFAULT_LOG_LEVEL,
    LEVEL_ALIASES,
    LOG_FORMATS,
    LOG_LEVELS,
    configure_logging,
)
from pygazette.cli.tls_flags import client_tls_flags, client_tls_from_flags
from pygazette.client.defaults import BROKER_ADDRESS_ENV, DEFAULT_BROKER

# Each subcommand's module is imported only when that subcommand runs (or shows its --help),
# so `pygazette journals read` imports neither the broker nor the consumer framework. The
# one-line helps are the listing of `pygazette --help`; tests/cli/test_startup.py checks them
# against the commands' own.
SUBCOMMANDS: dict[str, LazyCommand] = {
    "attach-uuids": LazyCommand(
        "pygazette.cli.attach_uuids_cmd",
        "attach_uuids",
        "Stamp a message UUID on every record of the input files (or stdin) and write the "
        "records to stdout.",
    ),
    "consumer": LazyCommand(
        "pygazette.cli.consumer_cmd",
        "consumer",
        "Consumer processes: stateful, exactly-once stream processors in shards.",
    ),
    "journals": LazyCommand(
        "pygazette.cli.journals_cmd",
        "journals",
        "Interact with broker journals.",
        # Registers `journals prune` and `journals store-health`.
        also_import=("pygazette.cli.prune_cmd",),
    ),
    "serve": LazyCommand(
        "pygazette.cli.serve_cmd",
        "serve",
        "Serve journals: single-node (embedded keyspace), or as a cluster member with --etcd.",
    ),
    "shards": LazyCommand("pygazette.cli.shards_cmd", "shards", "Interact with consumer shards."),
}


class _Epipe(Exception):
    """An EPIPE raised in a command, carried past click: click turns any EPIPE into a silent
    exit status 1 (`BaseCommand.main`), whether the reader of our output went away or a write
    to anything else failed, and `run` tells the two apart."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


# gazctl's command groups: their connection and logging flags (gazctl's `--broker.*`,
# `--consumer.*`, `--log.*`) may follow the command anywhere, as go-flags takes a parent
# group's options after a subcommand.
_GAZCTL_GROUPS = ("journals", "shards")
# gazctl's flags that belong to a group of pygazette's other than the root.
_GROUP_FLAGS = {"shards": ("--consumer.address",)}


def _takes_value(group: click.Command) -> dict[str, bool]:
    """Each option name of `group` and whether it takes a value."""
    names: dict[str, bool] = {}
    for param in group.params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                names[name] = not (param.is_flag or param.count)
    return names


def hoist_gazctl_flags(root: click.Command, args: list[str]) -> list[str]:
    """`args` with gazctl's dotted connection and logging flags that follow `journals` or
    `shards` moved before the command, to the group that declares them (the root's for most,
    the `shards` group's for `--consumer.address`), so that `pygazette journals list
    --broker.address URL` means what it means to gazctl. Arguments after `--` stay."""
    root_opts = _takes_value(root)
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        name, eq, _ = args[i].partition("=")
        i += 2 if root_opts.get(name) and not eq else 1
    if i >= len(args) or args[i] not in _GAZCTL_GROUPS:
        return args
    command = args[i]
    to_root: list[str] = []
    to_group: list[str] = []
    rest: list[str] = []
    j = i + 1
    while j < len(args):
        token = args[j]
        if token == "--":
            rest.extend(args[j:])
            break
        name, eq, _ = token.partition("=")
        if "." in name and name.startswith("--"):
            if name in _GROUP_FLAGS.get(command, ()):
                target = to_group
            elif name in root_opts:
                target = to_root
            else:
                rest.append(token)
                j += 1
                continue
            takes = not eq and (name in _GROUP_FLAGS.get(command, ()) or root_opts[name])
            target.extend(args[j : j + 2] if takes else [token])
            j += 2 if takes else 1
            continue
        rest.append(token)
        j += 1
    return [*args[:i], *to_root, command, *to_group, *rest]


class _RootGroup(LazyGroup):
    """The root group: an EPIPE in parsing (help) or in a subcommand reaches `run`; gazctl's
    dotted flags are taken after `journals` and `shards` (`hoist_gazctl_flags`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_gazctl_flags(self, args))

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise _Epipe(exc) from exc
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise _Epipe(exc) from exc
            raise


@click.group(
    cls=_RootGroup,
    lazy_commands=SUBCOMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--broker",
    "--broker.address",
    "broker",
    envvar=BROKER_ADDRESS_ENV,
    default=DEFAULT_BROKER,
    show_default=True,
    metavar="URL",
    help=f"Broker address (also ${BROKER_ADDRESS_ENV}).",
)
@click.option(
    "--log-level",
    "--log.level",
    "log_level",
    type=click.Choice([*LOG_LEVELS, *LEVEL_ALIASES], case_sensitive=False),
    default=DEFAULT_LOG_LEVEL,
    show_default=True,
    envvar="PYGAZETTE_LOG_LEVEL",
    help="Logging verbosity (logs go to stderr).",
)
@click.option(
    "--log-format",
    "--log.format",
    "log_format",
    type=click.Choice(LOG_FORMATS, case_sensitive=False),
    default="text",
    show_default=True,
    help="Log line format: text (logfmt) or json.",
)
@client_tls_flags("broker", "BROKER", "brokers")
@client_tls_flags("consumer", "CONSUMER", "consumers")
@click.option(
    "--auth-keys",
    "--broker.auth-keys",
    "auth_keys",
    envvar=[AUTH_KEYS_ENV, "BROKER_AUTH_KEYS"],
    default="",
    metavar="KEYS",
    help="Base64 keys (whitespace or comma separated); the first signs each RPC's "
    "authorization token (also $AUTH_KEYS, $BROKER_AUTH_KEYS).",
)
@click.option(
    "--auth-token",
    "--broker.auth-token",
    "auth_token",
    envvar=[AUTH_TOKEN_ENV, "BROKER_AUTH_TOKEN"],
    default="",
    metavar="TOKEN",
    help="A bearer token to send with every RPC instead (also $AUTH_TOKEN, $BROKER_AUTH_TOKEN).",
)
@click.option(
    "--consumer-auth-keys",
    "--consumer.auth-keys",
    "consumer_auth_keys",
    envvar="CONSUMER_AUTH_KEYS",
    default="",
    metavar="KEYS",
    help="Keys signing the tokens of RPCs to consumers [default: --auth-keys] "
    "(also $CONSUMER_AUTH_KEYS).",
)
@click.option(
    "--consumer-auth-token",
    "--consumer.auth-token",
    "consumer_auth_token",
    envvar="CONSUMER_AUTH_TOKEN",
    default="",
    metavar="TOKEN",
    help="A bearer token for RPCs to consumers instead [default: --auth-token] "
    "(also $CONSUMER_AUTH_TOKEN).",
)
@click.pass_context
def cli(
    ctx: click.Context,
    /,
    broker: str,
    log_level: str,
    log_format: str,
    auth_keys: str,
    auth_token: str,
    consumer_auth_keys: str,
    consumer_auth_token: str,
    **tls_flags: str,
) -> None:
    """pygazette: Gazette journals and brokers, in Python.

    gazctl's spellings of the connection and logging flags (--broker.address,
    --broker.auth-token, --consumer.cert-file, --log.level, ...) are taken too, also after
    'journals' or 'shards' and their subcommands, as gazctl takes them."""
    configure_logging(log_level, log_format.lower())
    ctx.obj = CliState(broker=broker)
    settings = ctx.obj.client_settings
    try:
        settings.auth = authorizer_from(auth_keys, auth_token)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--auth-keys") from None
    if consumer_auth_keys or consumer_auth_token:
        try:
            settings.consumer_auth = authorizer_from(consumer_auth_keys, consumer_auth_token)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--consumer-auth-keys") from None
    else:
        settings.consumer_auth = settings.auth
    ctx.obj.client_settings.broker_tls = client_tls_from_flags(tls_flags, "broker")
    ctx.obj.client_settings.consumer_tls = client_tls_from_flags(tls_flags, "consumer")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int = 1) -> int:
    try:
        sys.stderr.write(f"error: {_one_line(message)}\n")
        sys.stderr.flush()
    except OSError:
        pass
    return code


# The exit status of a process killed by SIGPIPE, as a shell reports it.
EXIT_SIGPIPE = 128 + signal.SIGPIPE
_reader_went_away = False  # Set by _output_closed: main() then dies of SIGPIPE.


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe (or socket) whose reading end is closed: poll() has
    POLLERR (POLLHUP for a socket) for it. Nothing else, a file or a terminal, ends in EPIPE."""
    try:
        poller = select.poll()
        poller.register(1, 0)  # Errors and hang-ups are always reported.
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def _output_closed(error: OSError) -> int:
    """An EPIPE: the end of our output's reader, which ends us as it would a Unix tool (and
    gazctl: a Go program writing to a closed stdout dies of SIGPIPE), status EXIT_SIGPIPE and
    no message; else a write to something else failed, an error like any other."""
    global _reader_went_away
    if not _stdout_reader_gone():
        return _fail(str(error))
    _reader_went_away = True
    try:
        # Output still buffered is discarded, not written (and failed) at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    return EXIT_SIGPIPE


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status, reporting expected errors in one line;
    EXIT_SIGPIPE, quietly, once the reader of standard output went away (`| head`)."""
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="pygazette",
            standalone_mode=False,
        )
        sys.stdout.flush()  # Its failure is the command's, not the interpreter's at exit.
    except _Epipe as exc:
        return _output_closed(exc.error)
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None:
            hint = f" (see '{exc.ctx.command_path} --help')"
        return _fail(exc.format_message() + hint, exc.exit_code)
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        return _fail("interrupted", 130)
    except BrokenPipeError as exc:
        return _output_closed(exc)
    except OSError as exc:
        return _fail(str(exc))
    except Exception as exc:
        # Imported here, not above, so that `--help` needs no protobuf.
        from pygazette.protocol.errors import GazetteError

        if isinstance(exc, GazetteError):  # Broker statuses (BrokerError) and bad input.
            return _fail(str(exc))
        raise
    return result if isinstance(result, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    # Before any subcommand loads gRPC: its core reads these settings once, at load.
    from pygazette.cli.grpc_core_tuning import tune_grpc_core

    tune_grpc_core()
    status = run(argv)
    if _reader_went_away:
        # Die of the signal, as gazctl does (Python ignores SIGPIPE: a write failed instead).
        sys.stderr.flush()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    sys.exit(status)


if __name__ == "__main__":
    main()
