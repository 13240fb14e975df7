"""How to install an optional extra of this package, worded so no user reaches for the other PyPI project.

``pip install 'maf-compaction[...]'`` installs a different code base that shares our name
(README, Install), so every hint names this project's checkout instead.
"""

from __future__ import annotations


def install_hint(*extras: str) -> str:
    """The install command for ``extras`` (``"plot"``, ``"bench,plot"``...), from a checkout of this project."""
    names = ",".join(sorted({name for extra in extras for name in extra.split(",") if name}))
    return (
        f"pip install '.[{names}]' in a checkout of this project (PyPI's maf-compaction is another project: "
        "see the README's Install)"
    )
