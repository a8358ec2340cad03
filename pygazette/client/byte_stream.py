"""`ByteStream`: what the client's journal and fragment readers share as async byte streams.

A subclass provides `read` (b"" at the end of the stream) and `aclose`; it then iterates
its chunks with `async for`, and is an async context manager that closes it on exit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class ByteStream(ABC):
    @abstractmethod
    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (a whole chunk, if n < 0); b"" at the end of the stream."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release what the stream holds open."""

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self.read()
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
