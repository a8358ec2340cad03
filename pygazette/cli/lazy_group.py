"""A click group whose subcommands are imported only when one of them runs.

`pygazette journals read` should not pay for importing the broker (`serve`), the consumer
framework (`consumer`, `shards`) or the message layer's publisher: each subcommand is named
here by the module that defines it, and that module is imported when click resolves the
subcommand (to run it, or to show its own `--help`). The group's `--help` listing uses a
static one-line help per subcommand, so listing the commands imports nothing;
`tests/cli/test_startup.py` checks that each static line matches the command's own.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

__all__ = ["LazyCommand", "LazyGroup"]


@dataclass(frozen=True)
class LazyCommand:
    """Where a subcommand lives: `attribute` of `module`, plus modules that register more of
    its subcommands when imported (e.g. `journals prune`), and its one-line help."""

    module: str
    attribute: str
    short_help: str
    also_import: tuple[str, ...] = ()

    def load(self) -> click.Command:
        command = getattr(importlib.import_module(self.module), self.attribute)
        for extra in self.also_import:
            importlib.import_module(extra)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.module}.{self.attribute} is not a click command")
        return command


class LazyGroup(click.Group):
    """A `click.Group` with subcommands given as `LazyCommand`s, loaded on first use."""

    def __init__(
        self, *args: Any, lazy_commands: Mapping[str, LazyCommand] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: dict[str, LazyCommand] = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy_commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is not None:
            return command
        lazy = self.lazy_commands.get(cmd_name)
        if lazy is None:
            return None
        command = lazy.load()
        self.commands[cmd_name] = command
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            # Suggest among every subcommand, loaded or not.
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx
            ) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = [
            name
            for name in self.list_commands(ctx)
            if name not in self.commands or not self.commands[name].hidden
        ]
        if not names:
            return
        # As click's own listing: each line shortened to the room the widest name leaves.
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, self.listing_help(name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def listing_help(self, name: str, limit: int) -> str:
        """The listing's line for subcommand `name`, loading nothing that is not loaded."""
        command = self.commands.get(name)
        if command is not None:
            return command.get_short_help_str(limit)
        # Shortened as click shortens a loaded command's help.
        placeholder = click.Command(name, help=self.lazy_commands[name].short_help)
        return placeholder.get_short_help_str(limit)
