"""Stop-string matching over streamed text: pure, so it is tested without an engine."""

from __future__ import annotations


class StopMatcher:
    """Feed decoded text piece by piece; get back text that is safe to emit.

    Text that could be the start of a stop string is held back until it is ruled out, so a
    stop string split across tokens is still cut cleanly and never leaks to the client.
    """

    def __init__(self, stops: tuple[str, ...], include_stop: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include_stop  # vLLM's include_stop_str_in_output: the match is emitted
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        found = [(i, -len(s)) for s in self._stops if (i := buf.find(s)) >= 0]
        if found:  # the earliest match; of those starting there, the longest
            cut, minus_length = min(found)
            self.stopped = True
            self.matched = buf[cut : cut - minus_length]
            self._held = ""
            return buf[: cut - minus_length] if self._include else buf[:cut]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back text, once the generation ended without a match."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), longest, -1):
                if buf.endswith(stop[:n]):
                    longest = n
                    break
        return longest
