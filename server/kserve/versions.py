"""Model versions as Triton reads them: Ferry serves one version of each model, "1".

A request may name it, or leave the version out (the latest, Triton's default). Any other is
refused before any work in Triton's words, which its clients match: a string that is not an
integer is invalid, an integer that is not served is an unknown version (404).
"""

from __future__ import annotations

import re

from ferry.server.errors import InvalidInput, UnknownModelVersion

VERSION = "1"
FIELD = "model_version"
_INTEGER = re.compile(r"\s*[+-]?[0-9]+")  # what Triton's std::stol reads whole


def check_version(model: str, version: str | None) -> None:
    """Nothing when `version` is empty (None or "") or the one served; else refused."""
    if not version:
        return
    if not _INTEGER.fullmatch(version):
        raise InvalidInput(
            FIELD,
            f"failed to get model version from specified version string {version[:64]!r} "
            "(details: not an integer), version should be an integral value > 0",
        )
    number = int(version)
    if number < 0:
        raise InvalidInput(
            FIELD,
            f"invalid model version specified '{number}' , version should be an integral value > 0",
        )
    if str(number) != VERSION:
        raise UnknownModelVersion(model, str(number), VERSION)
