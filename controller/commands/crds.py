"""Where Muster's CRD files are: the repository's ``crds/`` (and the stand-in Kueue CRDs of
``e2e/kueue-crds``) in a source checkout or an editable install, else the copies an
installed wheel carries under ``<prefix>/share/muster/`` (pyproject's data-files; the
image installs Muster that way). Used by ``muster demo`` to load its API sandbox.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]
_SOURCES = {"crds": _CHECKOUT / "crds", "kueue-crds": _CHECKOUT / "e2e" / "kueue-crds"}


class CrdsNotFound(FileNotFoundError):
    """Neither a checkout nor the installed distribution has the CRD files."""


def crd_dir(kind: str = "crds") -> Path:
    """``crds`` (Muster's CRDs and the ProvisioningRequest CRD) or ``kueue-crds`` (the
    stand-in Kueue CRDs of the demo's path B)."""
    source = _SOURCES[kind]
    if source.is_dir() and (_CHECKOUT / "pyproject.toml").is_file():
        return source
    installed = _installed(kind)
    if installed is None:
        raise CrdsNotFound(
            f"Muster's {kind} files are neither in a source checkout ({source}) nor in the "
            "installed 'muster' distribution (share/muster/); reinstall Muster"
        )
    return installed


def _installed(kind: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution("muster")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.parts[-3:-1] == ("muster", kind) and file.name.endswith(".yaml"):
            return Path(str(file.locate())).resolve().parent
    return None
